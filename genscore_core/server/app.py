"""The FastAPI application of ``genscore serve``.

Endpoints:

* ``POST /generative_scoring`` (and ``/generative_score``): the generative scoring protocol, answered
  as vLLM's endpoint answers it (the same request, response and error bodies, but that genscore's
  errors fill ``param``);
* ``POST /v1/rerank`` (and ``/rerank``, ``/v2/rerank``): ``query``, ``documents``, ``top_n`` in;
  ``results`` of ``index``, ``relevance_score`` and, with ``return_documents``, ``document`` out,
  with vLLM's ``usage`` and Cohere's ``meta``;
* ``POST /rerank`` with ``texts``: TEI's dialect (:mod:`~genscore_core.server.tei`);
  ``POST /v1/ranking``: NIM's (:mod:`~genscore_core.server.nim`); ``POST /score`` and ``/v1/score``:
  vLLM's (:mod:`~genscore_core.server.vllm_score`). Each rerank and score route takes a request's
  own ``instruction`` (:mod:`~genscore_core.server.served`);
* ``GET /health``, ``GET /v1/models``, ``GET /stats`` (batching counters), ``GET /metrics`` (the same
  and per-route counters in Prometheus' text format: :mod:`genscore_core.server.metrics`).

Errors use the protocol's body ``{"error": {"message", "type", "param", "code"}}`` plus a top-level
``detail`` with the same message (what Jina-style clients read); ``param`` names the offending field,
dotted to its entry (``"documents.3"``), or is null where no one field is at fault. 400 for bad requests and exceeded
limits, 401 for a request without the server's API key (``--api-key``; every path but ``/health`` and the
API description), 404 for a model this server does not serve (as vLLM answers), 408 for a body that does not
arrive within ``--body-timeout`` (the connection is then closed), 413 for oversized bodies, 422
for malformed ones, 503 when the queue is full (with ``Retry-After``), 502 (504 for a timeout) when
the server this one scores through (``--server-url``) fails, 500 for a score the model made NaN or
out of range (naming the prompt) and for anything unexpected (logged, never a traceback in the
body). The OpenAPI document (``/openapi.json``) lists each of them per endpoint with this body.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

try:
    from fastapi import FastAPI, Request, Response
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from fastapi.routing import APIRoute
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.middleware import Middleware
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'genscore\'s server needs fastapi and uvicorn; install them with: pip install "genscore[server]"'
    ) from exc

from genscore_core import __version__, strict_json
from genscore_core.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    InvalidRequestError,
    RemoteConfigurationError,
    RemoteScoringError,
    ScoreRangeError,
    ServerBusyError,
    ServerHTTPError,
)
from genscore_core.protocol import GenerativeScoringRequest, GenerativeScoringResponse
from genscore_core.request_life import AbandonStats, RequestAbandoned
from genscore_core.scorer import GenerativeScorer
from genscore_core.server.batcher import RequestBatcher
from genscore_core.server.connections import AbandonedRequestMiddleware
from genscore_core.server.direct_route import DirectEndpoint, DirectRoutes, DirectRouteTable
from genscore_core.server.limits import ServerLimits
from genscore_core.server.metrics import METRICS_CONTENT_TYPE, MetricsMiddleware, ServerMetrics, count_usage
from genscore_core.server.middleware import HttpMiddleware
from genscore_core.server.nim import add_nim_routes
from genscore_core.server.schemas import (
    ApiVersion,
    BilledUnits,
    ErrorResponse,
    HealthStatus,
    MetaTokens,
    ModelCard,
    ModelList,
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    api_key_problem,
    error_body,
    rerank_request_type,
)
from genscore_core.server.served import Served, refuse_protocol_instruction, request_instruction
from genscore_core.server.tei import TeiRank, TeiRerankRequest, rerank_body_type, tei_rerank
from genscore_core.server.vllm_score import add_score_routes
from genscore_core.waiting import within

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


PARSED_OFF_THE_LOOP_BYTES = 1 << 20
"""Request bodies at least this large are parsed on a worker thread: a body of many small objects
parses at a few MB/s, seconds during which the event loop would answer no other request."""


class _StrictJsonRequest(Request):
    """A request whose JSON body is refused when one of its objects repeats a key."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            # NaN and Infinity are the body schemas' to refuse, naming the field.
            if len(body) >= PARSED_OFF_THE_LOOP_BYTES:
                self._json = await asyncio.to_thread(strict_json.loads, body, standard_numbers=False)
            else:
                self._json = strict_json.loads(body, standard_numbers=False)
        return self._json


