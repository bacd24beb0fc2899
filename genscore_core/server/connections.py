"""What one connection may hold: abandoned requests dropped, a header-read timeout, a connection limit.

* :class:`AbandonedRequestMiddleware` notices a client that disconnects before its answer, cancels
  the request's handler (so its job leaves the batcher's queue unscored) and marks the request
  abandoned (so it is not tokenized once it reaches the tokenizer: :mod:`genscore_core.request_life`).
* :func:`uvicorn_options` turns :class:`~genscore_core.server.ServerLimits` into uvicorn's settings:
  the keep-alive timeout and an HTTP protocol (:func:`header_timeout_protocol`) with what uvicorn's
  h11 protocol lacks:

  - a header-read timeout: a connection that has not sent a whole request head within
    ``header_timeout_s`` of opening (or of the first byte of a later request) is closed. An idle
    kept-alive connection is closed by the keep-alive timeout alone.
  - a connection limit that sheds only the excess. uvicorn's ``limit_concurrency`` counts every open
    connection, idle ones included, and refuses a request whenever the count is over: 1,000 clients
    connecting at once all got 503, and 700 idle sockets made every request 503. Here the limit
    counts requests in progress (one per connection in HTTP/1.1): the first ``max_connections`` are
    served, later ones get 503 with ``Retry-After`` while they last. Open connections, idle ones
    included, are capped at twice the limit (file descriptors); a connection opening at the cap
    closes the connection idle longest (idle at least :data:`IDLE_GRACE_S`: never a client that just
    connected and is sending its request), or, with none, is itself answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from genscore_core.request_life import AbandonStats, RequestLife, living
from genscore_core.server.limits import ServerLimits
from genscore_core.server.schemas import error_body

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


# A connection idle for less than this is not closed to make room: a client that has just connected
# (or just been answered) sends its request within milliseconds, and closing it would drop a request
# that the limit lets in; an idle socket held open on purpose is older.
IDLE_GRACE_S = 1.0

_RETRY_AFTER_S = 1


def _busy_message(max_connections: int) -> str:
    return (
        f"the server is serving its limit of {max_connections} requests at once (--max-connections); "
        f"retry after {_RETRY_AFTER_S} s"
    )


def _busy_answer(max_connections: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of the 503 for a request beyond the limit: the protocol's error body, a
    ``Retry-After``, and ``Connection: close`` so that a refused client holds no connection."""
    body = json.dumps(error_body(_busy_message(max_connections), 503)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(_RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


def _is_idle(connection: H11Protocol) -> bool:
    """No request in progress and none begun: a fresh connection, or a kept-alive one between requests."""
    cycle = connection.cycle
    return (cycle is None or cycle.response_complete) and not connection.conn.trailing_data[0]


def header_timeout_protocol(seconds: float, max_connections: int | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head is not complete in ``seconds``
    and, with ``max_connections``, serving that many requests at once and answering 503 to the excess
    (see the module's docstring)."""

    # Shared by the connections of one server (each call makes a class for one server).
    in_progress = 0
    opened_at: dict[H11Protocol, float] = {}  # connection -> when it opened or was last answered

    class HeaderTimeoutProtocol(H11Protocol):
        # True once an answer is complete: the next request head's clock starts at its first byte.
        # Until then the connection is idle, and how long it may stay idle is the keep-alive
        # timeout's business: a deadline counted from the answer would close idle connections at
        # ``seconds`` whatever the keep-alive timeout says, under clients that may reuse them.
        _head_clock_pending = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if max_connections is not None:
                self.app = _admitting(self.app, max_connections)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_timer()
            if max_connections is not None:
                opened_at[self] = self.loop.time()
                if len(self.connections) > 2 * max_connections:
                    self._make_room(max_connections)

        def connection_lost(self, exc: Exception | None) -> None:
            opened_at.pop(self, None)
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_clock_pending = True
            if self in opened_at:
                opened_at[self] = self.loop.time()

        def _make_room(self, limit: int) -> None:
            now = self.loop.time()
            idle = [
                (since, other)
                for other, since in opened_at.items()
                if other is not self and now - since >= IDLE_GRACE_S and _is_idle(other)
            ]
            if idle:
                # Never-used connections first (an idle socket held open), then the longest idle.
                _, oldest = min(idle, key=lambda entry: (entry[1].cycle is not None, entry[0]))
                oldest.transport.close()
                return
            headers, body = _busy_answer(limit)
            head = b"HTTP/1.1 503 Service Unavailable\r\n" + b"".join(
                k + b": " + v + b"\r\n" for k, v in headers
            )
            self.transport.write(head + b"\r\n" + body)
            self.transport.close()

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

    def _admitting(app: Any, limit: int) -> Any:
        """``app`` behind the request limit: a request beyond ``limit`` in progress gets a 503."""

        async def admitted(scope: Scope, receive: Receive, send: Send) -> None:
            nonlocal in_progress
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if in_progress >= limit:
                headers, body = _busy_answer(limit)
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            in_progress += 1
            try:
                await app(scope, receive, send)
            finally:
                in_progress -= 1

        return admitted

    return HeaderTimeoutProtocol


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` that enforce ``limits``."""
    return {
        # Not uvicorn's limit_concurrency: it counts idle connections and refuses everyone once over.
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "http": header_timeout_protocol(limits.header_timeout_s, limits.max_connections),
    }
