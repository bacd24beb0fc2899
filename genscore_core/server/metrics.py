"""``GET /metrics``: the server's counters in Prometheus' text format, through prometheus-client.

Each app has a registry of its own (:class:`ServerMetrics`), never prometheus-client's global one,
so that several servers in one process (tests, a Ray replica beside other code) count apart.

* Per request, by ``route`` (the path of the route it reached, ``"other"`` for none) and ``status``
  (the answer's HTTP status; ``"499"``, nginx's code, for a client that left before any answer):
  ``genscore_requests_total``, ``genscore_pairs_total`` (the documents or items the request asked
  to score), ``genscore_prompt_tokens_total`` (the tokens of the prompts built for it) and the
  latency histogram ``genscore_request_duration_seconds``. :class:`MetricsMiddleware` measures each
  request; the endpoints tell it their pairs and tokens with :func:`count_usage`.
* Per request scored by the engine, by ``route`` and ``stage``: the histogram
  ``genscore_request_stage_seconds``, its time split into the stages of
  :meth:`~genscore_core.request_timing.RequestTiming.stages` (prepare, tokenize, queue, inference,
  answer), noted by the tokenizer lock and the batcher in the request's
  :class:`~genscore_core.request_timing.RequestTiming`.
* Read when scraped (:class:`_ServerState`): the queue depth, requests in flight, the batcher's
  engine calls and their sizes (a histogram of jobs per call), engine seconds, failures, abandoned
  requests, and the result cache's hits, misses, evictions, entries and bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"genscore's /metrics needs prometheus-client 0.14 or later ({exc}); install it with: "
        'pip install "genscore[server]"'
    ) from exc

from genscore_core.request_life import AbandonStats
from genscore_core.request_timing import RequestTiming, timed
from genscore_core.result_cache import ResultCache
from genscore_core.server.connections import ASGIApp, Message, Receive, Scope, Send
from genscore_core.server.middleware import HttpMiddleware

if TYPE_CHECKING:
    from genscore_core.server.batcher import RequestBatcher

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The content type of :meth:`ServerMetrics.render`'s text (Prometheus' text exposition format)."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: a rerank of a few documents answers in milliseconds, a request of a thousand long ones
in seconds, and the scoring timeouts of clients are a minute or so."""

STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS)
"""Seconds: a lone request's queue and answer stages take tens of microseconds."""

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Jobs per engine call (a ``/v1/rerank`` request is one job, a request of several queries one per
query)."""

ABANDONED_STATUS = "499"
"""The ``status`` of a request whose client left before any answer (nginx's "client closed request")."""


@dataclass
class RequestUsage:
    """What one request asked for, as its endpoint reports it (:func:`count_usage`)."""

    pairs: int = 0
    prompt_tokens: int = 0


_usage: ContextVar[RequestUsage | None] = ContextVar("genscore_request_usage", default=None)


def count_usage(*, pairs: int = 0, prompt_tokens: int = 0) -> None:
    """Add to the pairs and prompt tokens of the request being answered (nothing outside one, or in
    an app without :class:`MetricsMiddleware`). An endpoint counts its pairs once it has read them
    (so that a refused request's are counted under its status) and its tokens once its prompts are
    built."""
    usage = _usage.get()
    if usage is not None:
        usage.pairs += pairs
        usage.prompt_tokens += prompt_tokens


class ServerMetrics:
    """The metrics of one app, in a registry of its own.

    Args:
        batcher: The app's batcher: its queue and counters are read when scraped.
        abandon_stats: The app's request counters (in flight, abandoned).
        result_cache: Gives the cache the app scores through (None: no cache), read when scraped.
    """

    def __init__(
        self,
        batcher: RequestBatcher,
        abandon_stats: AbandonStats,
        result_cache: Callable[[], ResultCache | None],
    ) -> None:
        self.registry = CollectorRegistry()
        labels = ("route", "status")
        self.requests = Counter("genscore_requests", "Requests answered.", labels, registry=self.registry)
        self.pairs = Counter(
            "genscore_pairs",
            "(query, document) pairs or protocol items the requests asked to score.",
            labels,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "genscore_prompt_tokens",
            "Tokens of the prompts built for the requests (templated and truncated).",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "genscore_request_duration_seconds",
            "Seconds from a request's arrival to the last byte of its answer.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stages = Histogram(
            "genscore_request_stage_seconds",
            "Seconds of a request scored by the engine in each stage: prepare (reading and checking "
            "the body, building prompts besides tokenizing, waiting for a thread or the tokenizer), "
            "tokenize (holding the tokenizer), queue (until its engine call began), inference (until "
            "its scores were on the host), answer (until the last byte of the answer).",
            ("route", "stage"),
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_ServerState(batcher, abandon_stats, result_cache))

    def observe(
        self, route: str, status: str, seconds: float, usage: RequestUsage, stages: Mapping[str, float] | None
    ) -> None:
        """Count one request answered (``stages``: its time by stage, for one the engine scored)."""
        self.requests.labels(route, status).inc()
        self.latency.labels(route, status).observe(seconds)
        if usage.pairs:
            self.pairs.labels(route, status).inc(usage.pairs)
        if usage.prompt_tokens:
            self.prompt_tokens.labels(route, status).inc(usage.prompt_tokens)
        for stage, stage_seconds in (stages or {}).items():
            self.stages.labels(route, stage).observe(stage_seconds)

    def render(self) -> bytes:
        """Every metric in Prometheus' text format (:data:`METRICS_CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class MetricsMiddleware(HttpMiddleware):
    """Time and count every HTTP request, by the route it reached and the status it got.

    ``routes`` are the app's (a route that matches the path names it; the request need not have
    reached it: a body refused as too large is counted under its route). An unknown path is counted
    as ``"other"``, so that arbitrary paths cannot grow the metrics without bound.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, routes: Sequence[Any]) -> None:
        super().__init__(app)
        self.metrics = metrics
        self.routes = routes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        route = self._route(scope)
        usage = RequestUsage()
        timing = RequestTiming(started)
        status = ABANDONED_STATUS
        counted = False

        def count() -> None:
            nonlocal counted
            if not counted:
                counted = True
                now = time.perf_counter()
                self.metrics.observe(route, status, now - started, usage, timing.stages(now))

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                count()  # before the last byte leaves: a client's next scrape sees this request
            await send(message)

        token = _usage.set(usage)
        try:
            with timed(timing):
                await self.app(scope, receive, counting_send)
        finally:
            _usage.reset(token)
            count()  # a request that ended without a whole answer (its client left, an error)

    def _route(self, scope: Scope) -> str:
        from starlette.routing import Match

        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(route.path)
            if match == Match.PARTIAL and partial is None:  # the path, with another method (405)
                partial = str(route.path)
        return partial or "other"