class StrictJsonRoute(APIRoute):
    """The app's routes: FastAPI parses their bodies through :class:`_StrictJsonRequest`.

    (Its parsing errors other than invalid JSON become a 400 "There was an error parsing the body"
    caused by the error, which :func:`_unreadable_body` turns into a 422 naming the problem.)
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def strict_json_handler(request: Request) -> Response:
            return await handle(_StrictJsonRequest(request.scope, request.receive))

        return strict_json_handler


def _error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entries of the error answers an endpoint gives, each with the real error body."""
    reasons = {
        400: "A bad request (the message names the field and item) or an exceeded limit.",
        401: "The server was started with an API key (--api-key) and the request did not send it as "
        "Authorization: Bearer <key>.",
        404: "The request names a model this server does not serve.",
        408: "The request body did not arrive within --body-timeout (the connection is closed).",
        413: "The request body is larger than --max-body-bytes.",
        422: "The body is not valid JSON or does not have the request's shape.",
        500: "The model produced a score that is not finite or out of range (the message names the "
        "prompt), or an unexpected error (logged by the server; no traceback in the body).",
        502: "The server this one scores through (--server-url) failed or answered something unreadable.",
        504: "The server this one scores through (--server-url) did not answer within its timeout.",
        503: "The request queue is full; retry after the seconds in Retry-After.",
    }
    responses: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        responses[code] = {"model": ErrorResponse, "description": reasons[code]}
        if code == 503:
            responses[code]["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "string"},
                }
            }
    return responses


