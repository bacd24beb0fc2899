"""Small calls: a text call split in two so that the second part is tokenized while the device runs
the first; the server starting a lone request without waiting for company; the text check."""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.backend import JobPart, StreamedJob, StreamLayout
from genscore_core.engine import ScoringEngine
from genscore_core.forward import PrefixGroup, ProgressCallback
from genscore_core.frontend import ScoringFrontEnd, overlap_first_chars
from genscore_core.packed import PackedForward
from genscore_core.protocol import check_text
from genscore_core.scoring import LabelHead
from genscore_core.server import ServerLimits
from genscore_core.server.app import create_app
from genscore_core.server.cli import add_serve_command, server_limits
from tests.helpers.reference_recipe import official_qwen3_scores
from tests.helpers.server import serve_in_thread

WORDS = "paris france capital river seine museum berlin wall history london thames bridge tower".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class RecordingForward(PackedForward):
    """The packed forward, noting in ``events`` each call it starts."""

    def __init__(self, model: Any, events: list[str]) -> None:
        super().__init__(model)
        self.events = events

    def last_hidden_states(
        self, groups: Sequence[PrefixGroup], on_progress: ProgressCallback | None = None
    ) -> torch.Tensor:
        self.events.append(f"forward {sum(len(g.suffix_ids) for g in groups)}")
        return super().last_hidden_states(groups, on_progress)


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _overlapping(scorer: GenerativeScorer, events: list[str]) -> GenerativeScorer:
    """A scorer over the session's tiny model whose engine splits small calls (as on CUDA), with a
    front end of its own that notes each tokenization in ``events``."""
    engine = ScoringEngine(
        scorer.model, RecordingForward(scorer.model, events), LabelHead(scorer.model), overlap_share=0.35
    )
    front_end = ScoringFrontEnd(
        scorer.tokenizer, scorer.config, max_length=scorer.max_length, vocab_size=scorer.front_end.vocab_size
    )
    build = front_end._builder.build

    def noting(query: str, documents: Sequence[str], *, indices: Sequence[int] | None = None) -> Any:
        events.append(f"tokenize {len(documents)}")
        return build(query, documents, indices=indices)

    front_end._builder.build = noting  # type: ignore[method-assign]
    return GenerativeScorer(front_end=front_end, backend=engine)


def test_only_single_query_calls_of_distinct_documents_are_split() -> None:
    docs = [("q", "a" * 10), ("q", "b" * 20), ("q", "c" * 30)]
    assert overlap_first_chars(docs, 0.5) == 30
    assert overlap_first_chars(docs, 0.01) == 1
    assert overlap_first_chars(docs, 0.0) is None, "share 0: whole"
    assert overlap_first_chars(docs[:2], 0.5) is None, "too few documents for two parts"
    assert overlap_first_chars([*docs[:2], ("other", "c" * 30)], 0.5) is None, "two queries"
    assert overlap_first_chars([*docs, docs[1]], 0.5) is None, "a repeated document"


def test_the_overlap_share_defaults_to_off_where_the_forward_does_not_run_ahead(
    scorer: GenerativeScorer,
) -> None:
    assert not scorer.engine.forward.runs_ahead, "no CUDA graphs on the CPU"
    assert scorer.engine.overlap_share == 0.0
    forward = scorer.engine.forward
    assert (
        ScoringEngine(scorer.model, forward, LabelHead(scorer.model), overlap_share=0.5).overlap_share == 0.5
    )
    with pytest.raises(ValueError, match="overlap_share"):
        ScoringEngine(scorer.model, forward, LabelHead(scorer.model), overlap_share=1.0)


