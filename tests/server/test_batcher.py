"""The request batcher with a recording backend: batching by token budget, isolation, back-pressure."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from genscore_core import GenerativeScorer
from genscore_core.backend import ScoringJob
from genscore_core.request_timing import RequestTiming, timed
from genscore_core.server import RequestBatcher, ServerBusyError
from tests.helpers.backends import RecordingBackend, job, started


async def test_concurrent_jobs_share_one_call() -> None:
    backend = RecordingBackend()
    async with started(backend, max_batch_tokens=1000, max_wait_ms=50) as batcher:
        results = await asyncio.gather(*(batcher.score(job(tag, prompts=2)) for tag in range(5)))
    assert results == [[float(tag)] * 2 for tag in range(5)]
    assert backend.calls == [[0, 1, 2, 3, 4]]
    assert (
        batcher.stats.batches == 1 and batcher.stats.largest_batch == 5 and batcher.stats.shared_batches == 1
    )


async def test_token_budget_splits_batches_and_a_big_job_runs_alone() -> None:
    backend = RecordingBackend()
    backend.release.clear()  # hold the worker so that every job is queued before the first batch
    async with started(backend, max_batch_tokens=10, max_wait_ms=0, max_waited_batches=10) as batcher:
        tasks = [asyncio.ensure_future(batcher.score(job(tag))) for tag in range(1, 6)]
        tasks.append(asyncio.ensure_future(batcher.score(job(9, tokens=50))))
        await asyncio.to_thread(backend.entered.wait, 5)
        backend.release.set()
        results = await asyncio.gather(*tasks)
    assert results == [[1.0], [2.0], [3.0], [4.0], [5.0], [9.0]]
    # 4-token jobs pair up within 10 tokens; the 50-token job runs alone rather than being refused.
    assert backend.calls == [[1, 2], [3, 4], [5], [9]]


async def test_a_failing_job_fails_alone() -> None:
    backend = RecordingBackend(fail_on=3)
    async with started(backend, max_batch_tokens=1000, max_wait_ms=50) as batcher:
        results = await asyncio.gather(
            *(batcher.score(job(tag)) for tag in range(1, 5)), return_exceptions=True
        )
    assert results[0] == [1.0] and results[1] == [2.0] and results[3] == [4.0]
    assert isinstance(results[2], RuntimeError)
    assert batcher.stats.failures == 1


async def test_full_queue_and_shutdown_answer_busy() -> None:
    backend = RecordingBackend()
    backend.release.clear()
    batcher = RequestBatcher(backend, max_batch_tokens=4, max_wait_ms=0, max_queued=2)
    batcher.start()
    first = asyncio.ensure_future(batcher.score(job(1)))
    await asyncio.to_thread(backend.entered.wait, 5)  # taken by the worker, which is held
    queued = [asyncio.ensure_future(batcher.score(job(tag))) for tag in (2, 3)]
    await asyncio.sleep(0)
    assert batcher.queued == 2
    with pytest.raises(ServerBusyError, match="already waiting"):
        await batcher.score(job(4))
    await batcher.stop()
    backend.release.set()
    for task in queued:
        with pytest.raises(ServerBusyError, match="shutting down"):
            await task
    first.cancel()
    with pytest.raises(ServerBusyError, match="not running"):
        await batcher.score(job(5))


async def test_cancelled_requests_are_skipped() -> None:
    backend = RecordingBackend()
    backend.release.clear()
    async with started(backend, max_batch_tokens=1000, max_wait_ms=0) as batcher:
        first = asyncio.ensure_future(batcher.score(job(1)))
        await asyncio.to_thread(backend.entered.wait, 5)
        gone = asyncio.ensure_future(batcher.score(job(2)))
        kept = asyncio.ensure_future(batcher.score(job(3)))
        await asyncio.sleep(0)
        assert batcher.queued == 2  # cancelled while queued, not before it was queued
        gone.cancel()
        backend.release.set()
        assert await first == [1.0] and await kept == [3.0]
    assert backend.calls == [[1], [3]]


async def test_empty_job_needs_no_batch() -> None:
    batcher = RequestBatcher(RecordingBackend())
    assert await batcher.score(ScoringJob([], [1])) == []


async def test_waited_batches_count_the_calls_that_ran_while_a_job_was_queued() -> None:
    backend = RecordingBackend()
    backend.release.clear()  # the first job's call holds the worker while the others queue
    async with started(backend, max_batch_tokens=8, max_wait_ms=0) as batcher:
        first = asyncio.ensure_future(batcher.score(job(1)))
        await asyncio.to_thread(backend.entered.wait, 5)  # job 1's call is running (held)
        rest = [asyncio.ensure_future(batcher.score(job(tag))) for tag in range(2, 6)]
        await asyncio.sleep(0)  # the four tasks run up to their wait, in creation order
        assert batcher.queued == 4
        backend.release.set()
        await asyncio.gather(first, *rest)
    # Calls in arrival order: [1], then pairs within 8 tokens: [2, 3], [4, 5].
    assert backend.calls == [[1], [2, 3], [4, 5]]
    # Job 1 waited behind nothing; 2 and 3 behind call [1]; 4 and 5 behind [1] and [2, 3].
    assert batcher.stats.waited_batches == {0: 1, 1: 2, 2: 2}


async def test_stopping_as_a_request_wakes_the_worker_stops_it(scorer: GenerativeScorer) -> None:
    """stop() cancels the worker; a request arriving in the same turn of the event loop woke the
    worker's wait for company first. asyncio.wait_for swallowed that cancellation on Python < 3.12: the
    worker went on and stop() waited for it forever. The order is set through the loop's own queue:
    the wake-up is scheduled before the cancellation, and the wait's completion after it."""
    engine = scorer.backend  # the tiny model's real engine
    # A long wait for company that a preparing request keeps open: the worker waits inside it.
    batcher = RequestBatcher(engine, max_batch_tokens=10**6, max_wait_ms=60_000, preparing=lambda: True)
    batcher.start()
    queued = asyncio.ensure_future(batcher.score(job(1)))
    for _ in range(20):  # the worker takes the job and starts waiting for company
        await asyncio.sleep(0)
    worker, wakeup = batcher._task, batcher._wakeup
    assert worker is not None and wakeup is not None and not worker.done()
    wakeup.set()  # as a request arriving does
    asyncio.get_running_loop().call_soon(worker.cancel)  # as stop() does
    finished, _ = await asyncio.wait({worker}, timeout=5)
    try:
        assert finished and worker.cancelled(), "the worker went on after it was cancelled"
    finally:
        await batcher.stop()
    with pytest.raises(ServerBusyError, match="shutting down"):
        await queued  # a queued request is answered, not left waiting
    assert batcher.stats.batches == 0


