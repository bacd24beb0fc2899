"""Stub backends of the request batcher's tests: each scores a prompt by its first token.

:class:`RecordingBackend` runs every call at once and records it; :class:`SteppedBackend` and
:class:`SteppedAheadBackend` run a call only when the test steps it, so a test decides what is queued
while each call runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from genscore_core.backend import ProgressCallback, ScoringBackend, ScoringJob
from genscore_core.server import RequestBatcher


class RecordingBackend(ScoringBackend):
    """Scores each prompt by its first token; records the jobs of every call."""

    def __init__(self, fail_on: int | None = None, delay: float = 0.0) -> None:
        self.calls: list[list[int]] = []
        self.fail_on = fail_on
        self.delay = delay
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        """Set once the worker has called score_jobs: what tests wait for instead of sleeping."""

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        self.entered.set()
        self.release.wait(5)
        self.calls.append([job.prompts[0][0] for job in jobs])
        if self.fail_on is not None and any(job.prompts[0][0] == self.fail_on for job in jobs):
            raise RuntimeError(f"cannot score job {self.fail_on}")
        return [[float(prompt[0]) for prompt in job.prompts] for job in jobs]


def job(tag: int, tokens: int = 4, prompts: int = 1) -> ScoringJob:
    return ScoringJob([[tag] * tokens for _ in range(prompts)], [1, 2])


class SteppedBackend(ScoringBackend):
    """Scores each prompt by its first token and runs one call per :meth:`step`, so a test decides
    what is queued while each call runs."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.tokens: list[int] = []
        self.entered = threading.Semaphore(0)
        self._go = threading.Semaphore(0)

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        self.entered.release()
        assert self._go.acquire(timeout=30), "the test never let this call run"
        self.calls.append([job.prompts[0][0] for job in jobs])
        self.tokens.append(sum(len(p) for job in jobs for p in job.prompts))
        return [[float(prompt[0]) for prompt in job.prompts] for job in jobs]

    async def running(self) -> None:
        """Until the worker is inside a call."""
        assert await asyncio.to_thread(self.entered.acquire, True, 30)

    def step(self) -> None:
        self._go.release()


@asynccontextmanager
async def started(backend: ScoringBackend, **settings: Any) -> AsyncIterator[RequestBatcher]:
    """A ``RequestBatcher(backend, **settings)`` started, and stopped on the way out whatever the test
    raised (so that its collecting task never outlives the test)."""
    batcher = RequestBatcher(backend, **settings)
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()


async def queue(batcher: RequestBatcher, jobs: Sequence[ScoringJob]) -> list[asyncio.Future[list[float]]]:
    tasks = [asyncio.ensure_future(batcher.score(j)) for j in jobs]
    await asyncio.sleep(0)  # one turn of the loop: each task has queued its job, in this order
    assert batcher.queued >= len(jobs)
    return tasks


async def first_call_running(
    batcher: RequestBatcher, backend: SteppedBackend
) -> list[asyncio.Future[list[float]]]:
    """Job 1 queued and its call running, held until the test steps it: the call that the jobs the
    test queues next wait behind."""
    tasks = await queue(batcher, [job(1)])
    await backend.running()
    return tasks


class SteppedAheadBackend(SteppedBackend):
    """:class:`SteppedBackend` that can lay calls out ahead and launch them before collecting (the
    protocol of a local engine): a call launches at :meth:`launch` and its scores are collected at
    :meth:`step`; calls laid out ahead are noted with the thread that laid them out, launches in
    their order."""

    def __init__(self) -> None:
        super().__init__()
        self.laid_out: list[tuple[list[int], str]] = []
        self.launched: list[list[int]] = []
        self._launch = threading.Semaphore(0)

    def prepare_jobs(self, jobs: Sequence[ScoringJob], *, lay_out: bool = True) -> list[ScoringJob]:
        if lay_out:
            self.laid_out.append(([j.prompts[0][0] for j in jobs], threading.current_thread().name))
        return list(jobs)

    def launch_prepared(
        self, prepared: list[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[ScoringJob]:
        self.entered.release()
        assert self._launch.acquire(timeout=30), "the test never let this call launch"
        self.launched.append([job.prompts[0][0] for job in prepared])
        return prepared

    def collect_launched(
        self, call: list[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        assert self._go.acquire(timeout=30), "the test never let this call finish"
        self.calls.append([job.prompts[0][0] for job in call])
        self.tokens.append(sum(len(p) for job in call for p in job.prompts))
        return [[float(prompt[0]) for prompt in job.prompts] for job in call]

    def launch(self) -> None:
        self._launch.release()

    async def launch_next(self) -> None:
        """Until the engine's thread is launching a call, then let that launch finish."""
        await self.running()
        self.launch()

    async def finish_last_two(
        self, laid_out: int, tasks: list[asyncio.Future[list[float]]]
    ) -> list[list[float]]:
        """The running call launched with the next one laid out ahead (the ``laid_out``-th), that
        one launched and both collected: every task's result."""
        self.launch()
        await self.laid_out_calls(laid_out)
        self.step()
        await self.launch_next()
        self.step()
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    async def launched_calls(self, count: int) -> None:
        await _until(lambda: len(self.launched) >= count, f"{count} calls were never launched", self.launched)

    async def laid_out_calls(self, count: int) -> None:
        await _until(
            lambda: len(self.laid_out) >= count, f"{count} calls were never laid out ahead", self.laid_out
        )


async def _until(condition: Callable[[], bool], failure: str, seen: object) -> None:
    """Poll ``condition`` for up to 30 s; fail with ``failure`` and what was ``seen`` otherwise."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"{failure}: {seen}")


async def first_call_launched(
    batcher: RequestBatcher, backend: SteppedAheadBackend
) -> list[asyncio.Future[list[float]]]:
    """Job 1 queued and its call launched (its work queued on the device) but not answered: the
    call that the jobs the test queues next wait behind."""
    tasks = await queue(batcher, [job(1)])
    await backend.launch_next()
    await backend.launched_calls(1)
    return tasks
