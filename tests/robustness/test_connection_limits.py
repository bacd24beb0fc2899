"""``--max-connections`` sheds only the excess, and idle sockets cannot starve active clients.

uvicorn's own ``limit_concurrency`` counted every open connection and refused a request whenever the
count was over: 1,000 clients connecting at once all got 503, and 700 idle sockets made every request
503. Real sockets on loopback, against ``create_app`` served as ``genscore serve`` serves it.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.server import ServerLimits, create_app
from genscore_core.server.connections import IDLE_GRACE_S
from tests.helpers.server import LiveServer, serve_in_thread

GUARD_S = 30.0
LIMIT = 4
DOCUMENTS = ["Paris is the capital of France.", "Berlin is the capital of Germany."]
BODY = json.dumps({"query": "capital of France", "documents": DOCUMENTS}).encode()
HEAD = (
    b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
)


@pytest.fixture
def live(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    limits = ServerLimits(max_connections=LIMIT, header_timeout_s=60.0, body_timeout_s=60.0)
    with serve_in_thread(create_app(scorer, limits)) as server:
        yield server


def _connect(live: LiveServer) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(GUARD_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _post(live: LiveServer) -> httpx.Response:
    return httpx.post(f"{live.url}/v1/rerank", json=json.loads(BODY), timeout=GUARD_S)


def _assert_busy_answer(answer: bytes) -> None:
    """A 503 with ``Retry-After`` and the protocol's error body naming the limit."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"\r\nretry-after: 1" in head.lower(), head
    error = json.loads(body)["error"]
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
    assert f"limit of {LIMIT} requests" in error["message"] and "--max-connections" in error["message"]


def _expected_scores(scorer: GenerativeScorer) -> list[float]:
    ranked = scorer.rerank("capital of France", DOCUMENTS)
    return [result.score for result in sorted(ranked, key=lambda result: result.index)]


def test_the_first_requests_are_served_and_only_the_excess_is_refused(
    live: LiveServer, scorer: GenerativeScorer
) -> None:
    """Seven clients connected at once with a limit of four: the four whose requests arrived first are
    held open mid-body (in progress), the other three get 503 with Retry-After at once and are
    disconnected, and the four are then answered 200 with the library's scores."""
    socks = [_connect(live) for _ in range(LIMIT + 3)]  # all open before any request: a burst
    try:
        for sock in socks[:LIMIT]:
            sock.sendall(HEAD + BODY[:10])  # in progress, holding a slot
        time.sleep(0.3)
        for sock in socks[LIMIT:]:
            sock.sendall(HEAD + BODY)
        for sock in socks[LIMIT:]:
            _assert_busy_answer(_read_until_closed(sock))
        expected = _expected_scores(scorer)
        for sock in socks[:LIMIT]:
            sock.sendall(BODY[10:])
            answer = httpx.Response(200, content=sock.recv(65536).partition(b"\r\n\r\n")[2])
            results = sorted(answer.json()["results"], key=lambda result: result["index"])
            assert [result["relevance_score"] for result in results] == pytest.approx(expected, abs=1e-5)
    finally:
        for sock in socks:
            sock.close()
    # Once the burst is over, the slots serve again.
    assert _post(live).status_code == 200


def test_idle_sockets_cannot_starve_active_clients(live: LiveServer) -> None:
    """Three times the limit of sockets opened and left idle: the ones past the cap of open connections
    (twice the limit) are answered 503 and closed at once, and active clients arriving later are all
    served, closing idle sockets to make room."""
    idle = [_connect(live) for _ in range(3 * LIMIT)]
    try:
        for sock in idle[2 * LIMIT :]:  # beyond the cap, with no connection idle long enough to close
            _assert_busy_answer(_read_until_closed(sock))
        time.sleep(IDLE_GRACE_S + 0.2)
        with ThreadPoolExecutor(LIMIT) as pool:
            answers = list(
                pool.map(
                    lambda _: _post(live),
                    range(LIMIT),
                )
            )
        assert [answer.status_code for answer in answers] == [200] * LIMIT, [a.text for a in answers]
        # Room was made by closing idle sockets (at least the first client's; a later one finds room
        # again once an earlier one has left), without an answer: they never asked anything.
        assert any(_closed_by_server(sock) for sock in idle[: 2 * LIMIT])
    finally:
        for sock in idle:
            sock.close()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_kept_alive_connections_between_requests_do_not_count(live: LiveServer) -> None:
    """Twice the limit of clients, each keeping its connection open between requests, take turns: every
    request is served (uvicorn counted the idle kept-alive connections and refused the fifth client)."""
    clients = [httpx.Client(base_url=live.url, timeout=GUARD_S) for _ in range(2 * LIMIT)]
    try:
        for _ in range(2):
            assert [client.post("/v1/rerank", json=json.loads(BODY)).status_code for client in clients] == [
                200
            ] * (2 * LIMIT)
    finally:
        for client in clients:
            client.close()


def test_a_burst_of_clients_is_served_or_told_to_retry(live: LiveServer) -> None:
    """As many clients as the cap send at once: at least the limit are served, and every other one
    gets a 503 with Retry-After (never a reset connection or uvicorn's plain-text 503)."""
    with ThreadPoolExecutor(2 * LIMIT) as pool:
        answers = list(pool.map(lambda _: _post(live), range(2 * LIMIT)))
    served = [answer for answer in answers if answer.status_code == 200]
    assert len(served) >= LIMIT, [answer.status_code for answer in answers]
    for answer in answers:
        if answer.status_code != 200:
            assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
            assert answer.json()["error"]["type"] == "ServiceUnavailableError"
