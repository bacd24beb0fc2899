"""When a loaded server takes the call behind the running one: late, but before the device runs dry.

The batcher lays the next call out while the running one is on the device and launches it right
behind (:mod:`genscore_core.server.batcher`). Taken too early, that call misses the requests whose
clients are still on their way back (the clients of the call answered just before: at 32 clients
they return 15-60 ms after their answer); taken after the running call is answered, the device
idles while it is laid out. A profile of 32 clients (docs/benchmarks.md, "Server batching")
showed both: calls alternating between ~11 and ~21 requests, and every fourth call taken only after
the one before was answered, with ~10-20 ms of idle device before it.

:class:`DevicePace` predicts when the device finishes the running call from the calls collected
before it (device seconds per prompt token, weighted by tokens: ~1.5 us a token on an H200 for the
Qwen3-0.6B shape, within +-7% from call to call) and says when to take the next one: that end less
the time a call takes to lay out (twice the longest of the last few, plus a floor for the event
loop's timer and the rate's error). Without history it says "now", the behaviour before it.
"""

from __future__ import annotations

import threading
from collections import deque

LEAD_FLOOR_S = 0.015
"""Taken at least this long before the predicted end: the event loop's timer may fire a switch
interval (5 ms) late under the interpreter lock, and the rate is off by up to ~7% (~10 ms of a
150 ms call)."""

HISTORY = 8
"""Calls the rate and the layout time are taken from."""


class DevicePace:
    """Device time of collected calls, and when to take the call behind a running one.

    Fed from the server's threads (:meth:`collected` on the collecting thread, :meth:`laid_out` on
    the preparing thread), read on the event loop (:meth:`take_at`); times are ``time.perf_counter()``.
    """

    def __init__(self, history: int = HISTORY, lead_floor: float = LEAD_FLOOR_S) -> None:
        self._calls: deque[tuple[int, float]] = deque(maxlen=history)
        self._layouts: deque[float] = deque(maxlen=max(1, history // 2))
        self._lead_floor = lead_floor
        self._lock = threading.Lock()
        self.last_end = 0.0
        """When the last collected call's scores were on the host."""

    def collected(self, tokens: int, launched: float, ended: float) -> float:
        """A call of ``tokens`` prompt tokens, whose launch began at ``launched``, had its scores
        on the host at ``ended``; returns its device time, counted from when the device could start
        it: its launch, or the call before it ended, whichever is later (calls overlap on the host
        while the next one launches behind the running one). Calls are collected in launch order."""
        with self._lock:
            span = max(0.0, ended - max(launched, self.last_end))
            self.last_end = max(self.last_end, ended)
            if tokens > 0 and span > 0:
                self._calls.append((tokens, span))
            return span

    def laid_out(self, seconds: float) -> None:
        """A call was laid out (on the preparing thread) in ``seconds``."""
        with self._lock:
            self._layouts.append(seconds)

    @property
    def seconds_per_token(self) -> float | None:
        """Device seconds per prompt token over the last calls (weighted by tokens), or None."""
        with self._lock:
            tokens = sum(t for t, _ in self._calls)
            return sum(s for _, s in self._calls) / tokens if tokens else None

    @property
    def lead(self) -> float:
        """How long before the device runs dry the next call is taken: twice the longest recent
        layout, plus the floor."""
        with self._lock:
            return self._lead_floor + 2 * max(self._layouts, default=0.0)

    def finishes_at(self, tokens: int, launched: float) -> float | None:
        """When the device is predicted to finish a running call of ``tokens`` whose launch began
        at ``launched``, every call before it collected; None without history."""
        rate = self.seconds_per_token
        if rate is None:
            return None
        return max(launched, self.last_end) + rate * tokens

    def take_at(self, tokens: int, launched: float) -> float | None:
        """When to take the call behind that running call: its predicted end less :attr:`lead`;
        None (take now) without history."""
        end = self.finishes_at(tokens, launched)
        return None if end is None else end - self.lead
