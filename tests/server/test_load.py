"""Bounded load on loopback: 32 concurrent clients x 50 requests; every answer must be the one it gets alone.

The server batches concurrent requests into shared forwards, so a request's prompts are padded
together with other requests' prompts. Scores may then differ from the request scored alone by
float32 rounding only (left padding with correct positions and masks); this test allows 1e-5 and
reports how many answers came out bitwise identical.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.server import ServerLimits, create_app
from tests.helpers.server import LiveServer, serve_in_thread

CLIENTS = 32
REQUESTS_PER_CLIENT = 50
DISTINCT_REQUESTS = 64
TOLERANCE = 1e-5
WORDS = "paris london capital france river city museum tower bridge history art food wine north south".split()


@pytest.fixture(scope="module")
def batching_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    limits = ServerLimits(batch_max_tokens=4096, batch_max_wait_ms=5.0, max_queued_requests=CLIENTS * 2)
    with serve_in_thread(create_app(scorer, limits)) as live:
        yield live


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def make_requests(count: int) -> list[tuple[str, dict[str, Any]]]:
    """Small, distinct requests of every kind: text, token ids, item_first, full-vocabulary, rerank."""
    rng = random.Random(1234)
    requests: list[tuple[str, dict[str, Any]]] = []
    for number in range(count):
        kind = number % 4
        items = rng.randint(1, 4)
        if kind == 0:
            body: dict[str, Any] = {
                "query": _text(rng, 2, 8),
                "items": [_text(rng, 1, 12) for _ in range(items)],
            }
        elif kind == 1:
            query = [rng.randrange(1000, 50000) for _ in range(rng.randint(1, 12))]
            body = {"query": query, "items": [[rng.randrange(1000, 50000) for _ in range(rng.randint(1, 12))] for _ in range(items)]}  # fmt: skip
            body["apply_softmax"] = rng.random() < 0.5
        elif kind == 2:
            body = {
                "query": _text(rng, 2, 8),
                "items": [_text(rng, 1, 12) for _ in range(items)],
                "item_first": True,
            }
        else:
            requests.append(("/v1/rerank", {"query": _text(rng, 2, 6), "documents": [_text(rng, 3, 20) for _ in range(items)]}))  # fmt: skip
            continue
        body["label_token_ids"] = [9693, 2152] if rng.random() < 0.5 else [9693, 2152, 9454]
        requests.append(("/generative_scoring", body))
    return requests


def scores_alone(scorer: GenerativeScorer, path: str, body: dict[str, Any]) -> dict[int, float]:
    """The request's scores, by item index, from the library with nothing else in the forward."""
    if path == "/v1/rerank":
        return {r.index: r.score for r in scorer.rerank(body["query"], body["documents"])}
    return {d.index: d.score for d in scorer.score(body).data}


def scores_served(path: str, answer: dict[str, Any]) -> dict[int, float]:
    if path == "/v1/rerank":
        ranked = [r["relevance_score"] for r in answer["results"]]
        assert ranked == sorted(ranked, reverse=True)
        return {r["index"]: r["relevance_score"] for r in answer["results"]}
    return {d["index"]: d["score"] for d in answer["data"]}


@pytest.mark.slow
async def test_concurrent_clients_get_exactly_their_own_answers(
    batching_server: LiveServer, scorer: GenerativeScorer
) -> None:
    requests = make_requests(DISTINCT_REQUESTS)
    expected = [scores_alone(scorer, path, body) for path, body in requests]
    stats_before = httpx.get(f"{batching_server.url}/stats").json()
    failures: list[str] = []
    exact = close = 0
    worst = 0.0

    async def client_loop(client_number: int, http: httpx.AsyncClient) -> None:
        nonlocal exact, close, worst
        for step in range(REQUESTS_PER_CLIENT):
            # Different clients send the same request at the same time, too.
            which = (client_number * 5 + step * 3) % DISTINCT_REQUESTS
            path, body = requests[which]
            response = await http.post(path, json=body)
            if response.status_code != 200:
                failures.append(f"request {which}: HTTP {response.status_code} {response.text[:200]}")
                continue
            got = scores_served(path, response.json())
            want = expected[which]
            if got.keys() != want.keys():
                failures.append(f"request {which}: items {sorted(got)} instead of {sorted(want)}")
                continue
            difference = max(abs(got[i] - want[i]) for i in want)
            worst = max(worst, difference)
            if difference > TOLERANCE:
                failures.append(f"request {which}: scores {got} instead of {want}")
            elif difference == 0.0:
                exact += 1
            else:
                close += 1

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=batching_server.url, timeout=120.0, limits=limits) as http:
        await asyncio.gather(*(client_loop(number, http) for number in range(CLIENTS)))
    stats = httpx.get(f"{batching_server.url}/stats").json()

    assert not failures, f"{len(failures)} bad answers, e.g. {failures[:3]}"
    assert exact + close == CLIENTS * REQUESTS_PER_CLIENT  # nothing lost
    jobs = stats["requests"] - stats_before["requests"]
    batches = stats["batches"] - stats_before["batches"]
    assert jobs == CLIENTS * REQUESTS_PER_CLIENT and stats["failures"] == stats_before["failures"]
    # Batching happened: one forward served several requests.
    assert stats["shared_batches"] > stats_before["shared_batches"] and stats["largest_batch"] > 1
    print(
        f"\n{jobs} requests from {CLIENTS} clients; "
        f"{batches} engine calls, largest {stats['largest_batch']} requests; "
        f"{exact} answers bitwise identical to the request alone, {close} within {TOLERANCE} "
        f"(largest difference {worst:.2e})"
    )