@dataclass(eq=False)  # the registry keys its collectors by identity
class _ServerState(Collector):
    """What the server holds now, read at each scrape: no counting on the scoring path."""

    batcher: RequestBatcher
    abandon_stats: AbandonStats
    result_cache: Callable[[], ResultCache | None]

    def collect(self) -> Iterator[Metric]:
        batcher = self.batcher
        counters = batcher.stats
        yield GaugeMetricFamily(
            "genscore_queue_depth", "Jobs waiting for an engine call.", value=batcher.queued
        )
        yield GaugeMetricFamily(
            "genscore_requests_in_flight",
            "Requests received in full and not yet answered.",
            value=self.abandon_stats.in_flight,
        )
        yield CounterMetricFamily(
            "genscore_abandoned_requests",
            "Requests whose client left before the answer.",
            value=self.abandon_stats.abandoned,
        )
        yield CounterMetricFamily(
            "genscore_engine_calls", "Engine calls the batcher made.", value=counters.batches
        )
        yield CounterMetricFamily("genscore_jobs", "Jobs the batcher scored.", value=counters.requests)
        yield CounterMetricFamily(
            "genscore_job_failures", "Jobs answered with an error.", value=counters.failures
        )
        yield CounterMetricFamily(
            "genscore_engine_seconds", "Wall time inside engine calls.", value=counters.engine_seconds
        )
        yield _histogram(
            "genscore_batch_jobs", "Jobs per engine call.", dict(counters.batch_sizes), BATCH_BUCKETS
        )
        cache = self.result_cache()
        if cache is not None:
            yield from _cache_metrics(cache)


def _histogram(
    name: str, documentation: str, counts: Mapping[int, int], bounds: Iterable[float]
) -> HistogramMetricFamily:
    """A histogram from exact counts per value (``{size: calls}``), cumulative per upper bound."""
    buckets = [
        (str(float(bound)), sum(n for value, n in counts.items() if value <= bound)) for bound in bounds
    ]
    buckets.append(("+Inf", sum(counts.values())))
    total = sum(value * n for value, n in counts.items())
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


def _cache_metrics(cache: ResultCache) -> Iterator[Metric]:
    stats = cache.stats()
    yield CounterMetricFamily(
        "genscore_result_cache_hits", "Prompts answered from the result cache.", value=stats.hits
    )
    yield CounterMetricFamily(
        "genscore_result_cache_misses",
        "Prompts looked up in the result cache and scored.",
        value=stats.misses,
    )
    yield CounterMetricFamily(
        "genscore_result_cache_evictions",
        "Scores dropped from the result cache to stay in its bound.",
        value=stats.evictions,
    )
    yield GaugeMetricFamily(
        "genscore_result_cache_hit_ratio",
        "Hits of all lookups since start (rate(hits) / rate(hits + misses) for a recent one).",
        value=stats.hit_rate or 0.0,
    )
    yield GaugeMetricFamily("genscore_result_cache_entries", "Scores held.", value=stats.entries)
    yield GaugeMetricFamily("genscore_result_cache_bytes", "Memory the scores held take.", value=stats.bytes)
    yield GaugeMetricFamily(
        "genscore_result_cache_max_bytes", "The result cache's bound.", value=stats.max_bytes
    )
