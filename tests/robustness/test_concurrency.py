"""One scorer under the ways real callers use it: several threads or tasks at once, calls cancelled
mid-way, failures mid-stream, and documents given as iterators rather than lists."""

from __future__ import annotations

import asyncio
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.frontend import STREAM_MIN_CHARS
from tests.helpers.reference_recipe import official_qwen3_scores

QUERY = "capital of france"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The river flows to the sea.",
    "France borders Spain and Italy.",
    "A mountain of paperwork.",
]


def _reference(scorer: GenerativeScorer, query: str, documents: list[str]) -> list[float]:
    return official_qwen3_scores(
        scorer.model, scorer.tokenizer, [(query, d) for d in documents], scorer.max_length
    )


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda docs: (d for d in docs), id="generator"),
        pytest.param(lambda docs: map(str, docs), id="map"),
        pytest.param(lambda docs: pd.Series(docs), id="series"),
        # Labels in reverse: series[i] is the row labelled i, not the i-th row.
        pytest.param(lambda docs: pd.Series(docs, index=range(len(docs) - 1, -1, -1)), id="series-reversed"),
        pytest.param(lambda docs: pd.Series(docs, index=range(10, 10 + len(docs))), id="series-offset"),
    ],
)
def test_rerank_reads_any_iterable_once_in_order(scorer: GenerativeScorer, make: object) -> None:
    expected = _reference(scorer, QUERY, DOCUMENTS)
    for ranked in (
        scorer.rerank(QUERY, make(DOCUMENTS)),  # type: ignore[operator]
        asyncio.run(scorer.arerank(QUERY, make(DOCUMENTS))),  # type: ignore[operator]
    ):
        assert len(ranked) == len(DOCUMENTS)
        for result in ranked:
            # The text reported is the one scored, and the score is the recipe's for it.
            assert result.document == DOCUMENTS[result.index]
            assert result.score == pytest.approx(expected[result.index], abs=1e-5)


def test_score_pairs_reads_a_generator_or_zip_once(scorer: GenerativeScorer) -> None:
    expected = _reference(scorer, QUERY, DOCUMENTS)
    from_zip = scorer.score_pairs(zip([QUERY] * len(DOCUMENTS), DOCUMENTS))
    from_generator = asyncio.run(scorer.ascore_pairs((QUERY, d) for d in DOCUMENTS))
    assert from_zip == pytest.approx(expected, abs=1e-5)
    assert from_generator == pytest.approx(expected, abs=1e-5)
    assert scorer.score_documents(QUERY, iter(DOCUMENTS)) == pytest.approx(expected, abs=1e-5)


def test_what_is_not_a_collection_of_texts_is_refused_by_name(scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError, match="documents must be an iterable") as raised:
        scorer.rerank(QUERY, 42)  # type: ignore[arg-type]
    assert raised.value.param == "documents"
    with pytest.raises(InvalidRequestError, match="documents must be a list of texts"):
        scorer.rerank(QUERY, "one text")
    with pytest.raises(InvalidRequestError, match="pairs must be"):
        scorer.score_pairs("query, document")  # type: ignore[arg-type]
    # Iterable, but not as texts in an order: a dict's keys are its ids, a set has no order.
    with pytest.raises(InvalidRequestError, match=r"got dict; pass list\(mapping.values\(\)\)"):
        scorer.rerank(QUERY, {"doc-1": DOCUMENTS[0], "doc-2": DOCUMENTS[1]})
    with pytest.raises(InvalidRequestError, match="got set; a set has no order"):
        asyncio.run(scorer.arerank(QUERY, set(DOCUMENTS)))


