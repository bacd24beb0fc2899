"""Where a served request's time went: the moments a server notes as the request passes each stage.

A server sets a :class:`RequestTiming` for each request it times (:func:`timed`); the context
variable follows the request into the worker thread that builds its prompts (``asyncio.to_thread``
copies it) and into the tasks of its jobs. The front end's tokenizer lock adds the time the request
held the tokenizer; the server's batcher notes when the request's first job was queued, when the
first engine call holding its jobs began to launch, and when the last one's scores were on the host.
:meth:`RequestTiming.stages` splits the request's time by those moments (``genscore serve``'s
``/metrics`` reports them). Outside a server no timing is set and nothing is noted.

All times are ``time.perf_counter()`` readings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

STAGES = ("prepare", "tokenize", "queue", "inference", "answer")
"""The stages of :meth:`RequestTiming.stages`, in the order a request passes them."""


@dataclass
class RequestTiming:
    """The moments one request passed, as the server noted them."""

    arrived: float
    """When the server began handling the request (its headers read)."""
    tokenizer_seconds: float = 0.0
    """Time the request's prompt building held the tokenizer."""
    queued: float | None = None
    """When the request's first job entered the engine's queue (its prompts built)."""
    launched: float | None = None
    """When the first engine call holding one of its jobs began launching."""
    scored: float | None = None
    """When the scores of the last engine call holding one of its jobs were on the host."""

    def ran(self, launched: float, scored: float) -> None:
        """Note an engine call that held one of the request's jobs."""
        self.launched = launched if self.launched is None else min(self.launched, launched)
        self.scored = scored if self.scored is None else max(self.scored, scored)

    def stages(self, answered: float) -> dict[str, float] | None:
        """Seconds in each of :data:`STAGES` for a request answered at ``answered``; None for one
        that never reached the engine (refused, answered from the result cache, or left).

        ``prepare``: from arrival to the first job queued, less ``tokenize`` (reading and checking
        the body, building prompts, waiting for a thread and for the tokenizer). ``tokenize``: the
        time its prompt building held the tokenizer. ``queue``: until the first engine call holding
        its jobs began launching. ``inference``: from then until the last such call's scores were on
        the host. ``answer``: from then until ``answered`` (ranking, the answer's JSON, sending it).
        The five add up to the request's time from arrival to ``answered``.
        """
        if self.queued is None or self.launched is None or self.scored is None:
            return None
        # A clock reading is taken on each side of the tokenizer's hold: clamp their rounding.
        return {
            "prepare": max(0.0, self.queued - self.arrived - self.tokenizer_seconds),
            "tokenize": self.tokenizer_seconds,
            "queue": self.launched - self.queued,
            "inference": self.scored - self.launched,
            "answer": answered - self.scored,
        }


_current: ContextVar[RequestTiming | None] = ContextVar("genscore_request_timing", default=None)


def current_timing() -> RequestTiming | None:
    """The timing of the request being handled; None outside a server's request."""
    return _current.get()


@contextmanager
def bound(variable: ContextVar[T | None], value: T) -> Iterator[T]:
    """``variable`` set to ``value`` for the code run inside (and the tasks and threads it starts:
    they copy the context), as it was after."""
    token = variable.set(value)
    try:
        yield value
    finally:
        variable.reset(token)


def timed(timing: RequestTiming) -> AbstractContextManager[RequestTiming]:
    """Make ``timing`` the current request's for the code run inside (and the threads it starts)."""
    return bound(_current, timing)


def note_queued() -> None:
    """Note that the current request's job entered the engine's queue (its first one counts)."""
    timing = _current.get()
    if timing is not None and timing.queued is None:
        timing.queued = time.perf_counter()
