"""What one connection may hold: abandoned requests dropped, a header-read timeout, a connection limit.

* :class:`AbandonedRequestMiddleware` notices a client that disconnects before its answer, cancels
  the request's handler (so its job leaves the batcher's queue unscored) and marks the request
  abandoned (so it is not tokenized once it reaches the tokenizer: :mod:`genscore_core.request_life`).
* :func:`uvicorn_options` turns :class:`~genscore_core.server.ServerLimits` into uvicorn's settings:
  the connection limit (``limit_concurrency``), the keep-alive timeout and an HTTP protocol with a
  header-read timeout, which uvicorn's h11 protocol lacks: a connection that has not sent a whole
  request head within ``header_timeout_s`` of opening (or of the first byte of a later request) is
  closed. An idle kept-alive connection is closed by the keep-alive timeout alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from genscore_core.request_life import AbandonStats, RequestLife, living
from genscore_core.server.limits import ServerLimits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AbandonedRequestMiddleware:
    """Cancel the handling of a POST whose client disconnects before the answer is sent."""

    def __init__(self, app: ASGIApp, stats: AbandonStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        life = RequestLife(self.stats)
        body_read = asyncio.Event()
        answered = False

        async def tracking_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                if not body_read.is_set():
                    body_read.set()
                    self.stats.add("in_flight")
            elif message["type"] == "http.disconnect":
                life.abandoned.set()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        with living(life):  # the handler task and its worker threads inherit the context
            handler = asyncio.ensure_future(self.app(scope, tracking_receive, tracking_send))

        async def watch() -> None:
            # Only once the app has read the body is receive() free to wait for the disconnect.
            await body_read.wait()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
            if not answered:
                life.abandoned.set()
                handler.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await handler
        except asyncio.CancelledError:
            if not life.abandoned.is_set():
                raise  # the server is shutting down, not the client
        except Exception:
            if not life.abandoned.is_set():
                raise
            # Reading the body of a request whose client left fails; there is nobody to answer.
        finally:
            watcher.cancel()
            if life.abandoned.is_set() and not answered:
                self.stats.add("abandoned")
            if body_read.is_set():
                self.stats.add("in_flight", -1)


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head is not complete in ``seconds``."""

    class HeaderTimeoutProtocol(H11Protocol):
        # True once an answer is complete: the next request head's clock starts at its first byte.
        # Until then the connection is idle, and how long it may stay idle is the keep-alive
        # timeout's business: a deadline counted from the answer would close idle connections at
        # ``seconds`` whatever the keep-alive timeout says, under clients that may reuse them.
        _head_clock_pending = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_clock_pending = True

        def data_received(self, data: bytes) -> None:
            # A cycle still answering (a pipelined request) is not waiting for a head.
            if self._head_clock_pending and (self.cycle is None or self.cycle.response_complete):
                self._head_clock_pending = False
                self._arm_header_timer()
            super().data_received(data)

        def _arm_header_timer(self) -> None:
            cycle = self.cycle
            self.loop.call_later(seconds, self._header_deadline, cycle)

        def _header_deadline(self, cycle_at_arming: Any) -> None:
            # A new cycle means a request head arrived in time; the same one, that none did.
            if self.cycle is cycle_at_arming and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` that enforce ``limits``."""
    return {
        # uvicorn answers 503 once its open connections reach limit_concurrency, the new one included.
        "limit_concurrency": limits.max_connections + 1,
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "http": header_timeout_protocol(limits.header_timeout_s),
    }