# What the scoring endpoints can answer besides 200; a server scoring through another adds the
# gateway errors (GATEWAY_ERRORS).
SCORING_ERRORS = _error_responses(400, 404, 408, 413, 422, 500, 503)
GATEWAY_ERRORS = _error_responses(502, 504)
# What every endpoint but /health can answer on a server with an API key.
AUTH_ERRORS = _error_responses(401)

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Paths answered without the API key: load balancers check /health without credentials, and the API's
description (no model, no traffic) stays readable. Everything else, /stats included, needs the key."""


class ApiKeyMiddleware(HttpMiddleware):
    """Answer 401 to a request without ``Authorization: Bearer <api_key>``, before anything reads its
    body: an unauthenticated request reaches neither the tokenizer nor the engine, and is not counted.

    The key is compared in constant time (:func:`hmac.compare_digest`), so the time of a refusal
    does not tell how much of a guessed key was right.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        super().__init__(app)
        self.api_key = api_key.encode()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = None if scope.get("path") in OPEN_PATHS else self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            error_body(refusal, 401), status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused, or None when it sent the key."""
        sent = [value for name, value in scope.get("headers") or [] if name.lower() == b"authorization"]
        if not sent:
            return (
                "this server requires an API key: send it as Authorization: Bearer <key> "
                "(the key genscore serve was started with, --api-key or GENSCORE_API_KEY)"
            )
        scheme, _, token = sent[0].strip().partition(b" ")
        if len(sent) > 1 or scheme.lower() != b"bearer" or not token.strip():
            return "the Authorization header must be one 'Bearer <key>'"
        if not hmac.compare_digest(token.strip(), self.api_key):
            return "the API key sent (Authorization: Bearer) is not this server's"
        return None


class BodySizeLimitMiddleware(HttpMiddleware):
    """Answer 413 to a body over ``max_bytes``: at once from ``Content-Length``, else while reading it;
    answer 408 to a body not complete within ``timeout`` seconds of the request's head.

    (uvicorn bounds the head, through the header timeout of :mod:`~genscore_core.server.connections`,
    but not the body: a client that stops sending mid-body would hold its connection forever.)
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            error = BodyTooLargeError(self.max_bytes, int(declared))
            response = JSONResponse(error_body(error.detail, 413), status_code=413)
            await response(scope, receive, send)
            return
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        body_complete = False

        async def limited_receive() -> Message:
            nonlocal received, body_complete
            if body_complete:  # later calls wait for a disconnect, which has no deadline
                return await receive()
            try:
                # Not asyncio.wait_for: a cancellation (the client left) just as the body arrives
                # would be lost on Python < 3.12, and the request handled for nobody (waiting.py).
                message = await within(receive(), deadline - loop.time())
            except asyncio.TimeoutError:
                raise BodyTimeoutError(self.timeout) from None
            if message["type"] == "http.request":
                body_complete = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI wraps it in a 400 HTTPException; the handler answers the 413 it caused.
                    raise BodyTooLargeError(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


class InternalErrorMiddleware(HttpMiddleware):
    """Answer an unexpected exception with a 500 error body, and keep the connection usable.

    (An ``Exception`` handler would run in Starlette's outermost middleware, which re-raises after
    answering, and the server then drops the keep-alive connection the client is reusing.)
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except RequestAbandoned:
            # The client went away (the request's life says so): nobody to answer, nothing wrong.
            # AbandonedRequestMiddleware, outside, counts it; logging it here as an error put a
            # traceback in the server log for an ordinary disconnect.
            raise
        except Exception as error:
            # The body names the kind of failure (OutOfMemoryError, RuntimeError) and an id that finds
            # its traceback in the server log; not the error's text, which can hold paths and internals.
            error_id = uuid.uuid4().hex[:12]
            logger.exception(
                "unexpected error %s answering %s %s", error_id, scope.get("method"), scope.get("path")
            )
            if started:
                raise
            message = (
                f"internal server error: {type(error).__name__} (error id {error_id}; the server log has "
                "the details)"
            )
            body = error_body(message, 500)
            await JSONResponse(body, status_code=500)(scope, receive, send)


def create_app(
    scorer: GenerativeScorer,
    limits: ServerLimits | None = None,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The server application for one scorer.

    Args:
        scorer: Scores the requests (its template and ``max_length`` apply to the rerank and score routes,
            its instruction to those that do not send their own).
        limits: Request limits and batching settings.
        served_model_name: The model name answered in responses and ``/v1/models``; default the
            scorer's model.
        api_key: When given, every path but ``/health`` and the API description (:data:`OPEN_PATHS`)
            answers 401 unless the request sends ``Authorization: Bearer <api_key>``.
    """
    if api_key is not None and (problem := api_key_problem(api_key)) is not None:
        raise ValueError(f"api_key: {problem}")
    limits = limits or ServerLimits()
    name = served_model_name or scorer.config.model
    started = int(time.time())
    batcher = RequestBatcher(
        scorer.backend,
        max_batch_tokens=limits.batch_max_tokens,
        max_wait_ms=limits.batch_max_wait_ms,
        max_queued=limits.max_queued_requests,
        max_request_tokens=limits.max_prompt_tokens_per_request,
        max_waited_batches=limits.batch_max_waited,
        preparing=(lambda: scorer.front_end.tokenizing) if limits.batch_wait == "tokenizing" else None,
        batch_tokens=limits.forward_batch_tokens,
    )
    # The scorer's own front end over the batcher: every endpoint answers through the library's
    # ascore/arerank, and only the scoring is shared between concurrent requests.
    serving = GenerativeScorer(front_end=scorer.front_end, backend=batcher)
    serving.result_cache = scorer.result_cache  # one cache (or none) for the scorer and its server

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="genscore", version=__version__, lifespan=lifespan)
    app.router.route_class = StrictJsonRoute
    app.state.scorer = scorer
    app.state.batcher = batcher
    app.state.limits = limits
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=limits.max_body_bytes, timeout=limits.body_timeout_s
    )
    # Outermost: a request whose client left is cancelled wherever it is, and not tokenized after.
    abandon_stats = AbandonStats()
    app.state.abandon_stats = abandon_stats
    app.add_middleware(AbandonedRequestMiddleware, stats=abandon_stats)
    # Outside that: a request whose client left is counted, with its time, under status 499.
    metrics = ServerMetrics(batcher, abandon_stats, lambda: serving.result_cache)
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=app.router.routes)
    if api_key is not None:
        # Outside even that: a request without the key is no request of this server's to count.
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    _add_error_handlers(app)
    auth_errors = AUTH_ERRORS if api_key is not None else {}

    errors = {
        **SCORING_ERRORS,
        **auth_errors,
        **(GATEWAY_ERRORS if scorer.config.server is not None else {}),
    }
    served = Served(serving, name, limits, errors)
    app.state.served = served
    scoring: dict[str, Any] = {"response_model": GenerativeScoringResponse, "responses": errors}

    @app.post("/generative_scoring", **scoring)
    @app.post("/generative_score", **scoring)
    async def generative_scoring(
        request: GenerativeScoringRequest, http_request: Request
    ) -> GenerativeScoringResponse:
        count_usage(pairs=len(request.items))
        refuse_protocol_instruction(await http_request.json())
        served.check_model(request.model)
        served.check_items(len(request.items), "items")
        if request.model is None:
            request = request.model_copy(update={"model": name})
        response = await serving.ascore(request)
        count_usage(prompt_tokens=response.usage.prompt_tokens)
        return response

    reranking: dict[str, Any] = {
        "response_model": RerankResponse,
        "response_model_exclude_none": True,
        "responses": errors,
    }
    # The body's type carries the range of score_threshold, a score of the server's mode: a
    # logit-mode server takes any finite logit, and its OpenAPI schema says so.
    rerank_request = rerank_request_type(serving.score_mode)

    async def cohere_rerank(request: RerankRequest, api_version: str) -> RerankResponse:
        served.check_model(request.model)
        ranked = await served.rerank(
            request.query,
            request.texts(),
            instruction=request_instruction(request.instruction, request.instruct),
            top_n=request.top_n or None,
            score_threshold=request.score_threshold,
            max_tokens_per_doc=request.max_tokens_per_doc,
        )
        tokens = ranked.prompt_tokens
        results = [
            RerankResult(
                index=result.index,
                relevance_score=result.score,
                window=result.window,
                document=RerankDocument(text=result.document) if request.return_documents else None,
            )
            for result in ranked
        ]
        return RerankResponse(
            model=request.model or name,
            results=results,
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            meta=RerankMeta(
                api_version=ApiVersion(version=api_version),
                billed_units=BilledUnits(search_units=1),
                tokens=MetaTokens(input_tokens=tokens),
            ),
            score_mode=serving.score_mode,
        )

    async def rerank_v1(request: RerankRequest) -> RerankResponse:
        return await cohere_rerank(request, "1")

    async def rerank_v2(request: RerankRequest) -> RerankResponse:
        return await cohere_rerank(request, "2")

    rerank_v1.__annotations__["request"] = rerank_v2.__annotations__["request"] = rerank_request
    app.post("/v2/rerank", **reranking)(rerank_v2)
    app.post("/v1/rerank", **reranking)(rerank_v1)
    # The same two answered without FastAPI's routing where the body needs nothing of it (a lone
    # request's latency); FastAPI still answers every other body, and documents both.
    direct = DirectRouteTable(
        {
            "/v1/rerank": DirectEndpoint(rerank_request, rerank_v1),
            "/v2/rerank": DirectEndpoint(rerank_request, rerank_v2),
        }
    )
    app.state.direct_routes = direct
    # Appended: innermost of the app's middlewares, so that every one of them still applies.
    app.user_middleware.append(
        Middleware(
            DirectRoutes,
            table=direct,
            handlers=lambda: app.exception_handlers,
            largest_body=lambda: PARSED_OFF_THE_LOOP_BYTES,
        )
    )

    # /rerank is both Cohere's path and TEI's: the body says which (tei.rerank_dialect).
    either_body = rerank_body_type(rerank_request)

    async def rerank(request: RerankRequest | TeiRerankRequest) -> RerankResponse | list[TeiRank]:
        if isinstance(request, TeiRerankRequest):
            return await tei_rerank(served, request)
        return await cohere_rerank(request, "1")

    rerank.__annotations__["request"] = either_body
    app.post(
        "/rerank",
        response_model=RerankResponse | list[TeiRank],
        response_model_exclude_none=True,
        responses=errors,
    )(rerank)

    add_nim_routes(app, served)
    add_score_routes(app, served)

    @app.get(
        "/health",
        response_model=HealthStatus,
        responses={503: {"model": HealthStatus, "description": "Not serving: starting or shutting down."}},
    )
    async def health() -> JSONResponse:
        if not batcher.running:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    # HEAD too (the same status, no body): uptime monitors and some balancers send it, and got 405.
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/v1/models", response_model=ModelList, responses=auth_errors)
    async def models() -> ModelList:
        card = ModelCard(id=name, created=started, root=scorer.config.model, max_model_len=scorer.max_length)
        return ModelList(data=[card])

    @app.get("/stats", responses=auth_errors)
    async def stats() -> dict[str, Any]:
        counters = batcher.stats
        return {
            "queued": batcher.queued,
            "requests": counters.requests,
            "batches": counters.batches,
            "largest_batch": counters.largest_batch,
            "shared_batches": counters.shared_batches,
            "failures": counters.failures,
            "batch_sizes": {str(size): n for size, n in sorted(counters.batch_sizes.items())},
            "waited_batches": {str(k): n for k, n in sorted(counters.waited_batches.items())},
            "engine_seconds": round(counters.engine_seconds, 6),
            "prepared_ahead": counters.prepared_ahead,
            "forward": forward_counters(scorer.backend),
            "in_flight": abandon_stats.in_flight,
            "waiting_to_tokenize": scorer.front_end.tokenizer_waiting,
            "tokenized_requests": abandon_stats.tokenized,
            "abandoned": abandon_stats.abandoned,
            "abandoned_untokenized": abandon_stats.skipped,
            "gc": garbage_collector_counters(),
            "result_cache": None if serving.result_cache is None else serving.result_cache.stats().as_dict(),
        }

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus' text format."}, **auth_errors},
    )
    async def prometheus_metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    return app


