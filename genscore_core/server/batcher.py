"""Dynamic batching: the jobs of concurrent requests go through the engine in one call.

The batcher is itself a :class:`~genscore_core.backend.ScoringBackend`: ``genscore serve`` composes
the scorer's front end with it, so each request is answered by ``GenerativeScorer.ascore`` or
``arerank`` exactly as a library call would be, only scored together with other requests.

Requests queue their :class:`~genscore_core.backend.ScoringJob` (their prompts were built on worker
threads: nothing tokenizes on the event loop). One worker task takes jobs in arrival order, as many
as fit in a token budget, and scores them with a single ``score_jobs`` call on one worker thread, so
the event loop keeps accepting requests while the model runs; the requests that arrive meanwhile
fill the next call. The budget bounds a call's latency, not its memory (the engine splits a call
into forward batches of its own budget), so it is large: one call fills the GPU with many requests.

Fairness: a queued job is never overtaken (arrival order), and a job that has already seen
``max_waited_batches`` calls run while it was queued goes into the next call whatever the budget, so
no request waits behind more than that many calls, however the load comes. A short queue waits
``max_wait_ms`` at most for company; with ``preparing=`` (a hook saying whether requests are being
tokenized) it waits only while that says so, and a lone request starts at once. ``genscore serve``
passes the hook unless ``--batch-wait always`` asks for calls that wait up to ``--batch-max-wait-ms``
whatever comes (deployments that want full calls).

Laid out ahead: with a backend that can :class:`~genscore_core.backend.LaunchAhead` (the local
engine), once the running call
has queued all its GPU work, the worker takes the next call from the queue (same order, budget and
bound) and has it laid out on a second thread (distinct prompts, prefix groups, every forward
batch's host buffer) while the GPU finishes; it queues that call on the engine's thread right behind
the running one, so the GPU waits neither for the layout nor for a round trip through the event loop
between calls (docs/benchmarks.md, "Server batching").

Pipelined: the engine's thread only *launches* a call (its kernels, the copy of its scores to the
host, an event behind them: :meth:`~genscore_core.backend.LaunchAhead.launch_prepared`); a third
thread waits for the scores, checks them and hands them to the event loop
(:meth:`~genscore_core.backend.LaunchAhead.collect_launched`). So the call laid out ahead is
launched behind the running one on the device's stream while that one still runs, and the device
goes from one call to the next without waiting for the host. Calls are collected one at a time in
the order they were launched, and answered in that order. At most one call is queued behind the
running one, as before: the call after it is taken once the running call is answered and the one
behind it has launched.

Taken late: the call behind the running one is taken when the device is predicted to be about to
finish the running call (:class:`~genscore_core.server.pacing.DevicePace`: its tokens at the device
time per token of the calls collected before, less twice a recent layout time), or at once when the
queue already fills the budget, or when the running call is answered first. Taken as soon as the
running call has launched, it missed the requests still on their way back from the call answered
just before, and the call after it was often taken only after the running one was answered, with
the device idle meanwhile (docs/benchmarks.md, "Server batching").

A job's scores do not depend on what it is batched with, beyond float32 rounding (observed
differences are below 1e-6).

Timed: a request's :class:`~genscore_core.request_timing.RequestTiming` (``genscore serve`` sets
one) gets the moment its job was queued, and, once scored, when its call began launching and when
that call's scores were on the host (the ``queue`` and ``inference`` stages of ``/metrics``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from genscore_core.backend import (
    LaunchAhead,
    ProgressCallback,
    ScoringBackend,
    ScoringJob,
    StreamLayout,
    streamed,
)
from genscore_core.errors import InvalidRequestError, ScoreRangeError, ServerBusyError
from genscore_core.request_timing import current_timing, note_queued
from genscore_core.server.pacing import DevicePace
from genscore_core.waiting import within

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    job: ScoringJob
    tokens: int
    future: asyncio.Future[list[float]]
    batches_done: int = 0
    """Engine calls finished when the job was queued."""
    taken: bool = False
    """Taken from the queue by the worker (into a call, or dropped as cancelled)."""
    dropped: bool = False
    """Cancelled while queued, and already left out of the queue's counts."""
    ran: tuple[float, float] | None = None
    """When the call that scored it began launching, and when its scores were on the host."""


