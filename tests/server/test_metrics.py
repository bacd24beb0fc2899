"""``GET /metrics`` scraped by a real HTTP client around real requests, read with Prometheus' own parser."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from genscore_core import GenerativeScorer
from genscore_core.request_life import TokenizerLock
from genscore_core.request_timing import STAGES, RequestTiming, timed
from genscore_core.server import create_app
from tests.helpers.server import TEST_LIMITS, LiveServer, random_bodies, rerank_concurrently, serve_in_thread

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


def stage_seconds(before: Samples, after: Samples, route: str) -> dict[str, tuple[float, float]]:
    """Per stage of ``route``'s requests between two scrapes: (observations, seconds)."""
    return {
        stage: (
            moved(before, after, "genscore_request_stage_seconds_count", route=route, stage=stage),
            moved(before, after, "genscore_request_stage_seconds_sum", route=route, stage=stage),
        )
        for stage in STAGES
    }


def test_a_scored_request_is_split_into_stages_that_add_up_to_its_time(
    live_server: LiveServer, cached_server: LiveServer, scorer: GenerativeScorer
) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        before = scrape(http)
        assert http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).status_code == 200
        items = {"query": QUERY, "items": DOCUMENTS[:2], "label_token_ids": scorer.label_token_ids}
        assert http.post("/generative_scoring", json=items).status_code == 200
        refused = http.post("/v1/rerank", json={"query": QUERY, "documents": ["d"] * 65})  # --max-items 64
        assert refused.status_code == 400
        after = scrape(http)
    for route in ("/v1/rerank", "/generative_scoring"):
        stages = stage_seconds(before, after, route)
        assert {stage: count for stage, (count, _) in stages.items()} == dict.fromkeys(STAGES, 1.0), route
        # Each stage is a share of the request's own time, measured apart (arrival to last byte).
        total = moved(before, after, "genscore_request_duration_seconds_sum", route=route, status="200")
        assert sum(seconds for _, seconds in stages.values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert stages["tokenize"][1] > 0 and stages["inference"][1] > 0, route
    # The refused request reached no engine: its 400 is timed, but not split into stages.
    refused_total = moved(
        before, after, "genscore_request_duration_seconds_count", route="/v1/rerank", status="400"
    )
    assert refused_total == 1

    # A request answered whole from the result cache never queues: no stages either.
    with httpx.Client(base_url=cached_server.url, timeout=60) as http:
        rerank = {"query": QUERY, "documents": DOCUMENTS[:1]}
        assert http.post("/v1/rerank", json=rerank).status_code == 200
        before = scrape(http)
        assert http.post("/v1/rerank", json=rerank).status_code == 200
        after = scrape(http)
    assert moved(before, after, "genscore_requests_total", route="/v1/rerank", status="200") == 1
    assert all(count == 0 for count, _ in stage_seconds(before, after, "/v1/rerank").values())


def test_a_wait_for_company_is_counted_as_queue_time(scorer: GenerativeScorer) -> None:
    # With --batch-wait always, a lone request waits --batch-max-wait-ms in the queue for others:
    # that time must show as its queue stage, not in any other.
    wait = 0.25
    limits = TEST_LIMITS.model_copy(update={"batch_wait": "always", "batch_max_wait_ms": wait * 1000})
    with (
        serve_in_thread(create_app(scorer, limits)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        before = scrape(http)
        assert http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).status_code == 200
        after = scrape(http)
    stages = {stage: seconds for stage, (_, seconds) in stage_seconds(before, after, "/v1/rerank").items()}
    assert stages["queue"] >= wait - 0.01
    assert all(seconds < wait - 0.01 for stage, seconds in stages.items() if stage != "queue"), stages


def test_the_tokenize_stage_counts_holding_the_tokenizer_not_waiting_for_it() -> None:
    lock = TokenizerLock()
    held_by_other = threading.Event()

    def other_request() -> None:  # untimed: holds the tokenizer 0.2 s first
        with lock:
            held_by_other.set()
            time.sleep(0.2)

    other = threading.Thread(target=other_request)
    other.start()
    held_by_other.wait()
    timing = RequestTiming(time.perf_counter())
    with timed(timing):
        with lock:  # waits ~0.2 s for the other request, then holds it 0.05 s
            time.sleep(0.05)
    other.join()
    assert 0.05 <= timing.tokenizer_seconds < 0.15
    assert time.perf_counter() - timing.arrived >= 0.2  # the wait did happen


def test_requests_sharing_engine_calls_each_get_their_own_stages(live_server: LiveServer) -> None:
    # Concurrent requests share engine calls: each must still be observed once per stage, with its
    # own moments (not another request's), so every request's stages add up to its own duration.
    bodies = random_bodies(random.Random(7), DOCUMENTS[0].split(), 12, lambda: 20)
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        before = scrape(http)
        batches_before = http.get("/stats").json()["shared_batches"]
        rerank_concurrently(live_server.url, bodies)
        after = scrape(http)
        shared = http.get("/stats").json()["shared_batches"] - batches_before
    stages = stage_seconds(before, after, "/v1/rerank")
    assert {stage: count for stage, (count, _) in stages.items()} == dict.fromkeys(STAGES, 12.0)
    # A request's tokenizer time charged to another (they share the tokenizer's lock) would exceed
    # that one's own time before its queue; its prepare stage would be clamped and the sums part.
    total = moved(before, after, "genscore_request_duration_seconds_sum", route="/v1/rerank", status="200")
    assert sum(seconds for _, seconds in stages.values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert shared >= 1  # the requests did share calls: the case this test is about
