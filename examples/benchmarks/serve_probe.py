"""``genscore serve`` with diagnostics: where a loaded server's time goes (bench_serve.py ``--probe``).

    GENSCORE_PROBE_DIR=/tmp/probe python examples/benchmarks/serve_probe.py --model DIR --port 8000

Takes ``genscore serve``'s arguments and runs the same application on uvicorn, with three additions
that exist only here (nothing in the library changes):

* the engine is wrapped in a backend that records every engine call (start, end, jobs, prompts,
  tokens) and, when asked (``POST /_probe/profile?calls=N``), runs ``torch.profiler`` over the next
  N calls on the engine's own thread (CPU ops of that thread and every GPU kernel), written to
  ``$GENSCORE_PROBE_DIR/trace.json``;
* a sampler of every Python thread's stack (``sys._current_frames()``), on when asked
  (``POST /_probe/sample?seconds=S&interval_ms=I``): which Python code each thread is in, by thread
  (a fallback where py-spy cannot attach; it needs the interpreter lock itself, so it cannot see
  waits for it);
* the event loop's lag: a task that sleeps 5 ms and records how late it wakes (while sampling);
* a timeline of every engine call (``timeline`` in the report): when the batcher took it from the
  queue (and how many calls ran), when it was laid out, launched and collected, when its requests
  were answered, and on the GPU when its first queued work began and its last ended (CUDA events
  beside the launch, timed against one reference event, so on the host's clock); and when each
  request was queued (``arrivals``). ``probe_summary.py`` reads where the GPU had nothing queued.

``GET /_probe/report`` returns all of it, with the native id of each Python thread (to read
``/proc/<pid>/task/<tid>`` by thread) and the interpreter's switch interval, which
``GENSCORE_PROBE_SWITCH_MS`` sets for the whole process before the server starts.
``GENSCORE_PROBE_BLOCKING_SYNC=1`` makes the collecting thread wait for each call's scores on a
blocking CUDA event (it sleeps instead of spinning on a core).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from genscore_core.backend import ProgressCallback, ScoringBackend, ScoringJob
from genscore_core.cli import build_parser
from genscore_core.engine import ScoringEngine


class ProbedEngine(ScoringBackend):
    """The engine, with each call recorded and a profiler run over calls on request."""

    def __init__(self, engine: ScoringEngine, folder: Path) -> None:
        self.engine = engine
        self.forward = engine.forward  # /stats reads the forward's counters through the backend
        self.folder = folder
        self.calls: list[dict[str, Any]] = []
        self.profile_calls = 0
        self.profile_state = "idle"
        self._profiler: Any = None
        self._profiled = 0
        self._launches: dict[int, tuple[float, bool]] = {}
        self.timeline: list[dict[str, Any]] = []
        """Finished calls (answered), in the order they were answered."""
        self.arrivals: list[float] = []
        """When each request's job was queued (host perf_counter)."""
        self.arrival_of: dict[int, float] = {}
        self.blocking_sync = os.environ.get("GENSCORE_PROBE_BLOCKING_SYNC") == "1"
        """Swap each launched call's event for a blocking one (hypothesis: the spinning wait costs a core)."""
        self._open: dict[int, dict[str, Any]] = {}
        """Calls taken and not yet answered, by the id of their first job."""
        self._ref: Any = None
        self._ref_host = 0.0
        if torch.cuda.is_available():
            # GPU times of the timeline: events timed against this one, whose completion the host saw.
            torch.cuda.synchronize()
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
            self._ref.synchronize()
            self._ref_host = time.perf_counter()

    # -- the timeline -------------------------------------------------------------------------------

    def note(self, jobs: Sequence[ScoringJob], /, **fields: Any) -> None:
        """Fields of the open call whose first job is ``jobs[0]`` (the first value of a key stays)."""
        if not jobs:
            return
        entry = self._open.setdefault(id(jobs[0]), {})
        for key, value in fields.items():
            entry.setdefault(key, value)

    def answered(self, jobs: Sequence[ScoringJob]) -> None:
        """The call holding ``jobs`` was answered: its timeline entry is complete."""
        entry = self._open.pop(id(jobs[0]), None) if jobs else None
        if entry is None:
            return
        entry["answered"] = time.perf_counter()
        if self._ref is None and "launch_start" in entry:  # on the CPU the launch ran the call
            entry["gpu_start"], entry["gpu_end"] = entry["launch_start"], entry["launch_end"]
        for key in ("gpu_start", "gpu_end"):
            event = entry.pop(key + "_event", None)
            if event is not None and self._ref is not None:
                event.synchronize()  # the end event sits right behind the scores' copy just waited for
                entry[key] = self._ref_host + self._ref.elapsed_time(event) / 1e3
        self.timeline.append(entry)

    def _event(self) -> Any:
        if self._ref is None:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        return self._timed(jobs, lambda: self.engine.score_jobs(jobs, on_progress))

    # A server whose batcher lays calls out ahead (ScoringEngine.prepare_jobs) finds them here too.
    def prepare_jobs(self, jobs: Sequence[ScoringJob], *, lay_out: bool = True) -> Any:
        started = time.perf_counter()
        prepared = self.engine.prepare_jobs(jobs, lay_out=lay_out)
        self.note(jobs, prepare_start=started, prepare_end=time.perf_counter(), laid_out=lay_out)
        return prepared

    # ... and launches each on the engine's thread, collecting it on another: a call is recorded
    # from its launch to its scores (calls overlap); the profiler starts at a call's collect.
    def launch_prepared(self, prepared: Any, on_progress: ProgressCallback | None = None) -> Any:
        started = time.perf_counter()
        gpu_start = self._event()
        call = self.engine.launch_prepared(prepared, on_progress)
        gpu_end = self._event()
        if self.blocking_sync and getattr(call, "event", None) is not None:
            # The collecting thread then sleeps in its wait instead of spinning on a core.
            blocking = torch.cuda.Event(blocking=True)
            blocking.record()
            call.event = blocking
        self._launches[id(call)] = (started, prepared.batches is not None)
        self.note(
            prepared.jobs,
            launch_start=started,
            launch_end=time.perf_counter(),
            gpu_start_event=gpu_start,
            gpu_end_event=gpu_end,
        )
        return call

    def collect_launched(self, call: Any, on_progress: ProgressCallback | None = None) -> list[list[float]]:
        started, ahead = self._launches.pop(id(call), (time.perf_counter(), False))
        self.note(call.jobs, collect_start=time.perf_counter())
        scores = self._timed(
            call.jobs, lambda: self.engine.collect_launched(call, on_progress), ahead=ahead, started=started
        )
        self.note(call.jobs, collect_end=time.perf_counter())
        return scores

    def _timed(
        self,
        jobs: Sequence[ScoringJob],
        run: Callable[[], list[list[float]]],
        ahead: bool = False,
        started: float | None = None,
    ) -> list[list[float]]:
        if self._profiler is None and self.profile_calls > 0:
            self._start_profile()
        if started is None:
            started = time.perf_counter()
        if self._profiler is not None:
            with torch.profiler.record_function(f"probe.call {len(self.calls)}"):
                scores = run()
        else:
            scores = run()
        ended = time.perf_counter()
        self.calls.append(
            {
                "start": started,
                "end": ended,
                "jobs": len(jobs),
                "prompts": sum(len(job.prompts) for job in jobs),
                "tokens": sum(len(p) for job in jobs for p in job.prompts),
                "profiled": self._profiler is not None,
                "ahead": ahead,
            }
        )
        if self._profiler is not None:
            self._profiled += 1
            if self._profiled >= self.profile_calls:
                self._stop_profile()
        return scores

    def _start_profile(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()
        self._profiled = 0
        self.profile_state = "running"

    def _stop_profile(self) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        profiler.export_chrome_trace(str(self.folder / "trace.json"))
        self.profile_calls = 0
        self.profile_state = "done"


class StackSampler:
    """Counts of each Python thread's innermost frames, sampled every ``interval`` seconds."""

    def __init__(self) -> None:
        self.stacks: Counter[tuple[str, str]] = Counter()
        self.samples: Counter[str] = Counter()
        self.rounds = 0
        self.running = False

    def run(self, seconds: float, interval: float, depth: int = 8) -> None:
        self.running = True
        own = threading.get_ident()
        deadline = time.perf_counter() + seconds
        try:
            while time.perf_counter() < deadline:
                names = {t.ident: t.name for t in threading.enumerate()}
                for ident, frame in sys._current_frames().items():
                    if ident == own:
                        continue
                    group = re.sub(r"[_-]?\d+$", "_*", names.get(ident, f"thread {ident}"))
                    lines = []
                    current: Any = frame
                    while current is not None and len(lines) < depth:
                        code = current.f_code
                        lines.append(f"{code.co_name} ({Path(code.co_filename).name}:{current.f_lineno})")
                        current = current.f_back
                    self.stacks[(group, " <- ".join(lines))] += 1
                    self.samples[group] += 1
                self.rounds += 1
                time.sleep(interval)
        finally:
            self.running = False

    def report(self, top: int = 25) -> dict[str, Any]:
        by_group: dict[str, list[tuple[int, str]]] = {}
        for (group, stack), count in self.stacks.most_common():
            entries = by_group.setdefault(group, [])
            if len(entries) < top:
                entries.append((count, stack))
        return {"rounds": self.rounds, "samples": dict(self.samples), "top": by_group}


class LoopLag:
    """How late a 5 ms sleep on the event loop wakes, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.lags_ms: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(0.005)
            if self.on:
                self.lags_ms.append((loop.time() - started - 0.005) * 1e3)


def watch_batcher(batcher: Any, probed: ProbedEngine) -> None:
    """The batcher's queue, takes and answers noted in ``probed``'s timeline (this instance only:
    its bound methods are wrapped, the class is untouched)."""
    take, score, record = batcher._take, batcher.score, batcher._record

    def taking(*, running: int) -> Any:
        started, queued = time.perf_counter(), batcher.queued
        batch = take(running=running)
        if batch:
            probed.note(
                [entry.job for entry in batch[:1]],
                take=started,
                running=running,
                batches_done=batcher.stats.batches,
                jobs=len(batch),
                queued=queued,
                left=batcher.queued,
                prompts=sum(len(entry.job.prompts) for entry in batch),
                tokens=sum(entry.tokens for entry in batch),
                arrived=[probed.arrival_of.pop(id(entry.job), None) for entry in batch],
            )
        return batch

    async def scoring(job: ScoringJob) -> list[float]:
        now = time.perf_counter()
        probed.arrivals.append(now)
        probed.arrival_of[id(job)] = now
        return await score(job)

    def recording(batch: Any, outcomes: Any) -> None:
        record(batch, outcomes)
        probed.answered([entry.job for entry in batch[:1]])

    batcher._take, batcher.score, batcher._record = taking, scoring, recording


def main(argv: Sequence[str]) -> int:
    import uvicorn

    from genscore_core.scorer import GenerativeScorer
    from genscore_core.server.app import create_app
    from genscore_core.server.cli import server_limits
    from genscore_core.server.connections import uvicorn_options

    if os.environ.get("GENSCORE_PROBE_SWITCH_MS"):
        sys.setswitchinterval(float(os.environ["GENSCORE_PROBE_SWITCH_MS"]) / 1e3)
    folder = Path(os.environ.get("GENSCORE_PROBE_DIR", "probe"))
    folder.mkdir(parents=True, exist_ok=True)
    args = build_parser().parse_args(["serve", *argv])
    from genscore_core.cli_args import config_settings

    limits = server_limits(args)
    scorer = GenerativeScorer(**config_settings(args))
    app = create_app(scorer, limits, served_model_name=args.served_model_name)
    batcher = app.state.batcher
    assert batcher.backend.local_model is not None, "the probe wraps a local engine"
    probed = ProbedEngine(batcher.backend, folder)
    batcher.backend = probed
    watch_batcher(batcher, probed)
    sampler = StackSampler()
    lag = LoopLag()

    tasks: list[asyncio.Task[None]] = []

    @app.post("/_probe/profile")
    async def profile(calls: int = 4) -> dict[str, Any]:
        probed.profile_calls = calls
        probed.profile_state = "asked"
        return {"state": probed.profile_state}

    @app.get("/_probe/profile")
    async def profile_state() -> dict[str, Any]:
        return {"state": probed.profile_state}

    @app.post("/_probe/sample")
    async def sample(seconds: float = 2.0, interval_ms: float = 2.0) -> dict[str, Any]:
        if not sampler.running:
            if not tasks:  # started here: the probe adds nothing to the loop until asked
                tasks.append(asyncio.get_running_loop().create_task(lag.run()))
            lag.on = True
            thread = threading.Thread(
                target=sampler.run, args=(seconds, interval_ms / 1e3), name="probe-sampler", daemon=True
            )
            thread.start()
            loop = asyncio.get_running_loop()
            loop.call_later(seconds, lambda: setattr(lag, "on", False))
        return {"running": True}

    @app.get("/_probe/report")
    async def report() -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "switch_interval_s": sys.getswitchinterval(),
            "threads": {t.name: t.native_id for t in threading.enumerate()},
            "calls": probed.calls,
            "timeline": probed.timeline,
            "arrivals": probed.arrivals,
            "sampler": sampler.report(),
            "loop_lag_ms": lag.lags_ms,
            "profile": probed.profile_state,
        }

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **uvicorn_options(limits))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
