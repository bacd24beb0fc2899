"""The base of the server's own ASGI middlewares, which act on HTTP requests only."""

from __future__ import annotations

from genscore_core.server.connections import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """An ASGI middleware whose work is :meth:`handle`, for HTTP requests; other scopes (lifespan,
    websocket) go straight to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError
