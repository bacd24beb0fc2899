"""A hold on the engine's forward pass that only a coroutine on the event loop can lift.

Async tests use it to show that scoring leaves the event loop free without counting ticks or timing
anything: the forward waits at the gate, and a coroutine on the loop opens it once told that the
forward has begun. Had the forward run on the loop's thread, the loop could not run that coroutine,
the gate would stay shut and the forward would raise once its guard ran out.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

from genscore_core import GenerativeScorer


class ModelGate:
    """Hold ``scorer``'s forward pass until :meth:`open_once_entered` opens the gate; a context manager."""

    def __init__(self, scorer: GenerativeScorer, guard_s: float = 30.0) -> None:
        self.entered = asyncio.Event()
        """Set on the loop once the forward has begun."""
        self.thread_ids: set[int] = set()
        """The threads the forward ran on."""
        self._open = threading.Event()
        self._forward = scorer.engine.forward
        loop = asyncio.get_running_loop()
        original = self._forward.last_hidden_states

        def held(*args: Any, **kwargs: Any) -> Any:
            self.thread_ids.add(threading.get_ident())
            loop.call_soon_threadsafe(self.entered.set)
            if not self._open.wait(guard_s):
                raise TimeoutError("the event loop made no progress while the model ran")
            return original(*args, **kwargs)

        self._forward.last_hidden_states = held  # type: ignore[method-assign]

    async def open_once_entered(self) -> None:
        await self.entered.wait()
        self._open.set()

    def __enter__(self) -> ModelGate:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._open.set()
        del self._forward.last_hidden_states
