"""Requests whose callers went away: noticed before their texts are tokenized.

A server sets a :class:`RequestLife` for each request it handles (:func:`living`); the context
variable follows the request into the worker thread that builds its prompts (``asyncio.to_thread``
copies it). The front end's :class:`TokenizerLock` checks it each time the tokenizer is taken, so a
request abandoned while it waited for the tokenizer gives it straight to the next one instead of
tokenizing for nobody. Outside a server no life is set and the lock is a plain lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from genscore_core.errors import RequestAbandoned as RequestAbandoned
from genscore_core.request_timing import bound, current_timing


@dataclass
class AbandonStats:
    """Counters of one server: how many requests were abandoned, and how much work that saved."""

    in_flight: int = 0
    """Requests received in full and not yet answered."""
    abandoned: int = 0
    """Requests whose client disconnected before the answer."""
    tokenized: int = 0
    """Requests that took the tokenizer (each counted once)."""
    skipped: int = 0
    """Abandoned requests that reached the tokenizer and were dropped there, untokenized."""
    changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    """Guards the counters; notified whenever one changes."""

    def add(self, name: str, amount: int = 1) -> None:
        with self.changed:
            setattr(self, name, getattr(self, name) + amount)
            self.changed.notify_all()

    def wait_until(self, condition: Callable[[AbandonStats], bool], timeout: float) -> bool:
        """Block until ``condition(self)`` holds (True) or ``timeout`` seconds pass (False).

        For callers that must see a state the server reaches on its own threads, such as tests.
        """
        with self.changed:
            return self.changed.wait_for(lambda: condition(self), timeout)


@dataclass
class RequestLife:
    """One request's state as the server sees it."""

    stats: AbandonStats
    abandoned: threading.Event = field(default_factory=threading.Event)
    counted: bool = False


_current: ContextVar[RequestLife | None] = ContextVar("genscore_request_life", default=None)


def living(life: RequestLife) -> AbstractContextManager[RequestLife]:
    """Make ``life`` the current request's for the code run inside (and the threads it starts)."""
    return bound(_current, life)


class TokenizerLock:
    """A lock around the (not thread-safe) Rust tokenizer that drops abandoned requests at the door.

    Used like ``threading.Lock`` (``with lock:``). Taking it raises :class:`RequestAbandoned`, the lock
    released again, when the current request's caller has gone. The time a timed request holds it
    goes to its :class:`~genscore_core.request_timing.RequestTiming` (``tokenize`` in ``/metrics``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.waiting = 0
        """Threads waiting for the tokenizer now."""
        self._taken_at = 0.0  # written and read only by the thread holding the lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._count_lock:
            self.waiting += 1
        try:
            taken = self._lock.acquire(blocking, timeout)
        finally:
            with self._count_lock:
                self.waiting -= 1
        if not taken:
            return False
        self._taken_at = time.perf_counter()
        life = _current.get()
        if life is None:
            return True
        if life.abandoned.is_set():
            self._lock.release()
            life.stats.add("skipped")
            raise RequestAbandoned("the client went away before its request was tokenized")
        if not life.counted:
            life.counted = True
            life.stats.add("tokenized")
        return True

    def release(self) -> None:
        timing = current_timing()
        if timing is not None:
            timing.tokenizer_seconds += time.perf_counter() - self._taken_at
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()
