"""The server's scheduler: arrival order, the token budget, bounded waiting, company only while
requests are tokenized, and no tokenizing on the event loop (real server on loopback)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator, Sequence

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.backend import ScoringJob
from genscore_core.errors import ServerBusyError
from genscore_core.forward import ProgressCallback
from genscore_core.server import RequestBatcher, ServerLimits, create_app
from tests.helpers.backends import (
    SteppedAheadBackend,
    SteppedBackend,
    first_call_running,
    job,
    queue,
    started,
)
from tests.helpers.server import LiveServer, random_bodies, rerank_concurrently, serve_in_thread


async def test_arrival_order_and_the_token_budget() -> None:
    backend = SteppedBackend()
    async with started(backend, max_batch_tokens=12, max_wait_ms=0, max_waited_batches=100) as batcher:
        first = await first_call_running(batcher, backend)
        sizes = {2: 4, 3: 4, 4: 8, 5: 2, 6: 2, 7: 30, 8: 4}
        rest = await queue(batcher, [job(tag, size) for tag, size in sizes.items()])
        for _ in range(6):
            backend.step()
        results = await asyncio.gather(*first, *rest)
    assert results == [[1.0], *[[float(tag)] for tag in sizes]]
    # Arrival order: calls are consecutive runs of the queue; nothing is overtaken, not even by a
    # small job that would fit beside an earlier call (5 beside [2, 3], 8 beside 7).
    assert [tag for call in backend.calls for tag in call] == list(range(1, 9))
    assert backend.calls == [[1], [2, 3], [4, 5, 6], [7], [8]]
    # Within the budget of 12 tokens, except a job larger than it, which runs alone.
    assert all(t <= 12 or len(c) == 1 for c, t in zip(backend.calls, backend.tokens))


@pytest.mark.parametrize(
    ("max_waited", "calls"), [(2, [[1], [2, 3], [4, 5, 6, 7, 8, 9]]), (1, [[1], list(range(2, 10))])]
)
async def test_no_job_waits_behind_more_than_max_waited_calls(
    max_waited: int, calls: list[list[int]]
) -> None:
    backend = SteppedBackend()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0, max_waited_batches=max_waited) as batcher:
        first = await first_call_running(batcher, backend)
        rest = await queue(batcher, [job(tag) for tag in range(2, 10)])
        for _ in calls:
            backend.step()
        await asyncio.gather(*first, *rest)
    # The budget holds two 4-token jobs; a job that has seen max_waited calls go by is taken anyway.
    assert backend.calls == calls
    assert max(batcher.stats.waited_batches) == max_waited


async def test_a_large_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    backend = SteppedBackend()
    batcher = RequestBatcher(backend, max_batch_tokens=8, max_wait_ms=0)
    batcher.start()
    tasks = []
    try:
        tasks += await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2), job(99, tokens=50), job(3)])
        # While each call runs, two more small jobs arrive, which would fill every call on their own.
        tag = 10
        for _ in range(5):
            backend.step()
            await backend.running()
            tasks += await queue(batcher, [job(tag), job(tag + 1)])
            tag += 2
        big = tasks[2]
        assert big.done() and big.result() == [99.0]
        for _ in range(10):  # the calls still to come
            backend.step()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        await batcher.stop()
    order = [t for call in backend.calls for t in call]
    assert order == [1, 2, 99, 3, *range(10, 20)]  # arrival order
    assert backend.calls[1] == [2] and backend.calls[2] == [99, 3]
    assert max(batcher.stats.waited_batches) <= 2


async def test_company_is_awaited_only_while_requests_are_being_tokenized() -> None:
    backend = SteppedBackend()
    # Requests count as being tokenized until four are queued; then none is.
    coming = [4]
    batcher: RequestBatcher
    # A wait long enough that a test relying on it would time out.
    async with started(backend, max_wait_ms=600_000, preparing=lambda: batcher.queued < coming[0]) as batcher:
        tasks = []
        for tag in range(1, 5):
            tasks += await queue(batcher, [job(tag)])
        await backend.running()
        coming[0] = 0
        backend.step()
        # A lone request later starts without waiting for company.
        tasks += await queue(batcher, [job(5)])
        await backend.running()
        backend.step()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert backend.calls == [[1, 2, 3, 4], [5]]


async def test_the_next_call_is_laid_out_while_the_running_one_finishes() -> None:
    backend = SteppedAheadBackend()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0) as batcher:
        tasks = await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2), job(3), job(4)])
        backend.launch()  # call 1 has queued its work: the next call is taken and laid out now
        await backend.laid_out_calls(1)
        tasks += await queue(batcher, [job(5)])  # after that: it waits for the call after
        backend.step()
        await backend.running()  # call 2 runs, queued behind call 1 on the engine's thread
        results = await backend.finish_last_two(2, tasks)
    assert results == [[float(tag)] for tag in range(1, 6)]
    # Arrival order and the budget (two 4-token jobs) as for calls taken after the one before.
    assert backend.calls == [[1], [2, 3], [4, 5]]
    assert [tags for tags, _ in backend.laid_out] == [[2, 3], [4, 5]]
    assert all(thread.startswith("genscore-prepare") for _, thread in backend.laid_out)
    assert batcher.stats.prepared_ahead == 2
    # Job 5 arrived while call 1 ran and call 2 was taken: it saw both go by.
    assert batcher.stats.waited_batches == {0: 1, 1: 2, 2: 2}


@pytest.mark.parametrize(
    ("max_waited", "calls"), [(2, [[1], [2, 3], [4, 5, 6, 7, 8, 9]]), (1, [[1], list(range(2, 10))])]
)
async def test_calls_laid_out_ahead_keep_the_waiting_bound(max_waited: int, calls: list[list[int]]) -> None:
    backend = SteppedAheadBackend()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0, max_waited_batches=max_waited) as batcher:
        first = await first_call_running(batcher, backend)
        rest = await queue(batcher, [job(tag) for tag in range(2, 10)])
        for index in range(len(calls)):
            backend.launch()
            if index + 1 < len(calls):
                await backend.laid_out_calls(index + 1)  # taken while this call runs
            backend.step()
            if index + 1 < len(calls):
                await backend.running()
        await asyncio.wait_for(asyncio.gather(*first, *rest), 30)
    # The same calls as when each is taken after the one before finished (the test above).
    assert backend.calls == calls
    assert max(batcher.stats.waited_batches) == max_waited
    assert batcher.stats.prepared_ahead == len(calls) - 1


async def test_a_call_that_fails_to_lay_out_ahead_is_laid_out_again() -> None:
    class FailingLayout(SteppedAheadBackend):
        def prepare_jobs(self, jobs: Sequence[ScoringJob], *, lay_out: bool = True) -> list[ScoringJob]:
            if lay_out:
                self.laid_out.append(([], threading.current_thread().name))
                raise MemoryError("no page-locked memory")
            return list(jobs)

    backend = FailingLayout()
    async with started(backend, max_wait_ms=0) as batcher:
        tasks = await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2)])
        results = await backend.finish_last_two(1, tasks)
    assert results == [[1.0], [2.0]]
    assert backend.calls == [[1], [2]]


async def test_the_next_call_launches_before_the_running_one_is_collected() -> None:
    backend = SteppedAheadBackend()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0) as batcher:
        tasks = await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2), job(3), job(4), job(5)])
        backend.launch()
        await backend.running()  # call 2 is launching while call 1's scores are not collected
        backend.launch()
        await backend.launched_calls(2)
        assert backend.launched == [[1], [2, 3]] and backend.calls == []
        # The call after is taken only once call 1 is answered: one call queued behind the running one.
        await asyncio.sleep(0.05)
        assert [tags for tags, _ in backend.laid_out] == [[2, 3]]
        assert not any(t.done() for t in tasks)
        backend.step()
        await asyncio.wait_for(tasks[0], 30)
        assert not any(t.done() for t in tasks[1:])  # call 2's scores are not collected yet
        await backend.launch_next()  # call 3 ([4, 5]) launches behind call 2, still uncollected
        await backend.launched_calls(3)
        assert backend.calls == [[1]]
        backend.step()
        await asyncio.wait_for(asyncio.gather(*tasks[1:3]), 30)
        assert not any(t.done() for t in tasks[3:])
        backend.step()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert results == [[float(tag)] for tag in range(1, 6)]
    assert backend.launched == backend.calls == [[1], [2, 3], [4, 5]]
    assert batcher.stats.waited_batches == {0: 1, 1: 2, 2: 2}


class FailingCollect(SteppedAheadBackend):
    """Collecting a call that holds tag 13 fails (a bad score); so does launching one with tag 66."""

    def launch_prepared(
        self, prepared: list[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[ScoringJob]:
        call = super().launch_prepared(prepared, on_progress)
        if any(job.prompts[0][0] == 66 for job in call):
            raise RuntimeError("launch failed")
        return call

    def collect_launched(
        self, call: list[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        if any(job.prompts[0][0] == 13 for job in call):
            assert self._go.acquire(timeout=30)
            raise ValueError("prompt 0 scored nan")
        return super().collect_launched(call, on_progress)


async def test_a_failing_call_is_answered_job_by_job_and_the_next_call_is_not_broken() -> None:
    backend = FailingCollect()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0, max_waited_batches=100) as batcher:
        tasks = await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2), job(13), job(4), job(66), job(6)])
        backend.launch()
        await backend.launch_next()  # call 2 ([2, 13]) launched, its collect to fail
        backend.step()
        await asyncio.wait_for(tasks[0], 30)
        await backend.launch_next()  # call 3 ([4, 66]) fails to launch, behind call 2's collect
        await backend.launched_calls(3)
        for _ in range(20):  # enough for the retries and the last call
            backend.launch()
            backend.step()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert results[:3] == [[1.0], [2.0], results[2]] and isinstance(results[2], ValueError)
    assert results[3] == [4.0] and isinstance(results[4], RuntimeError) and results[5] == [6.0]
    assert backend.launched[:3] == [[1], [2, 13], [4, 66]]
    # The failed calls again one job at a time on the collecting thread, in order; call 4 ([6])
    # launched on the engine's thread meanwhile.
    assert [c for c in backend.launched[3:] if c != [6]] == [[2], [13], [4], [66]]
    assert len(backend.launched) == 8
    assert backend.calls == [[1], [2], [4], [6]]  # collected in order
    assert batcher.stats.failures == 2 and batcher.stats.batches == 4


async def test_stopping_answers_launched_and_queued_calls() -> None:
    backend = SteppedAheadBackend()
    batcher = RequestBatcher(backend, max_batch_tokens=8, max_wait_ms=0)
    batcher.start()
    try:
        tasks = await first_call_running(batcher, backend)
        tasks += await queue(batcher, [job(2), job(3), job(4)])
        backend.launch()
        await backend.launch_next()  # call 1 collecting, call 2 launched behind it, job 4 queued
        await backend.launched_calls(2)
        await batcher.stop()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    finally:
        for _ in range(5):  # let the threads finish
            backend.launch()
            backend.step()
    assert all(isinstance(r, ServerBusyError) for r in results), results


WORDS = "paris london capital france river city museum tower bridge history art food wine".split()


@pytest.fixture(scope="module")
def fair_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    # A budget of a few requests, so that 16 concurrent clients queue behind several calls.
    limits = ServerLimits(batch_max_tokens=1500, batch_max_wait_ms=2.0)
    with serve_in_thread(create_app(scorer, limits)) as live:
        yield live


@pytest.mark.slow
def test_concurrent_clients_wait_behind_at_most_two_calls(
    fair_server: LiveServer, scorer: GenerativeScorer
) -> None:
    rng = random.Random(8)
    bodies = random_bodies(rng, WORDS, 48, document_words=lambda: 30)

    answers = rerank_concurrently(fair_server.url, bodies, at_once=16)
    stats = httpx.get(f"{fair_server.url}/stats").json()
    waited = {int(k): n for k, n in stats["waited_batches"].items()}
    assert sum(waited.values()) == len(bodies)
    assert max(waited) <= 2, waited
    assert stats["largest_batch"] > 1, "concurrent requests shared calls"
    for body, answer in zip(bodies[:6], answers):
        alone = {r.index: r.score for r in scorer.rerank(body["query"], body["documents"])}  # type: ignore[arg-type]
        assert max(abs(answer[i] - alone[i]) for i in alone) <= 1e-5


def test_the_event_loop_answers_while_a_request_waits_for_the_tokenizer(
    fair_server: LiveServer, scorer: GenerativeScorer
) -> None:
    """The tokenizer is held here; a rerank then waits for it on a worker thread, and the server
    keeps answering on its event loop (it could not, had it tokenized there)."""
    lock = scorer.front_end._tokenizer_lock
    body = {"query": "capital of france", "documents": ["paris is the capital", "london bridge"]}
    with httpx.Client(base_url=fair_server.url, timeout=60.0) as client:
        assert lock.acquire()
        try:
            result: dict[str, object] = {}
            sender = threading.Thread(
                target=lambda: result.update(answer=client.post("/v1/rerank", json=body))
            )
            sender.start()
            for _ in range(10_000):
                # Every /stats answer comes from the event loop while the request is not tokenized.
                if client.get("/stats").json()["waiting_to_tokenize"] == 1:
                    break
            else:
                pytest.fail("the request never reached the tokenizer")
            assert client.get("/health").status_code == 200
            assert sender.is_alive(), "the request cannot finish while the tokenizer is held"
        finally:
            lock.release()
        sender.join(60)
    answer = result["answer"]
    assert isinstance(answer, httpx.Response) and answer.status_code == 200
    alone = {r.index: r.score for r in scorer.rerank(body["query"], body["documents"])}  # type: ignore[arg-type]
    assert {r["index"]: r["relevance_score"] for r in answer.json()["results"]} == pytest.approx(
        alone, abs=1e-5
    )