def test_a_split_call_tokenizes_its_second_part_after_the_first_was_launched_and_equals_the_official_recipe(
    scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    rng = random.Random(21)
    query = "capital of france"
    documents = [_text(rng, rng.randint(5, 60)) for _ in range(12)]
    events: list[str] = []
    overlapping = _overlapping(scorer, events)
    ranked = overlapping.rerank(query, documents)
    first = int(events[0].split()[1])
    assert 2 <= first < len(documents)
    assert events == [
        f"tokenize {first}",
        f"forward {first}",
        f"tokenize {len(documents) - first}",
        f"forward {len(documents) - first}",
    ]
    model, tokenizer = reference_model
    expected = official_qwen3_scores(
        model, tokenizer, [(query, d) for d in documents], max_length=scorer.max_length
    )
    got = {r.index: r.score for r in ranked}
    assert sorted(got) == list(range(len(documents)))
    assert max(abs(got[i] - e) for i, e in enumerate(expected)) <= 1e-5
    assert [r.index for r in ranked] == sorted(range(len(documents)), key=lambda i: -got[i])
    assert ranked.prompt_tokens == scorer.rerank(query, documents).prompt_tokens


def test_calls_that_are_not_split_go_whole(scorer: GenerativeScorer) -> None:
    events: list[str] = []
    overlapping = _overlapping(scorer, events)
    overlapping.score_pairs([("q1", "paris"), ("q2", "london"), ("q1", "berlin")])
    overlapping.score_documents("q", ["paris", "london", "paris"])
    assert events == ["tokenize 2", "tokenize 1", "forward 3", "tokenize 3", "forward 2"]


def test_a_stream_scored_by_part_takes_the_next_part_after_launching_and_reports_an_error_of_a_later_part(
    scorer: GenerativeScorer,
) -> None:
    events: list[str] = []
    engine = ScoringEngine(scorer.model, RecordingForward(scorer.model, events), LabelHead(scorer.model))
    jobs = [scorer.prepare_pairs([("q", f"document {i} {w}") for i, w in enumerate(WORDS)]).jobs]
    label_ids = jobs[0][0].label_ids
    streamed = [StreamedJob(len(WORDS), label_ids)]
    by_part = StreamLayout(by_part=True)

    def parts(fail: bool) -> Iterator[JobPart]:
        for number, prompts in enumerate((jobs[0][0].prompts[:4], jobs[0][0].prompts[4:])):
            events.append(f"part {number}")
            if fail and number == 1:
                raise InvalidRequestError("part 1 cannot be built", param="documents", index=4)
            yield JobPart(0, prompts)

    progress: list[int] = []
    [split] = engine.score_stream(streamed, parts(fail=False), on_progress=progress.append, layout=by_part)
    assert events == ["part 0", "forward 4", "part 1", f"forward {len(WORDS) - 4}"]
    assert sum(progress) == len(WORDS)
    [[whole]] = [engine.score_jobs(jobs[0])]
    assert split == pytest.approx(whole, abs=1e-6)
    events.clear()
    with pytest.raises(InvalidRequestError, match="part 1") as raised:
        engine.score_stream(streamed, parts(fail=True), layout=by_part)
    assert raised.value.index == 4
    assert events == ["part 0", "forward 4", "part 1"]
    assert len(engine.score_jobs(jobs[0])[0]) == len(WORDS), "the engine is free again"


def test_a_lone_request_starts_without_waiting_for_company(scorer: GenerativeScorer) -> None:
    # A queue that waited for company up to batch_max_wait_ms would hold this request for 10 minutes.
    limits = ServerLimits(batch_max_wait_ms=600_000)
    assert limits.batch_wait == "tokenizing"
    with serve_in_thread(create_app(scorer, limits)) as live:
        answer = httpx.post(
            f"{live.url}/v1/rerank", json={"query": "capital", "documents": ["paris", "rome"]}, timeout=120
        )
    assert answer.status_code == 200, answer.text
    expected = scorer.score_documents("capital", ["paris", "rome"])
    got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
    assert [got[0], got[1]] == pytest.approx(expected, abs=1e-6)


def test_serve_takes_the_batch_wait_flag() -> None:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    assert server_limits(parser.parse_args(["serve", "--model", "m"])).batch_wait == "tokenizing"
    args = parser.parse_args(["serve", "--model", "m", "--batch-wait", "always"])
    assert server_limits(args).batch_wait == "always"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model", "m", "--batch-wait", "never"])


def test_text_check_passes_ascii_and_unicode_and_names_a_lone_surrogate() -> None:
    check_text("plain ascii", "documents", 0)
    check_text("café, Straße, 東京", "documents", 1)
    with pytest.raises(InvalidRequestError, match=r"documents\[2\].*U\+D800") as raised:
        check_text("ascii then \ud800", "documents", 2)
    assert raised.value.index == 2


def test_one_text_passed_as_the_documents_is_refused(scorer: GenerativeScorer) -> None:
    import asyncio

    # A str is a sequence of one-character documents: scoring "abc" as three documents is never meant.
    for call in (
        lambda: scorer.rerank("q", "abc"),  # type: ignore[arg-type]
        lambda: scorer.score_documents("q", "abc"),  # type: ignore[arg-type]
        lambda: asyncio.run(scorer.arerank("q", "abc")),  # type: ignore[arg-type]
        lambda: scorer.encode("q", "abc"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidRequestError, match="documents must be a list of texts") as caught:
            call()
        assert caught.value.param == "documents"
    for pairs_call in (lambda: scorer.score_pairs("ab"), lambda: asyncio.run(scorer.ascore_pairs("ab"))):  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="pairs must be a list") as caught:
            pairs_call()
        assert caught.value.param == "pairs"