def _words(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = "paris france berlin capital river mountain city north of the and is".split()
    return [" ".join(rng.choice(vocabulary) for _ in range(50)) + f" ({i})" for i in range(count)]


@pytest.mark.parametrize("forward", ["packed", "padded"])
def test_a_cancelled_call_stops_at_its_next_batch(tiny_model_dir: Path, forward: str) -> None:
    # Small batches: the call runs as many batches, so that finishing it would show.
    scorer = GenerativeScorer(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=512, forward=forward,
        max_batch_tokens=256,
    )  # fmt: skip
    documents = _words(24, seed=1)
    jobs = scorer.prepare_pairs([(QUERY, d) for d in documents]).jobs
    reported: list[int] = []

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        ended = threading.Event()

        def on_progress(done: int) -> None:
            reported.append(done)
            if len(reported) == 1:  # cancel after the first batch, and go on only once it is
                loop.call_soon_threadsafe(call.cancel)
                assert ended.wait(30)

        call = asyncio.create_task(scorer.backend.ascore_jobs(jobs, on_progress))
        call.add_done_callback(lambda _: ended.set())
        with pytest.raises(asyncio.CancelledError):
            await call
        # The next call waits for no leftover batches and scores as the recipe does.
        return [r.score for r in sorted(await scorer.arerank(QUERY, DOCUMENTS), key=lambda r: r.index)]

    later = asyncio.run(main())
    assert len(reported) == 1 and reported[0] < len(documents)
    assert later == pytest.approx(_reference(scorer, QUERY, DOCUMENTS), abs=1e-5)


def test_a_cancelled_streamed_rerank_stops_its_producer(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scorer = GenerativeScorer(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=512, show_progress=True
    )
    documents = _words(1000, seed=2)  # ~0.35M characters: streamed, in many batches

    def producers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "genscore-host-batches"]

    async def main() -> None:
        call = asyncio.create_task(scorer.arerank(QUERY, documents))
        while not producers():  # the stream has started
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        while producers():
            await asyncio.sleep(0.01)

    asyncio.run(main())
    # The progress bar's last count: the call stopped at a batch, short of every document.
    done = [int(n) for n in re.findall(rf"(\d+)/{len(documents)}", capsys.readouterr().err)]
    assert done and done[-1] < len(documents)
    ranked = scorer.rerank(QUERY, DOCUMENTS)
    expected = _reference(scorer, QUERY, DOCUMENTS)
    assert [r.score for r in sorted(ranked, key=lambda r: r.index)] == pytest.approx(expected, abs=1e-5)


def test_streamed_and_small_calls_from_threads_keep_their_own_scores(scorer: GenerativeScorer) -> None:
    big = _words(240, seed=3)
    assert sum(map(len, big)) >= STREAM_MIN_CHARS  # scored in parts, on a producer thread
    alone = scorer.score_documents("river", big)
    calls = [("river", big), (QUERY, DOCUMENTS)] * 2
    barrier = threading.Barrier(len(calls))

    def call(query_and_documents: tuple[str, list[str]]) -> list[float]:
        barrier.wait()
        return scorer.score_documents(*query_and_documents)

    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(call, calls))
    for got in results[0::2]:
        assert got == pytest.approx(alone, abs=1e-6)
    for got in results[1::2]:
        assert got == pytest.approx(_reference(scorer, QUERY, DOCUMENTS), abs=1e-5)
    assert alone[:8] == pytest.approx(_reference(scorer, "river", big[:8]), abs=1e-5)
    assert not [t for t in threading.enumerate() if t.name == "genscore-host-batches"]


@pytest.mark.parametrize("padded", [False, True], ids=["streamed", "whole"])
def test_a_large_arerank_is_ranked_off_the_event_loop(
    scorer: GenerativeScorer, tiny_model_dir: Path, padded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranking 2,000 results takes ~10 ms; on the loop it held up every other connection of a server.
    The real ranking runs; the wrapper only records the thread it ran on."""
    import genscore_core.scorer as scorer_module

    if padded:  # the prompts are built whole and scored through ascore_jobs, as in genscore serve
        scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512,
                                  forward="padded")  # fmt: skip
    ranked_on: list[threading.Thread] = []
    real = scorer_module.rank_results

    def recording(*args: object, **kwargs: object) -> object:
        ranked_on.append(threading.current_thread())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scorer_module, "rank_results", recording)
    rng = random.Random(3)
    words = "paris france river capital mountain city sea the of is a".split()
    large = [" ".join(rng.choices(words, k=12)) for _ in range(scorer_module.RANKED_ON_THE_LOOP + 1)]

    async def both() -> tuple[threading.Thread, list[float], list[float]]:
        loop_thread = threading.current_thread()
        big = await scorer.arerank(QUERY, large)
        small = await scorer.arerank(QUERY, DOCUMENTS)
        return (
            loop_thread,
            [r.score for r in sorted(big, key=lambda r: r.index)],
            [r.score for r in sorted(small, key=lambda r: r.index)],
        )

    loop_thread, big_scores, small_scores = asyncio.run(both())
    assert ranked_on[0] is not loop_thread  # the large call
    # A small call scored through ascore_jobs is ranked on the loop (a hop would cost more than the
    # ranking); a streamed call is ranked on the thread that scored it, whatever its size.
    assert (ranked_on[1] is loop_thread) == padded
    assert big_scores == pytest.approx(_reference(scorer, QUERY, large), abs=1e-5)
    assert small_scores == pytest.approx(_reference(scorer, QUERY, DOCUMENTS), abs=1e-5)
