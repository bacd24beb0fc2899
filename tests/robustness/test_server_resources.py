"""``genscore serve``'s resources: memory follows the prompt, abandoned requests cost nothing, slow and
idle clients cannot hold every connection."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.backend import ScoringBackend
from genscore_core.request_life import AbandonStats
from genscore_core.server import ServerLimits, create_app
from genscore_core.server.connections import uvicorn_options
from tests.helpers.server import (
    TEST_LIMITS,
    check_against_spec,
    free_port,
    read_http_message,
    serve_in_thread,
    stop_server_process,
    wait_healthy,
)

GENSCORE = shutil.which("genscore")


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line")


def _serve(model: Path, *flags: str) -> Iterator[Served]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    port = free_port()
    command = [GENSCORE, "serve", "--model", str(model), "--port", str(port), "--device", "cpu",
               "--dtype", "float32", "--log-level", "warning", *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=120, alive=lambda: process.poll() is None)
        yield Served(url, process)
    finally:
        stop_server_process(process)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    """The default maximum length (the tiny model's 8,192 positions) and default limits."""
    yield from _serve(tiny_model_dir)


SMALL = {"query": "which fox?", "documents": ["a small document about a fox " * 20] * 4}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_rss_after_an_8mb_document_returns_near_where_it_was(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=600) as client:
        assert client.post("/v1/rerank", json=SMALL).status_code == 200
        before = served.rss_mb()
        document = ("The quick brown fox jumps over the lazy dog. " * 200_000)[:8_000_000]
        answer = client.post("/v1/rerank", json={"query": "which fox?", "documents": [document]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == 8192
        assert client.post("/v1/rerank", json=SMALL).status_code == 200
        after = served.rss_mb()
    assert after - before < 300, f"RSS {before:.0f} MB before, {after:.0f} MB after an 8 MB document"


# -- abandoned requests ----------------------------------------------------------------------------------


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/stats", timeout=30).json()


GUARD_S = 120.0
"""Turns a hang into a failure; no test waits this long when the server works."""


def _post_raw(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    sock.sendall(head.encode() + payload)
    return sock


def test_abandoned_requests_are_neither_tokenized_nor_scored(tiny_model_dir: Path) -> None:
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)
    heavy = {
        "query": "which one?",
        "documents": ["a heavy document " * 200] * 24,
    }  # under the 256 KB body limit
    small = {"query": "which one?", "documents": ["small", "tiny"]}
    abandoned = 10
    app = create_app(scorer, TEST_LIMITS)
    counts: AbandonStats = app.state.abandon_stats
    with serve_in_thread(app) as live:
        assert httpx.post(f"{live.url}/v1/rerank", json=small, timeout=60).status_code == 200
        # The tokenizer is taken (as by one long request) while the heavy requests arrive, so that
        # every one of them is still waiting when its client leaves.
        tokenizer = scorer.front_end._tokenizer_lock
        with tokenizer:
            sockets = [_post_raw(live.url, "/v1/rerank", heavy) for _ in range(abandoned)]
            assert counts.wait_until(lambda c: c.in_flight == abandoned, GUARD_S), counts
            for sock in sockets:
                sock.close()
            assert counts.wait_until(lambda c: c.abandoned == abandoned, GUARD_S), counts
        answer = httpx.post(f"{live.url}/v1/rerank", json=small, timeout=60)
        assert answer.status_code == 200
        assert counts.wait_until(lambda c: c.in_flight == 0, GUARD_S), counts
        stats = _stats(live.url)
    # The server has stopped, and its event loop waited for its worker threads: an abandoned request
    # still queued for the tokenizer above has been dropped (or tokenized) by now.
    assert not live.thread.is_alive()
    assert scorer.front_end.tokenizer_waiting == 0
    assert counts.tokenized == 2  # the two small requests
    assert app.state.batcher.stats.requests == 2  # jobs scored: the two small requests' only
    assert counts.abandoned == abandoned
    # /stats reports the same counters.
    assert (stats["tokenized_requests"], stats["requests"], stats["abandoned"]) == (2, 2, abandoned)
    assert stats["in_flight"] == 0


class _HeldEngine(ScoringBackend):
    """The scorer's engine behind a gate: an engine call waits until the test opens it, as a long
    call would hold the requests queued behind it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.entered = threading.Event()
        self.gate = threading.Event()

    def score_jobs(self, jobs: Any, on_progress: Any = None) -> list[list[float]]:
        self.entered.set()
        assert self.gate.wait(GUARD_S), "the gate was never opened"
        scores: list[list[float]] = self.engine.score_jobs(jobs, on_progress)
        return scores


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_requests_abandoned_in_the_queue_neither_count_as_queued_nor_fill_it(
    scorer: GenerativeScorer,
) -> None:
    """Requests whose clients left while they waited for the engine stayed in the queue until the
    worker reached them: /stats counted them as queued, and while a long call ran, clients timing out
    filled --max-queued-requests with the dead and live requests were refused 503."""
    app = create_app(scorer, TEST_LIMITS.model_copy(update={"max_queued_requests": 3}))
    held = _HeldEngine(scorer.backend)
    app.state.batcher.backend = held
    counts: AbandonStats = app.state.abandon_stats
    small = {"query": "which one?", "documents": ["small", "tiny"]}
    with serve_in_thread(app) as live, ThreadPoolExecutor(4) as pool:
        try:
            url = f"{live.url}/v1/rerank"
            first = pool.submit(httpx.post, url, json=small, timeout=GUARD_S)
            assert held.entered.wait(GUARD_S)  # the engine holds the first request's call
            sockets = [_post_raw(live.url, "/v1/rerank", small) for _ in range(3)]
            _until(lambda: _stats(live.url)["queued"] == 3, "the three requests were never queued")
            for sock in sockets:
                sock.close()
            assert counts.wait_until(lambda c: c.abandoned == 3, GUARD_S), counts
            assert _stats(live.url)["queued"] == 0
            later = [pool.submit(httpx.post, url, json=small, timeout=GUARD_S) for _ in range(3)]
            # Queued behind the held call, in the room the abandoned requests left.
            _until(lambda: _stats(live.url)["queued"] == 3 or any(f.done() for f in later), "never queued")
            held.gate.set()
            answers = [future.result() for future in [first, *later]]
            assert [answer.status_code for answer in answers] == [200] * 4, [
                answer.text for answer in answers
            ]
            for answer in answers:
                assert sorted(result["index"] for result in answer.json()["results"]) == [0, 1]
            assert counts.wait_until(lambda c: c.in_flight == 0, GUARD_S), counts
        finally:
            held.gate.set()  # a failure above must not leave the server's threads held
        stats = _stats(live.url)
    # The first request and the three later ones were scored; the abandoned ones never were.
    assert (stats["requests"], stats["abandoned"], stats["queued"]) == (4, 3, 0)


# -- connections -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(tiny_model_dir: Path) -> Iterator[Served]:
    yield from _serve(
        tiny_model_dir, "--max-length", "512", "--max-connections", "2", "--header-timeout", "1",
        "--keep-alive-timeout", "60",
    )  # fmt: skip


@pytest.mark.slow
def test_a_client_that_never_finishes_its_headers_is_disconnected(limited: Served) -> None:
    host, port = limited.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(120)  # a guard: a server without a header timeout never answers
        sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: appl")
        assert sock.recv(1024) == b""  # closed by the server
    assert httpx.get(f"{limited.url}/health", timeout=30).status_code == 200


def _health_exchange(sock: socket.socket) -> bytes:
    """One ``GET /health`` on a kept-alive connection; the whole answer, or b"" if the server closed it."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return read_http_message(sock)


@pytest.mark.slow
def test_an_idle_connection_outlives_the_header_timeout_until_its_keep_alive(limited: Served) -> None:
    """A pooled connection idle past --header-timeout (1 s) but within --keep-alive-timeout (60 s) is
    still open: the server closes an idle connection on its keep-alive alone, later than clients'
    pools drop it, so a client never sends a request into a connection the server is closing."""
    host, port = limited.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(GUARD_S)
        assert _health_exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(2.0)  # twice the header timeout, idle
        assert _health_exchange(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.slow
def test_a_stalled_second_request_head_is_disconnected(limited: Served) -> None:
    """After an answer, the next head's clock starts at its first byte: trickling it still gets cut."""
    host, port = limited.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(GUARD_S)
        assert _health_exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle past the header timeout: not cut, the head has not started
        sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: appl")
        assert sock.recv(1024) == b""  # closed by the server


def test_an_idle_connection_is_closed_at_its_keep_alive(scorer: GenerativeScorer) -> None:
    limits = ServerLimits(keep_alive_timeout_s=1, header_timeout_s=60.0)
    with serve_in_thread(create_app(scorer, limits)) as live:
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.settimeout(GUARD_S)
            assert _health_exchange(sock).startswith(b"HTTP/1.1 200")
            opened = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server, idle
            assert time.monotonic() - opened < 30.0  # at the keep-alive, not the header timeout (60 s)


def test_serve_flags_default_to_safe_limits() -> None:
    from genscore_core.cli import build_parser

    args = build_parser().parse_args(["serve", "--model", "m"])
    assert (args.max_connections, args.header_timeout, args.keep_alive_timeout) == (512, 10.0, 75)
    assert args.body_timeout == 30.0
    limits = ServerLimits(max_connections=args.max_connections, header_timeout_s=args.header_timeout)
    # genscore's own limit (tests/robustness/test_connection_limits.py), not uvicorn's, which counts
    # idle connections and refuses every request once over.
    assert "limit_concurrency" not in uvicorn_options(limits)
    # Idle connections outlive the pools of httpx (and so the OpenAI SDK): the client drops them first.
    default_pool_expiry = httpx.Limits().keepalive_expiry
    assert (
        default_pool_expiry is not None
        and uvicorn_options(limits)["timeout_keep_alive"] > default_pool_expiry
    )


# -- invalid text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/rerank", {"query": "q", "documents": ["fine", "bad \ud800"]}, "documents[1]"),
        ("/v1/rerank", {"query": "bad \udfff", "documents": ["fine"]}, "query"),
        (
            "/generative_scoring",
            {"query": "q", "items": ["a", "b", "\ud83d"], "label_token_ids": [9693, 2152]},
            "items[2]",
        ),
        (
            "/generative_scoring",
            {"query": "\udc80", "items": ["a"], "label_token_ids": [9693, 2152]},
            "query",
        ),
    ],
)
def test_invalid_text_is_a_400_naming_field_and_index(
    scorer: GenerativeScorer, path: str, body: dict[str, Any], where: str
) -> None:
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        # JSON allows the escape "\ud800"; json.dumps writes lone surrogates that way.
        answer = httpx.post(
            f"{live.url}{path}",
            content=json.dumps(body),
            headers={"content-type": "application/json"},
            timeout=60,
        )
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert f"{where} is not valid text" in message and "lone surrogate" in message


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The answer to a request and what follows it: b"" when the server then closes the connection."""
    answer = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return answer, b""
        answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]  # fmt: skip
        if length and len(body) >= length[0]:
            return answer, sock.recv(1024)


def test_a_stalled_request_body_is_answered_408_and_its_connection_closed(scorer: GenerativeScorer) -> None:
    limits = ServerLimits(body_timeout_s=1.0, header_timeout_s=60.0, max_connections=2)
    body = json.dumps({"query": "q", "documents": ["a fox"]}).encode()
    head = b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    with serve_in_thread(create_app(scorer, limits)) as live:
        spec = httpx.get(f"{live.url}/openapi.json", timeout=GUARD_S).json()
        host, port = live.url.removeprefix("http://").split(":")
        stalled = [socket.create_connection((host, int(port))) for _ in range(2)]
        try:
            for sock in stalled:
                sock.settimeout(GUARD_S)  # a guard: a server without a body timeout never answers
                sock.sendall(head + body[:5])
            opened = time.monotonic()
            for sock in stalled:
                answer, after = _read_answer(sock)
                assert answer.startswith(b"HTTP/1.1 408")
                check_against_spec(
                    spec, "post", "/v1/rerank", httpx.Response(408, content=answer.partition(b"\r\n\r\n")[2])
                )
                message = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"]
                assert "within 1 s" in message and "--body-timeout" in message
                assert after == b""  # and the connection closed
            assert time.monotonic() - opened < 10.0
            # The connections they held serve others again.
            answer = httpx.post(f"{live.url}/v1/rerank", json=json.loads(body), timeout=GUARD_S)
            assert answer.status_code == 200
        finally:
            for sock in stalled:
                sock.close()


def test_chunk_mode_refuses_a_document_over_max_prompt_tokens_before_tokenizing_it(
    tiny_model_dir: Path,
) -> None:
    chunking = GenerativeScorer(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=96, long_documents="chunk"
    )
    limits = ServerLimits(max_prompt_tokens_per_request=1_000, max_body_bytes=1024 * 1024)
    documents = ["short", "lorem ipsum " * 20_000]  # 240,000 characters
    with serve_in_thread(create_app(chunking, limits)) as live:
        answer = httpx.post(f"{live.url}/v1/rerank", json={"query": "q", "documents": documents}, timeout=60)
        assert answer.status_code == 400
        # Refused from its length in characters, before its tokens are counted.
        assert "documents[1] is 240000 characters" in answer.json()["detail"]
        assert "1000 tokens" in answer.json()["detail"]
        fitting = httpx.post(
            f"{live.url}/v1/rerank", json={"query": "q", "documents": documents[:1]}, timeout=60
        )
        assert fitting.status_code == 200
