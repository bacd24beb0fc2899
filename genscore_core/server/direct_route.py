"""A request that needs nothing of FastAPI's answered without it: the latency of a lone request.

FastAPI's routing and request handling (matching the path against every route, solving the endpoint's
dependencies, validating the body through them) cost about 0.3 ms of the event loop's CPU a request,
a sixth of it, and more of a lone client's latency (docs/benchmarks.md, "Server batching").
:class:`DirectRoutes` sits inside the app's own middlewares (API key, metrics, abandoned requests, body
size, internal errors: all still apply) and answers a POST to one of its paths itself, but only when
the body is JSON under a JSON content type, small enough to parse on the event loop, parses as
strict JSON and validates as the endpoint's request type. Anything else (another path or method, a
body that fails any of those) goes on to FastAPI with the body it sent, and is answered there as it
always was: every refusal comes from one place. An error raised while reading the body or by the
endpoint is answered by the app's exception handler for it, as FastAPI would, and an error without
one propagates to the middlewares outside.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from genscore_core import strict_json
from genscore_core.server.connections import ASGIApp, Message, Receive, Scope, Send

Endpoint = Callable[[Any], Awaitable[BaseModel]]
"""An endpoint's work on its validated body, returning the response model."""

Handler = Callable[[Request, Any], Response | Awaitable[Response]]
Handlers = dict[Any, Handler]


@dataclass(frozen=True)
class DirectEndpoint:
    """A POST path answered directly: its request type and its work."""

    request_type: type[BaseModel]
    endpoint: Endpoint


@dataclass
class DirectRouteTable:
    """The paths answered directly, and how many requests were (the rest went on to FastAPI)."""

    endpoints: dict[str, DirectEndpoint]
    answered: int = 0


class DirectRoutes:
    """ASGI middleware answering the POSTs to ``table``'s paths that need nothing of FastAPI, with the
    JSON of the response model without its ``None`` fields (the routes' ``response_model_exclude_none``).
    ``handlers`` gives the app's exception handlers when an error needs one."""

    def __init__(
        self,
        app: ASGIApp,
        table: DirectRouteTable,
        handlers: Callable[[], Handlers],
        largest_body: Callable[[], int],
    ) -> None:
        self.app = app
        self.table = table
        self.handlers = handlers
        self.largest_body = largest_body
        """The size from which bodies go on to FastAPI, whose route parses them off the event loop."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.table.endpoints.get(scope.get("path", "")) if scope["type"] == "http" else None
        if direct is None or scope.get("method") != "POST" or not _sends_json(scope):
            await self.app(scope, receive, send)
            return
        try:
            received = await _body_messages(receive)  # the body's limits raise here (413, 408)
        except Exception as error:
            await self._answer_error(error, scope, receive, send)
            return
        body = b"".join(message.get("body", b"") for message in received)
        whole = received[-1]["type"] == "http.request"  # else the client left while sending it
        request = _validated(direct.request_type, body) if whole and len(body) < self.largest_body() else None
        if request is None:
            await self.app(scope, _replaying(received, receive), send)
            return
        self.table.answered += 1
        try:
            answer = await direct.endpoint(request)
        except Exception as error:
            await self._answer_error(error, scope, receive, send)
            return
        response = Response(answer.model_dump_json(exclude_none=True), media_type="application/json")
        await response(scope, receive, send)

    async def _answer_error(self, error: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer ``error`` with the app's handler for it, or raise it to the middlewares outside."""
        handler = _handler_for(self.handlers(), error)
        if handler is None:
            raise error
        response = await _handled(handler, Request(scope, receive), error)
        await response(scope, receive, send)


def _sends_json(scope: Scope) -> bool:
    """The request's Content-Type is JSON (``application/json``, parameters allowed), as FastAPI
    requires before it parses a body as JSON."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


async def _body_messages(receive: Receive) -> list[Message]:
    """The messages of the request's body: up to its last part, or to a disconnect."""
    received = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return received


def _validated(request_type: type[BaseModel], body: bytes) -> BaseModel | None:
    """The body as ``request_type``, or None where strict JSON parsing or validation refuses it."""
    try:
        return request_type.model_validate(strict_json.loads(body, standard_numbers=False))
    except Exception:  # invalid, repeated keys, nested too deeply, the wrong shape: FastAPI's to answer
        return None


def _replaying(received: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives the messages already read first, in order, then what the connection sends."""
    pending = list(reversed(received))

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _handled(handler: Handler, request: Request, error: Exception) -> Response:
    """The handler's answer; a plain function's on a worker thread, as Starlette runs it."""
    if inspect.iscoroutinefunction(handler):
        return await cast(Awaitable[Response], handler(request, error))
    return cast(Response, await run_in_threadpool(handler, request, error))


def _handler_for(handlers: Handlers, error: Exception) -> Handler | None:
    """The app's handler of ``error`` as Starlette's exception middleware finds it: an HTTP error's
    status first, then its class or nearest base. None for a handler of ``Exception`` or of status
    500: those belong to the outermost middleware (Starlette's ServerErrorMiddleware), which answers
    the error once it has passed the app's own middlewares, as for an error raised through FastAPI."""
    if isinstance(error, HTTPException) and error.status_code != 500 and error.status_code in handlers:
        return handlers[error.status_code]
    for kind in type(error).__mro__:
        if kind is Exception:
            return None
        if kind in handlers:
            return handlers[kind]
    return None
