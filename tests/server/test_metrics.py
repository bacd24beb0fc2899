"""``GET /metrics`` scraped by a real HTTP client around real requests, read with Prometheus' own parser."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

QUERY = "which city is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon is a French city."]


@pytest.fixture(scope="module")
def cached_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    """The session's tiny model behind a server of its own, with a result cache."""
    settings = {**scorer.settings(), "result_cache_bytes": 1 << 20}
    cached = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, **settings)
    with serve_in_thread(create_app(cached, TEST_LIMITS)) as live:
        yield live


def scrape(http: httpx.Client) -> Samples:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_the_counters_move_by_exactly_the_requests_sent(
    cached_server: LiveServer, scorer: GenerativeScorer
) -> None:
    with httpx.Client(base_url=cached_server.url, timeout=60) as http:
        before = scrape(http)
        stats_before = http.get("/stats").json()
        rerank: dict[str, Any] = {"query": QUERY, "documents": DOCUMENTS}
        first = http.post("/v1/rerank", json=rerank)
        again = http.post("/v1/rerank", json={**rerank, "documents": DOCUMENTS[::-1]})  # all cached
        items = {"query": QUERY, "items": DOCUMENTS[:2], "label_token_ids": scorer.label_token_ids}
        scored = http.post("/generative_scoring", json=items)
        too_many = http.post("/v1/rerank", json={"query": QUERY, "documents": ["d"] * 65})  # --max-items 64
        after = scrape(http)
        stats = http.get("/stats").json()
    assert [r.status_code for r in (first, again, scored, too_many)] == [200, 200, 200, 400]
    rerank_ok = {"route": "/v1/rerank", "status": "200"}
    assert moved(before, after, "genscore_requests_total", **rerank_ok) == 2
    assert moved(before, after, "genscore_requests_total", route="/v1/rerank", status="400") == 1
    assert moved(before, after, "genscore_requests_total", route="/generative_scoring", status="200") == 1
    # Pairs as sent, the refused request's under its status; tokens of the prompts built.
    assert moved(before, after, "genscore_pairs_total", **rerank_ok) == 6
    assert moved(before, after, "genscore_pairs_total", route="/v1/rerank", status="400") == 65
    assert moved(before, after, "genscore_pairs_total", route="/generative_scoring", status="200") == 2
    tokens = sum(len(prompt.token_ids) for prompt in scorer.encode(QUERY, DOCUMENTS))
    assert moved(before, after, "genscore_prompt_tokens_total", **rerank_ok) == 2 * tokens
    assert first.json()["usage"]["prompt_tokens"] == tokens
    assert moved(before, after, "genscore_prompt_tokens_total", route="/v1/rerank", status="400") == 0
    assert (
        moved(before, after, "genscore_prompt_tokens_total", route="/generative_scoring", status="200")
        == scored.json()["usage"]["prompt_tokens"]
    )
    # Latency: one observation per request, in the buckets, cumulative.
    assert moved(before, after, "genscore_request_duration_seconds_count", **rerank_ok) == 2
    assert moved(before, after, "genscore_request_duration_seconds_sum", **rerank_ok) > 0
    assert moved(before, after, "genscore_request_duration_seconds_bucket", le="+Inf", **rerank_ok) == 2
    # The cache: the repeated rerank answered whole from it, so two engine calls, not three.
    assert moved(before, after, "genscore_result_cache_hits_total") == 3
    assert moved(before, after, "genscore_result_cache_misses_total") == 3 + 2
    assert moved(before, after, "genscore_engine_calls_total") == 2
    assert moved(before, after, "genscore_batch_jobs_count") == 2
    assert moved(before, after, "genscore_batch_jobs_bucket", le="1.0") == 2
    assert after[("genscore_queue_depth", frozenset())] == 0
    # /stats says the same of the cache.
    cache, cache_before = stats["result_cache"], stats_before["result_cache"]
    assert cache["hits"] - cache_before["hits"] == 3 and cache["misses"] - cache_before["misses"] == 5
    assert cache["hit_rate"] == pytest.approx(after[("genscore_result_cache_hit_ratio", frozenset())])
    assert cache["entries"] == after[("genscore_result_cache_entries", frozenset())] == 5
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / (cache["hits"] + cache["misses"]))


def test_each_app_counts_in_its_own_registry(live_server: LiveServer, cached_server: LiveServer) -> None:
    # Two servers in one process: a request to one moves only that one's counters.
    with (
        httpx.Client(base_url=live_server.url, timeout=60) as plain,
        httpx.Client(base_url=cached_server.url, timeout=60) as cached,
    ):
        plain_before, cached_before = scrape(plain), scrape(cached)
        assert plain.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS[:1]}).status_code == 200
        assert plain.get("/no-such-path").status_code == 404
        plain_after, cached_after = scrape(plain), scrape(cached)
        assert plain.get("/stats").json()["result_cache"] is None
    ok = {"route": "/v1/rerank", "status": "200"}
    assert moved(plain_before, plain_after, "genscore_requests_total", **ok) == 1
    assert moved(cached_before, cached_after, "genscore_requests_total", **ok) == 0
    # An unknown path is counted as "other", not by its own name; scrapes count under /metrics.
    assert moved(plain_before, plain_after, "genscore_requests_total", route="other", status="404") == 1
    assert moved(plain_before, plain_after, "genscore_requests_total", route="/metrics", status="200") == 1
    assert not any(name.startswith("genscore_result_cache") for name, _ in plain_after)
