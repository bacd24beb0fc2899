"""Waiting with a deadline without losing a cancellation.

``asyncio.wait_for`` before Python 3.12 swallows the cancellation of the task awaiting it when the
awaited thing has finished but ``wait_for`` has not yet been woken (CPython gh-86296): the task gets
the result instead of ``CancelledError`` and carries on as if nobody had cancelled it. In the server
that let a request whose client had just left (cancelled as its last body bytes arrived) go on to the
tokenizer, which refused it with ``RequestAbandoned``; and it could let the batcher's worker miss the
cancellation that stops it. The async remote clients bound each attempt the same way, so a call
cancelled just as its answer arrived went on (a gateway ``genscore serve --server-url`` would score
for a client that had left). :func:`within` waits through ``asyncio.wait``, which always passes a
cancellation on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(work: Awaitable[T], seconds: float) -> T:
    """``work``'s result, or ``asyncio.TimeoutError`` (``work`` cancelled) if it takes more than
    ``seconds``; cancelling the caller cancels ``work`` and raises ``CancelledError``, always, even
    when ``work`` has just finished."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()
