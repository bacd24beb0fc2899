"""The opt-in result cache: a hit is the very score the model gave, and whatever changes a score misses."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from genscore_core import GenerativeScorer
from genscore_core.backend import JobTexts, ProgressCallback, ScoringBackend, ScoringJob
from genscore_core.result_cache import ENTRY_BYTES, ResultCache
from tests.helpers.reference_recipe import official_qwen3_scores

QUERY = "which city is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Seine flows through Paris. " * 40,  # long: cut by a short max_length
    "Bananas are rich in potassium.",
]


class SeenBackend(ScoringBackend):
    """The scorer's real engine, recording the prompts each call hands it: what reached the model."""

    def __init__(self, engine: ScoringBackend) -> None:
        self.engine = engine
        self.seen: list[list[int]] = []

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        self.seen += [prompt for job in jobs for prompt in job.prompts]
        return self.engine.score_jobs(jobs, on_progress)


@pytest.fixture(scope="module")
def cached(scorer: GenerativeScorer) -> GenerativeScorer:
    """The session's tiny model (CPU, float32, max_length 512) with a cache of 1 MiB."""
    settings = {**scorer.settings(), "result_cache_bytes": 1 << 20}
    return GenerativeScorer.from_model(scorer.model, scorer.tokenizer, **settings)


def _seen(scorer: GenerativeScorer, **settings: Any) -> tuple[GenerativeScorer, SeenBackend]:
    """A scorer on ``scorer``'s model (``settings`` changed) sharing its cache, its backend recorded."""
    other = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, **{**scorer.settings(), **settings})
    seen = SeenBackend(other.backend)
    composed = GenerativeScorer(front_end=other.front_end, backend=seen)
    composed.result_cache = scorer.result_cache
    return composed, seen


def test_a_hit_is_the_score_the_model_gave_bitwise_and_never_reaches_the_model(
    cached: GenerativeScorer, scorer: GenerativeScorer
) -> None:
    assert scorer.result_cache is None  # off unless asked for
    cache = cached.result_cache
    assert cache is not None and cache.max_bytes == 1 << 20
    cache.clear()
    recorded, seen = _seen(cached)
    first = recorded.score_documents(QUERY, DOCUMENTS)
    # Misses go through the model: the scores of the official recipe, and those of an uncached scorer.
    reference = official_qwen3_scores(cached.model, cached.tokenizer, [(QUERY, d) for d in DOCUMENTS], 512)
    assert first == pytest.approx(reference, abs=1e-5)
    assert first == scorer.score_documents(QUERY, DOCUMENTS)
    assert len(seen.seen) == len(DOCUMENTS)
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (0, 4, 4)
    assert stats.bytes == 4 * ENTRY_BYTES

    # The same pairs again, in another order, in another call shape, with one new document: only
    # the new one reaches the model; every other score is the first one, to the bit.
    again = recorded.rerank(QUERY, [DOCUMENTS[2], "Lyon is in France.", DOCUMENTS[0], DOCUMENTS[3]])
    assert len(seen.seen) == len(DOCUMENTS) + 1
    by_text = {result.document: result.score for result in again}
    for document, score in zip(DOCUMENTS, first):
        if document in by_text:
            assert by_text[document].hex() == score.hex()
    assert recorded.score_pairs([(QUERY, DOCUMENTS[1])])[0].hex() == first[1].hex()
    ranked = asyncio.run(recorded.arerank(QUERY, DOCUMENTS))
    assert [ranked.score_of(index).hex() for index in range(len(DOCUMENTS))] == [s.hex() for s in first]
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (3 + 1 + 4, 5)
    assert stats.hit_rate == pytest.approx(8 / 13)
    assert len(seen.seen) == len(DOCUMENTS) + 1  # the last two calls were answered whole from the cache


@pytest.mark.parametrize(
    "changed",
    [
        {"instruction": "Find passages about geography"},
        {"score_mode": "logit"},
        {"max_length": 96},
        {"model": "another-model"},
    ],
    ids=["instruction", "score_mode", "max_length", "model"],
)
def test_what_changes_a_score_misses(cached: GenerativeScorer, changed: dict[str, Any]) -> None:
    cache = cached.result_cache
    assert cache is not None
    cached.score_documents(QUERY, DOCUMENTS)  # every pair held
    before = cache.stats()
    other, seen = _seen(cached, **changed)
    scores = other.score_documents(QUERY, DOCUMENTS)
    after = cache.stats()
    assert (after.hits, after.misses) == (before.hits, before.misses + len(DOCUMENTS))
    assert len(seen.seen) == len(DOCUMENTS)
    # What the miss gave is that scorer's own score, not the cached one of the first scorer.
    uncached = GenerativeScorer(front_end=other.front_end, backend=seen.engine)
    assert scores == uncached.score_documents(QUERY, DOCUMENTS)
    if "max_length" not in changed and "model" not in changed:
        assert scores != cached.score_documents(QUERY, DOCUMENTS)