@dataclass
class _Call:
    """An engine call submitted to the engine's thread."""

    batch: list[_Entry]
    outcome: asyncio.Future[list[list[float] | Exception]]
    launched: asyncio.Event
    """Set once the call has queued all its GPU work (or finished)."""
    tokens: int = 0
    """Prompt tokens of its jobs."""
    launch_started: float | None = None
    """When the engine's thread began launching it (``time.perf_counter()``); set before ``launched``."""
    collected: float | None = None
    """When its scores were on the host (or its error known), set before ``outcome`` is."""


@dataclass
class BatchStats:
    """Counters since start: how much batching actually happened."""

    requests: int = 0
    """Jobs scored."""
    batches: int = 0
    """Engine calls made."""
    largest_batch: int = 0
    """Most jobs in one engine call."""
    shared_batches: int = 0
    """Engine calls that served more than one job."""
    failures: int = 0
    """Jobs answered with an error."""
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """Number of engine calls per number of jobs in the call."""
    waited_batches: dict[int, int] = field(default_factory=dict)
    """Number of jobs per number of engine calls that ran while the job was queued (the one running
    when it arrived included)."""
    engine_seconds: float = 0.0
    """Wall time spent inside engine calls (from a call's launch to its scores on the host; calls
    that overlap count once). The rest of the time the worker waited for requests or passed results
    and the next call between the event loop and its threads."""
    prepared_ahead: int = 0
    """Engine calls laid out on the host while the call before them ran."""