def garbage_collector_counters() -> dict[str, Any]:
    """The objects frozen out of garbage collection (``genscore serve`` freezes what it loaded
    before serving, as Ray Serve does in its replicas; 0 in an app served otherwise) and the collections run so far per generation
    (a full one, generation 2, walks every tracked object not frozen)."""
    return {
        "frozen_objects": gc.get_freeze_count(),
        "collections": [generation["collections"] for generation in gc.get_stats()],
    }


def forward_counters(backend: object) -> dict[str, int] | None:
    """How a local engine's forward batches ran: eagerly, or as CUDA graph replays (the graphs
    captured when the model loaded); None for a backend without a packed forward."""
    forward = getattr(backend, "forward", None)
    eager = getattr(forward, "eager_batches", None)
    if eager is None:
        return None
    graphs = getattr(forward, "graphs", None)
    return {
        "eager_batches": int(eager),
        "graph_replays": int(getattr(graphs, "replays", 0)),
        "graph_captures": int(getattr(graphs, "captures", 0)),
    }


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequestError)
    async def bad_request(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, InvalidRequestError)
        return JSONResponse(error_body(error.message, 400, _request_param(error)), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        if isinstance(error.body, bytes) and error.body:
            # FastAPI parses JSON only under a JSON content type and hands anything else over as
            # bytes (unparsed), which pydantic then calls "not a valid dictionary": say what to fix.
            sent = request.headers.get("content-type") or "none"
            message = (
                f"the request body was sent with Content-Type: {sent}; send it as JSON with "
                "Content-Type: application/json (curl: -H 'Content-Type: application/json')"
            )
            return JSONResponse(error_body(message, 422), status_code=422)
        body = error_body(_describe_validation(error), 422, _validation_param(error))
        return JSONResponse(body, status_code=422)

    @app.exception_handler(ServerBusyError)
    async def busy(_: Request, error: Exception) -> JSONResponse:
        return JSONResponse(error_body(str(error), 503), status_code=503, headers={"Retry-After": "1"})

    # A server scoring through another (--server-url): that server's failures are the gateway's.
    @app.exception_handler(RemoteScoringError)
    async def upstream_failed(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RemoteScoringError)
        logger.warning("scoring through the upstream server failed: %s", error)
        status = 504 if error.timed_out else 502
        return JSONResponse(error_body(str(error), status), status_code=status)

    @app.exception_handler(RemoteConfigurationError)
    async def upstream_refused(_: Request, error: Exception) -> JSONResponse:
        # The upstream refused this server's own settings (key, URL): not the client's to fix.
        logger.error("the upstream server refused this server's settings: %s", error)
        return JSONResponse(error_body(str(error), 502), status_code=502)

    @app.exception_handler(ScoreRangeError)
    async def bad_score(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ScoreRangeError)
        # The operator has to see it too: a model scoring NaN needs other weights or precision.
        logger.error("%s", error)
        param = (
            f"{error.param}.{error.index}" if error.param is not None and error.index is not None else None
        )
        return JSONResponse(error_body(str(error), 500, param), status_code=500)

    @app.exception_handler(ServerHTTPError)
    async def server_http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ServerHTTPError)
        return _http_answer(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        if isinstance(error.__cause__, ServerHTTPError):  # FastAPI wrapped one raised as it read the body
            return _http_answer(error.__cause__)
        unreadable = _unreadable_body(error)
        if unreadable is not None:
            return JSONResponse(error_body(unreadable, 422), status_code=422)
        return _http_answer(error)


def _http_answer(error: StarletteHTTPException | ServerHTTPError) -> JSONResponse:
    return JSONResponse(
        error_body(str(error.detail), error.status_code, getattr(error, "param", None)),
        status_code=error.status_code,
        headers=getattr(error, "headers", None),
    )


def _unreadable_body(error: StarletteHTTPException) -> str | None:
    """What is wrong with a JSON body FastAPI could not parse for a reason other than its syntax.

    FastAPI answers those with a bare 400 "There was an error parsing the body"; they are malformed
    bodies (422, as invalid JSON is), and the client needs to know which fix applies.
    """
    cause = error.__cause__
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return (
            f"the request body is not valid {cause.encoding} text: byte 0x{byte} at position "
            f"{cause.start} ({cause.reason}); send JSON encoded as UTF-8"
        )
    if isinstance(cause, RecursionError):
        return "the request body nests JSON arrays or objects too deeply to be read"
    if isinstance(cause, strict_json.RepeatedKeyError):
        return (
            f"the request body has the key {json.dumps(cause.key)} twice in one object; send each key "
            "once (JSON parsers differ on which copy counts)"
        )
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        # Python reads at most sys.get_int_max_str_digits() digits (4300 by default) of an integer.
        return f"the request body holds a number of more than {sys.get_int_max_str_digits()} digits"
    return None


def _describe_validation(error: RequestValidationError) -> str:
    parts = []
    for entry in error.errors():
        if entry.get("type") == "missing" and tuple(entry.get("loc", ())) == ("body",):
            parts.append("the request body is empty; send a JSON object")
            continue
        if entry.get("type") == "json_invalid":
            reason = (entry.get("ctx") or {}).get("error", "JSON decode error")
            parts.append(f"the request body is not valid JSON: {reason}")
            continue
        location = ".".join(_body_location(entry, error.body))
        message = entry.get("msg", "invalid")
        parts.append(f"{location}: {message}" if location else message)
    return "; ".join(parts) or "invalid request body"


# The request fields whose entries an error's ``index`` counts; for another field (``query``) the
# index is the document or item that field left no room for, not an entry of the field.
_LISTED_FIELDS = frozenset({"items", "documents", "label_token_ids", "texts", "passages", "text_2"})


def _request_param(error: InvalidRequestError) -> str | None:
    """The ``param`` of a 400: the field, dotted to its offending entry (``"documents.3"``)."""
    if error.param is not None and error.index is not None and error.param in _LISTED_FIELDS:
        return f"{error.param}.{error.index}"
    return error.param


def _validation_param(error: RequestValidationError) -> str | None:
    """The ``param`` of a 422: where in the body the first problem is (``"documents.0.text"``).

    Of the problems pydantic reports at or under that place (one per union member it tried), the
    deepest is named: a document object without ``text`` is ``documents.0.text``, not ``documents.0``.
    None for a body that is not JSON or not an object.
    """
    entries = error.errors()
    if not entries or entries[0].get("type") == "json_invalid":
        return None
    locations = [_body_location(entry, error.body) for entry in entries]
    first = locations[0]
    deepest = max((where for where in locations if where[: len(first)] == first), key=len)
    return ".".join(deepest) or None


def _body_location(entry: Mapping[str, Any], body: Any) -> list[str]:
    """A validation error's place in the body sent, as field names and list positions.

    Pydantic's locations also name each union member a value was tried as (``documents.0.str``,
    ``documents.0.RerankDocument.text``); only the parts that exist in the body are kept, and the
    name of a missing field, so the location names the client's own data.
    """
    location = list(entry.get("loc", ()))
    if location[:1] == ["body"]:
        location = location[1:]
    node: Any = body
    path: list[str] = []
    for position, part in enumerate(location):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif position == len(location) - 1 and entry.get("type") == "missing":
            node = None
        else:
            continue  # a union member's name, not a place in the body
        path.append(str(part))
    return path