async def _timed_scores(batcher: RequestBatcher, jobs: list[ScoringJob]) -> list[RequestTiming]:
    """Each job scored as a request of its own, under a timing of its own (as the server sets one)."""
    timings = []
    tasks = []
    for each in jobs:
        timing = RequestTiming(time.perf_counter())
        with timed(timing):  # the task copies the context: the timing follows the request
            tasks.append(asyncio.ensure_future(batcher.score(each)))
        timings.append(timing)
    await asyncio.gather(*tasks)
    return timings


@pytest.mark.parametrize("launching", ["whole calls", "launched ahead"])
async def test_each_request_is_timed_by_the_call_that_scored_it(
    scorer: GenerativeScorer, launching: str
) -> None:
    # Calls run one after another; a request's moments must be those of its own call: queued before
    # that call began, and every request of one call sharing its launch and its scores' moments.
    backend = RecordingBackend() if launching == "whole calls" else scorer.backend
    if isinstance(backend, RecordingBackend):
        backend.release.clear()  # hold the first call so that the rest queue behind it
    async with started(backend, max_batch_tokens=10, max_wait_ms=0, max_waited_batches=10) as batcher:
        scoring = asyncio.ensure_future(_timed_scores(batcher, [job(tag) for tag in range(1, 6)]))
        if isinstance(backend, RecordingBackend):
            await asyncio.to_thread(backend.entered.wait, 5)
            backend.release.set()
        timings = await scoring
    calls: dict[tuple[float, float], list[int]] = {}  # (launched, scored): the tags of its requests
    for tag, timing in enumerate(timings, start=1):
        assert timing.queued is not None and timing.launched is not None and timing.scored is not None
        assert timing.arrived <= timing.queued <= timing.launched <= timing.scored
        calls.setdefault((timing.launched, timing.scored), []).append(tag)
    spans = sorted(calls)
    # Calls take the queue in arrival order, 2 jobs of 4 tokens at most in a 10-token call.
    groups = [calls[span] for span in spans]
    assert len(groups) == batcher.stats.batches >= 3
    assert [tag for group in groups for tag in group] == [1, 2, 3, 4, 5]
    if isinstance(backend, RecordingBackend):
        assert groups == backend.calls  # exactly the calls the backend ran
        # One thread runs whole calls: each began after the one before had its scores.
        assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans))