def test_a_protocol_request_is_keyed_by_its_labels_and_softmax(cached: GenerativeScorer) -> None:
    cache = cached.result_cache
    assert cache is not None
    request = {"query": [100, 200], "items": [[300, 400], [500, 600]], "label_token_ids": [9693, 2152]}
    first = cached.score(request)
    before = cache.stats()
    assert [d.score for d in cached.score(request).data] == [d.score for d in first.data]
    assert cache.stats().hits == before.hits + 2
    vocab = cached.score({**request, "apply_softmax": False})
    swapped = cached.score({**request, "label_token_ids": [2152, 9693]})
    assert cache.stats().misses == before.misses + 4
    assert [d.score for d in vocab.data] != [d.score for d in first.data]
    assert [d.score for d in swapped.data] == pytest.approx([1 - d.score for d in first.data], abs=1e-6)


def test_the_least_recently_used_score_goes_first_within_the_bound() -> None:
    cache = ResultCache(3 * ENTRY_BYTES + ENTRY_BYTES // 2)  # room for three
    jobs = [ScoringJob([[tag, 7]], [1, 2]) for tag in range(4)]

    def run(job: ScoringJob) -> list[float]:
        call = cache.lookup("m", [job])
        return call.complete([[float(prompt[0]) for prompt in j.prompts] for j in call.missing])[0]

    for job in jobs[:3]:
        run(job)
    assert run(jobs[0]) == [0.0] and cache.stats().hits == 1  # 0 now the most recently used
    run(jobs[3])  # evicts 1, the least recently used
    stats = cache.stats()
    assert (stats.entries, stats.evictions, stats.bytes) == (3, 1, 3 * ENTRY_BYTES)
    assert [len(cache.lookup("m", [job]).missing) for job in jobs] == [0, 1, 0, 0]
    with pytest.raises(ValueError, match=f"at least {ENTRY_BYTES}"):
        ResultCache(ENTRY_BYTES - 1)


def test_texts_and_identity_are_part_of_the_key() -> None:
    # A /v1/rerank server templates the texts itself: the same prompt ids with another document differ.
    cache = ResultCache(1 << 16)
    job = ScoringJob([[5, 6], [5, 6]], [1, 2], texts=JobTexts("q", ("a", "b")))
    call = cache.lookup("m", [job])
    assert call.missing[0].texts == JobTexts("q", ("a", "b"))
    call.complete([[0.25, 0.75]])
    assert cache.lookup("m", [job]).complete([]) == [[0.25, 0.75]]
    part = cache.lookup("m", [ScoringJob([[5, 6], [5, 6]], [1, 2], texts=JobTexts("q", ("b", "c")))])
    assert part.missing[0].texts == JobTexts("q", ("c",)) and part.missing[0].prompts == [[5, 6]]
    assert len(cache.lookup("other model", [job]).missing[0].prompts) == 2


def test_threads_sharing_a_cache_each_get_their_own_prompts_score() -> None:
    cache = ResultCache(40 * ENTRY_BYTES)  # smaller than the prompts: evictions all along
    wrong: list[str] = []

    def worker(seed: int) -> None:
        for step in range(300):
            tags = [(seed * 7 + step * 3 + k) % 97 for k in range(5)]
            job = ScoringJob([[tag, tag + 1] for tag in tags], [1, 2])
            call = cache.lookup("m", [job])
            scores = call.complete([[math.sqrt(p[0]) for p in j.prompts] for j in call.missing])[0]
            if scores != [math.sqrt(tag) for tag in tags]:
                wrong.append(f"{tags}: {scores}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong, wrong[:3]
    stats = cache.stats()
    assert stats.hits + stats.misses == 6 * 300 * 5 and stats.entries == 40
    # Two threads missing one prompt at once both keep it: one entry, so evictions can be fewer.
    assert stats.hits > 0 and 0 < stats.evictions <= stats.misses - 40