class RequestBatcher(ScoringBackend):
    """Collects jobs from concurrent requests and scores them together.

    Args:
        backend: What scores the jobs (the scorer's engine, or a remote backend).
        max_batch_tokens: Prompt tokens per engine call; a single larger job runs alone.
        max_wait_ms: How long a short queue waits for more jobs before it is scored.
        max_waited_batches: Calls a queued job may see run before it; the next call takes it
            whatever ``max_batch_tokens`` says.
        preparing: Whether requests are being prepared (tokenized) now; when given, the worker waits
            for company only while it says so. None: a short queue always waits ``max_wait_ms``.
        batch_tokens: When the backend streams (:attr:`~genscore_core.backend.ScoringBackend.streams`:
            a local engine whose forward streams), run each call of several jobs as forward batches
            filled to this many tokens (the last holds the rest), so that their shapes repeat and
            replay CUDA graphs (:attr:`~genscore_core.backend.StreamLayout.batch_tokens`); 0: the
            engine's own balanced batches. A lone job always takes the engine's own way.
        max_queued: Jobs allowed to wait; :meth:`score` raises :class:`ServerBusyError` beyond it.
        max_request_tokens: Prompt tokens one :meth:`ascore_jobs` call (one request) may hold; more
            is an :class:`~genscore_core.InvalidRequestError`. ``None``: no limit.
        pace: When to take the call behind a running one (calls laid out ahead); None: a
            :class:`~genscore_core.server.pacing.DevicePace` learning from this server's calls.
    """

    def __init__(
        self,
        backend: ScoringBackend,
        *,
        max_batch_tokens: int = 262_144,
        max_wait_ms: float = 2.0,
        max_queued: int = 4096,
        max_request_tokens: int | None = None,
        max_waited_batches: int = 2,
        preparing: Callable[[], bool] | None = None,
        batch_tokens: int = 0,
        pace: DevicePace | None = None,
    ) -> None:
        if max_waited_batches < 1:
            raise ValueError(f"max_waited_batches must be at least 1, got {max_waited_batches}")
        if batch_tokens < 0:
            raise ValueError(f"batch_tokens must not be negative, got {batch_tokens}")
        self.batch_tokens = batch_tokens
        self.backend = backend
        self.max_request_tokens = max_request_tokens
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.max_queued = max_queued
        self.max_waited_batches = max_waited_batches
        self._preparing = preparing
        self.stats = BatchStats()
        self._pending: deque[_Entry] = deque()
        self._pending_tokens = 0
        # Entries of requests cancelled while queued (their clients left), still in _pending until
        # the worker reaches them: not counted as queued, nor against max_queued.
        self._dropped = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._preparer: ThreadPoolExecutor | None = None
        self._collector: ThreadPoolExecutor | None = None
        self.pace = pace if pace is not None else DevicePace()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def _ahead(self) -> LaunchAhead | None:
        """The backend, where calls can be laid out ahead (not through the fixed-size batches of
        ``batch_tokens``)."""
        backend = self.backend
        return backend if isinstance(backend, LaunchAhead) and not self.batch_tokens else None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def queued(self) -> int:
        """Jobs waiting for a call, those cancelled meanwhile not counted."""
        return len(self._pending) - self._dropped

    def start(self) -> None:
        """Start the worker on the running event loop."""
        if self.running:
            return
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="genscore-forward")
        # Its thread starts with the first call laid out ahead.
        self._preparer = ThreadPoolExecutor(1, thread_name_prefix="genscore-prepare")
        # One thread: calls are collected in launch order.
        self._collector = ThreadPoolExecutor(1, thread_name_prefix="genscore-collect")
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._work(), name="genscore-batcher")

    async def stop(self) -> None:
        """Stop the worker; jobs still queued fail with :class:`ServerBusyError`."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        while self._pending:
            entry = self._pending.popleft()
            entry.taken = True
            if not entry.future.done():
                entry.future.set_exception(ServerBusyError("the server is shutting down"))
        self._pending_tokens = self._dropped = 0
        for executor in (self._executor, self._preparer, self._collector):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._preparer = self._collector = None

    # -- the backend contract -------------------------------------------------------------------------

    async def ascore_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Queue the jobs of one request; their scores once the batches holding them have run."""
        if self.max_request_tokens is not None:
            tokens = sum(len(prompt) for job in jobs for prompt in job.prompts)
            if tokens > self.max_request_tokens:
                raise InvalidRequestError(
                    f"the request's prompts total {tokens} tokens; this server accepts at most "
                    f"{self.max_request_tokens} per request (--max-prompt-tokens); split the request",
                )

        async def one(number: int, job: ScoringJob) -> list[float]:
            try:
                scores = await self.score(job)
            except ScoreRangeError as error:
                if error.job is None or error.prompt is None:
                    raise
                # The engine counted the job in the call it ran (other requests', or it alone);
                # this request knows it as ``number``.
                place = f"prompt {error.prompt} of job {number}"
                raise error.naming(place, job=number, prompt=error.prompt) from error
            if on_progress is not None:
                on_progress(len(scores))
            return scores

        return list(await asyncio.gather(*(one(number, job) for number, job in enumerate(jobs))))

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """:meth:`ascore_jobs` from a thread other than the batcher's event loop (it blocks until done)."""
        loop = self._loop
        if loop is None or not self.running:
            raise ServerBusyError("the scoring worker is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("RequestBatcher.score_jobs would block its own event loop; await ascore_jobs")
        return asyncio.run_coroutine_threadsafe(self.ascore_jobs(jobs, on_progress), loop).result()

    async def score(self, job: ScoringJob) -> list[float]:
        """Scores of the job's prompts, once a batch containing it has run."""
        if not job.prompts:
            return []
        if not self.running or self._wakeup is None:
            raise ServerBusyError("the scoring worker is not running")
        if self.queued >= self.max_queued:
            raise ServerBusyError(
                f"{self.queued} requests are already waiting (max_queued_requests={self.max_queued}); "
                "retry shortly"
            )
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        entry = _Entry(job, sum(len(prompt) for prompt in job.prompts), future, self.stats.batches)
        self._pending.append(entry)
        self._pending_tokens += entry.tokens
        note_queued()
        self._wakeup.set()
        try:
            scores = await future
        except asyncio.CancelledError:
            # Its client left. The entry stays in the queue until the worker reaches it (removing it
            # from the middle of the deque costs a scan); until then it must not count: while a long
            # call ran, clients timing out filled max_queued with the dead, and live requests got 503.
            if not entry.taken and not entry.dropped:
                entry.dropped = True
                self._dropped += 1
                self._pending_tokens -= entry.tokens
            raise
        timing = current_timing()
        if timing is not None and entry.ran is not None:
            timing.ran(*entry.ran)
        return scores

    # -- the worker ---------------------------------------------------------------------------------

    async def _work(self) -> None:
        # Calls submitted to the engine's thread, in order: the running one and at most one behind it.
        calls: deque[_Call] = deque()
        try:
            await self._run_calls(calls)
        finally:
            for call in calls:  # stopped: calls taken from the queue are answered like queued ones
                for entry in call.batch:
                    if not entry.future.done():
                        entry.future.set_exception(ServerBusyError("the server is shutting down"))

    async def _run_calls(self, calls: deque[_Call]) -> None:
        while True:
            if not calls:
                batch = await self._next_batch()
                if not batch:
                    continue
                calls.append(self._submit(batch, ahead=False))
            call = calls[0]
            if len(calls) == 1 and self._ahead is not None:
                # Once the running call's GPU work is all queued, take the next call now and lay it
                # out while the GPU finishes this one (the requests queued by then: the same order,
                # budget and bound as a call taken afterwards).
                launched: asyncio.Future[Any] = asyncio.ensure_future(call.launched.wait())
                waiting: set[asyncio.Future[Any]] = {call.outcome, launched}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                launched.cancel()
                await self._until_take_point(call)
                if not call.outcome.done() and self._pending:
                    batch = self._take(running=1)
                    if batch:
                        calls.append(self._submit(batch, ahead=True))
            try:
                outcomes = await call.outcome
            except Exception as error:  # the call never reached the engine (the server is stopping)
                outcomes = [error] * len(call.batch)
            calls.popleft()
            self._record(call.batch, outcomes)
            ran = None
            if call.launch_started is not None and call.collected is not None:
                ran = (call.launch_started, call.collected)
            for entry, outcome in zip(call.batch, outcomes):
                if entry.future.done():  # the request was cancelled meanwhile
                    continue
                entry.ran = ran
                if isinstance(outcome, BaseException):
                    entry.future.set_exception(outcome)
                else:
                    entry.future.set_result(outcome)

    async def _until_take_point(self, call: _Call) -> None:
        """Wait until the call behind the launched ``call`` should be taken: the device is about to
        finish ``call`` (:meth:`DevicePace.take_at`), the queue fills the budget, or ``call`` is
        answered. Requests arriving meanwhile join that next call rather than the one after it."""
        launched = call.launch_started
        assert self._wakeup is not None
        while (
            launched is not None and not call.outcome.done() and self._pending_tokens < self.max_batch_tokens
        ):
            take_at = self.pace.take_at(call.tokens, launched)
            if take_at is None or take_at <= time.perf_counter():
                return
            remaining = take_at - time.perf_counter()
            self._wakeup.clear()
            arrival: asyncio.Future[Any] = asyncio.ensure_future(self._wakeup.wait())
            waiting: set[asyncio.Future[Any]] = {call.outcome, arrival}
            try:
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrival.cancel()

    def _submit(self, batch: list[_Entry], *, ahead: bool) -> _Call:
        """Queue a call on the engine's thread (behind the running one, if any); ``ahead``: lay it
        out on the preparing thread meanwhile. A local engine's call is launched there and collected
        on the collecting thread (:meth:`_launch_call`); another backend's runs whole there."""
        loop = asyncio.get_running_loop()
        launched = asyncio.Event()
        jobs = [e.job for e in batch]
        tokens = sum(e.tokens for e in batch)

        result: asyncio.Future[list[list[float] | Exception]] = loop.create_future()
        call = _Call(batch, result, launched, tokens)

        def settle(done: Future[Any]) -> None:  # any thread: the outcome goes to the event loop
            call.collected = time.perf_counter()
            try:
                loop.call_soon_threadsafe(_settle, result, done)
            except RuntimeError:  # the loop closed: the server is gone
                pass

        assert self._executor is not None
        backend = self._ahead
        if backend is None:

            def on_run(started: float) -> None:  # on the engine's thread, the call over
                call.launch_started = started
                _set_from_thread(loop, launched)

            self._executor.submit(self._score_isolated, jobs, on_run).add_done_callback(settle)
            return call
        prepared: Future[Any] | None = None
        if ahead and self._preparer is not None:
            prepared = self._preparer.submit(self._lay_out, backend, jobs)
            self.stats.prepared_ahead += 1

        def on_launched(started: float) -> None:
            call.launch_started = started  # read on the loop once `launched` is set
            _set_from_thread(loop, launched)

        def on_queued(launching: Future[Any]) -> None:
            # The engine's thread returned the collecting thread's future, or failed to queue it.
            if launching.cancelled() or launching.exception() is not None:
                settle(launching)
            else:
                launching.result().add_done_callback(settle)

        self._executor.submit(self._launch_call, jobs, prepared, on_launched, tokens).add_done_callback(
            on_queued
        )
        return call

    def _lay_out(self, backend: LaunchAhead, jobs: list[ScoringJob]) -> Any:
        """On the preparing thread: the call laid out, its time noted (the pace's lead)."""
        started = time.perf_counter()
        prepared = backend.prepare_jobs(jobs)
        self.pace.laid_out(time.perf_counter() - started)
        return prepared

    def _launch_call(
        self,
        jobs: list[ScoringJob],
        prepared: Future[Any] | None,
        on_launched: Callable[[float], None],
        tokens: int,
    ) -> Future[list[list[float] | Exception]]:
        """On the engine's thread: queue the call's work on the device and hand its collection to
        the collecting thread, so this thread is free to launch the next call at once. A launch
        that fails is answered there too, one job at a time, in its turn."""
        started = time.perf_counter()
        call: Any  # the backend's launched call, or the error launching it raised
        try:
            call = self._launch(jobs, prepared)
        except Exception as error:
            call = error.with_traceback(None)  # its frames would hold the call's activations
        finally:
            on_launched(started)
        collector = self._collector
        if collector is None:
            raise ServerBusyError("the server is shutting down")
        return collector.submit(self._collect_isolated, jobs, call, started, tokens)

    def _launch(self, jobs: list[ScoringJob], prepared: Future[Any] | None) -> Any:
        ahead = self._ahead
        assert ahead is not None
        layout = None
        if prepared is not None:
            try:
                layout = prepared.result()
            except Exception as error:  # laid out again below, where an error reaches the caller
                logger.warning("laying out a call ahead failed (%s); laying it out again", error)
        if layout is None:
            # Nothing laid out ahead: the forward lays each batch out while the one before runs.
            layout = ahead.prepare_jobs(jobs, lay_out=False)
        return ahead.launch_prepared(layout)

    def _collect_isolated(
        self, jobs: list[ScoringJob], call: Any, started: float, tokens: int
    ) -> list[list[float] | Exception]:
        """On the collecting thread: the launched call's scores; if it failed (launching, or a bad
        score), the jobs again one by one (launched and collected here), so one bad job fails alone.
        Its device time goes to ``engine_seconds`` and, when it succeeded, to the pace."""
        ahead = self._ahead
        assert ahead is not None
        collected = False
        try:
            if isinstance(call, Exception):
                raise call
            scores: list[list[float] | Exception] = list(ahead.collect_launched(call))
            collected = True
            return scores
        except Exception as error:
            if len(jobs) == 1:
                return [error]
            logger.warning("a batch of %d jobs failed (%s); scoring them one by one", len(jobs), error)
        finally:
            # Calls that overlap (the next launching while this one runs) count once.
            span = self.pace.collected(tokens if collected else 0, started, time.perf_counter())
            self.stats.engine_seconds += span
        return _each_alone(
            jobs,
            lambda job: ahead.collect_launched(
                ahead.launch_prepared(ahead.prepare_jobs([job], lay_out=False))
            )[0],
        )

    async def _next_batch(self) -> list[_Entry]:
        assert self._wakeup is not None
        while not self._pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self.max_wait > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.max_wait
            while self._pending_tokens < self.max_batch_tokens and self._company_coming():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    # Not asyncio.wait_for: stop()'s cancellation, come just as a request woke the
                    # wait, would be lost on Python < 3.12 and stop() would wait forever (waiting.py).
                    await within(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    break
        return self._take(running=0)

    def _take(self, *, running: int) -> list[_Entry]:
        """The next call's jobs from the front of the queue, with ``running`` calls submitted and not
        yet finished ahead of it."""
        batch: list[_Entry] = []
        tokens = 0
        # The calls finished so far, those still running, and the one about to run: a job queued
        # before ``overdue`` calls had finished has waited behind max_waited_batches of them.
        overdue = self.stats.batches + running + 1 - self.max_waited_batches
        while self._pending:
            entry = self._pending[0]
            if entry.future.done():  # cancelled while queued
                self._pending.popleft()
                entry.taken = True
                if entry.dropped:
                    self._dropped -= 1
                else:  # its task has not yet run to see the cancellation
                    self._pending_tokens -= entry.tokens
                continue
            if batch and tokens + entry.tokens > self.max_batch_tokens and entry.batches_done >= overdue:
                break
            self._pending.popleft()
            entry.taken = True
            self._pending_tokens -= entry.tokens
            batch.append(entry)
            tokens += entry.tokens
        return batch

    def _company_coming(self) -> bool:
        return self._preparing is None or self._preparing()

    def _score_isolated(
        self, jobs: list[ScoringJob], on_run: Callable[[float], None] | None = None
    ) -> list[list[float] | Exception]:
        """Score the jobs together (a backend that does not launch ahead); if that fails, again one
        by one, so one bad job fails alone. ``on_run`` is called once the call is over, with when
        it began (``time.perf_counter()``)."""
        started = time.perf_counter()
        try:
            return list(self._score(jobs))
        except Exception as error:
            if len(jobs) == 1:
                return [error]
            logger.warning("a batch of %d jobs failed (%s); scoring them one by one", len(jobs), error)
        finally:
            self.stats.engine_seconds += time.perf_counter() - started
            if on_run is not None:
                on_run(started)
        return _each_alone(jobs, lambda job: self._score([job])[0])

    def _score(self, jobs: list[ScoringJob]) -> list[list[float]]:
        backend = self.backend
        if self.batch_tokens and len(jobs) > 1 and backend.streams:
            return backend.score_stream(*streamed(jobs), layout=StreamLayout(batch_tokens=self.batch_tokens))
        return backend.score_jobs(jobs)

    def _record(self, batch: list[_Entry], outcomes: list[list[float] | Exception]) -> None:
        stats = self.stats
        size = len(batch)
        stats.requests += size
        stats.batches += 1
        stats.largest_batch = max(stats.largest_batch, size)
        stats.shared_batches += size > 1
        stats.failures += sum(isinstance(outcome, Exception) for outcome in outcomes)
        stats.batch_sizes[size] = stats.batch_sizes.get(size, 0) + 1
        for entry in batch:
            # stats.batches already counts this call: the calls before it that the job saw run.
            waited = stats.batches - 1 - entry.batches_done
            stats.waited_batches[waited] = stats.waited_batches.get(waited, 0) + 1


def _settle(outcome: asyncio.Future[Any], done: Future[Any]) -> None:
    """On the event loop: ``outcome`` takes what the thread's future ``done`` ended with."""
    if outcome.done():
        return
    if done.cancelled():  # its executor was shut down: the server is stopping
        outcome.set_exception(ServerBusyError("the server is shutting down"))
    elif (error := done.exception()) is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(done.result())


def _set_from_thread(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` on ``loop`` from another thread; nothing once the loop is closed (the server is
    gone)."""
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:
        pass


def _each_alone(
    jobs: list[ScoringJob], score_one: Callable[[ScoringJob], list[float]]
) -> list[list[float] | Exception]:
    """Each job scored on its own: its scores, or the error it alone raised."""
    outcomes: list[list[float] | Exception] = []
    for job in jobs:
        try:
            outcomes.append(score_one(job))
        except Exception as error:
            outcomes.append(error)
    return outcomes
