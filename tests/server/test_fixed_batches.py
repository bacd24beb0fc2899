"""Server calls run as forward batches of one fixed size (``--forward-batch-tokens``): the scores
are those of the engine's balanced batches, the flag reaches the batcher, and ``/stats`` says how
the calls ran."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.backend import ProgressCallback, ScoringJob, StreamedJob, StreamLayout, streamed
from genscore_core.engine import ScoringEngine
from genscore_core.server import RequestBatcher, ServerLimits, create_app
from genscore_core.server.cli import add_serve_command, server_limits
from tests.helpers.backends import RecordingBackend, started
from tests.helpers.server import LiveServer, random_bodies, rerank_concurrently, serve_in_thread

WORDS = "paris france capital river seine museum berlin wall history london thames bridge tower".split()


@pytest.fixture(scope="module")
def engine(scorer: GenerativeScorer) -> ScoringEngine:
    """The session's tiny model with the packed forward (it streams on the CPU too)."""
    packed = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, forward="packed")
    assert packed.engine.streams
    return packed.engine


def _jobs(rng: random.Random) -> list[ScoringJob]:
    """Jobs as a server call mixes them: shared prefixes of different lengths, duplicates, a prompt
    outside its job's prefix, an empty job, and one scored over the whole vocabulary."""
    jobs = []
    for index in range(5):
        prefix = [rng.randrange(1, 1000) for _ in range(rng.randint(0, 20))]
        prompts = [prefix + [rng.randrange(1, 1000) for _ in range(rng.randint(1, 50))] for _ in range(9)]
        prompts.append(list(prompts[2]))
        if index % 2:
            prompts.insert(4, [3000 + rng.randrange(100) for _ in range(7)])
        jobs.append(ScoringJob(prompts, [9454, 2753], apply_softmax=index != 3))
    jobs.insert(2, ScoringJob([], [9454, 2753]))
    return jobs


@pytest.mark.parametrize("batch_tokens", [48, 200, 100_000])
def test_fixed_batches_score_as_the_balanced_call(engine: ScoringEngine, batch_tokens: int) -> None:
    jobs = _jobs(random.Random(batch_tokens))
    expected = engine.score_jobs(jobs)
    batches: list[int] = []
    layout = StreamLayout(batch_tokens=batch_tokens)
    got = engine.score_stream(*streamed(jobs), on_progress=batches.append, layout=layout)
    assert [len(s) for s in got] == [len(job.prompts) for job in jobs]
    assert got[2] == []
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-5)
    # Duplicates stay tied whatever batch they fall in.
    assert got[0][2] == got[0][-1]
    distinct = sum(len({tuple(p) for p in job.prompts}) for job in jobs)
    assert sum(batches) == sum(len(job.prompts) for job in jobs)
    if batch_tokens == 48:
        assert len(batches) > 10, "a small target splits the call into many batches"
    if batch_tokens == 100_000:
        assert batches[0] == distinct, "the whole call fits one batch"


def test_fixed_batches_need_a_positive_size(engine: ScoringEngine) -> None:
    with pytest.raises(ValueError, match="batch_tokens"):
        engine.score_stream(*streamed(_jobs(random.Random(0))), layout=StreamLayout(batch_tokens=0))
    with pytest.raises(ValueError, match="batch_tokens"):
        RequestBatcher(engine, batch_tokens=-1)


class RecordingEngine(ScoringEngine):
    """The engine, recording which way each call went."""

    def __init__(self, engine: ScoringEngine) -> None:
        super().__init__(engine.model, engine.forward, engine.head)
        self.calls: list[tuple[str, int]] = []

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        self.calls.append(("balanced", len(jobs)))
        return super().score_jobs(jobs, on_progress)

    def score_stream(
        self, jobs: Sequence[StreamedJob], *args: Any, layout: StreamLayout | None = None, **kwargs: Any
    ) -> list[list[float]]:
        # The contract's other arguments (parts, on_progress) go through as they came.
        assert layout is not None and layout.batch_tokens == 64
        self.calls.append(("fixed", len(jobs)))
        return super().score_stream(jobs, *args, layout=layout, **kwargs)


async def test_calls_of_several_jobs_take_fixed_batches_and_a_lone_job_the_engine_way(
    engine: ScoringEngine,
) -> None:
    recording = RecordingEngine(engine)
    jobs = [job for job in _jobs(random.Random(7)) if job.prompts][:3]
    expected = engine.score_jobs(jobs)
    async with started(recording, max_batch_tokens=10**6, max_wait_ms=50, batch_tokens=64) as batcher:
        together = await asyncio.gather(*(batcher.score(job) for job in jobs))
        alone = await batcher.score(jobs[0])
    assert recording.calls == [("fixed", 3), ("balanced", 1)]
    for row, want in zip([*together, alone], [*expected, expected[0]], strict=True):
        assert row == pytest.approx(want, abs=1e-5)


async def test_a_backend_other_than_the_engine_scores_its_own_way() -> None:
    backend = RecordingBackend()
    async with started(backend, max_batch_tokens=1000, max_wait_ms=20, batch_tokens=64) as batcher:
        results = await asyncio.gather(*(batcher.score(ScoringJob([[tag] * 3], [1, 2])) for tag in range(3)))
    assert results == [[0.0], [1.0], [2.0]]
    assert backend.calls == [[0, 1, 2]]
    assert batcher.stats.engine_seconds > 0


def test_serve_takes_the_forward_batch_tokens_flag() -> None:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    default = server_limits(parser.parse_args(["serve", "--model", "m"])).forward_batch_tokens
    assert default == ServerLimits().forward_batch_tokens
    args = parser.parse_args(["serve", "--model", "m", "--forward-batch-tokens", "32768"])
    assert server_limits(args).forward_batch_tokens == 32768
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model", "m", "--forward-batch-tokens", "-1"])


@pytest.fixture(scope="module")
def fixed_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    packed = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, forward="packed")
    limits = ServerLimits(forward_batch_tokens=256, batch_max_wait_ms=20, batch_wait="always")
    with serve_in_thread(create_app(packed, limits)) as live:
        yield live


def test_concurrent_requests_through_fixed_batches_score_as_alone(
    fixed_server: LiveServer, scorer: GenerativeScorer
) -> None:
    rng = random.Random(3)
    bodies = random_bodies(rng, WORDS, 8, document_words=lambda: rng.randint(5, 40))

    answers = rerank_concurrently(fixed_server.url, bodies)
    stats = httpx.get(f"{fixed_server.url}/stats").json()
    assert stats["largest_batch"] > 1, "requests shared calls"
    assert stats["engine_seconds"] > 0
    forward = stats["forward"]
    assert forward["eager_batches"] > stats["batches"], "calls of several batches each (no graphs on the CPU)"
    assert forward["graph_replays"] == 0
    for body, answer in zip(bodies, answers):
        alone = {r.index: r.score for r in scorer.rerank(body["query"], body["documents"])}  # type: ignore[arg-type]
        assert answer == pytest.approx(alone, abs=1e-5)
