"""Helpers of the server tests: the seed's requests, limits, and uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import uvicorn

from genscore_core.server import ServerLimits
from genscore_core.server.connections import uvicorn_options

# Limits small enough that tests can cross them cheaply.
TEST_LIMITS = ServerLimits(
    max_items_per_request=64,
    max_prompt_tokens_per_request=20_000,
    max_body_bytes=256 * 1024,
    batch_max_tokens=8192,
    batch_max_wait_ms=2.0,
)

# A rerank query and four documents, the first the best answer: the dialect and adapter tests' set.
CAPITAL_QUERY = "What is the capital of France?"
CAPITAL_DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is in Paris.",
    "Lyon is known for its cuisine.",
]

# The seed's curl examples and error cases, verbatim.
SEED_TEXT_REQUEST: dict[str, Any] = {
    "query": "Is this city the capital of France?",
    "items": ["Paris", "London", "New York", "Dublin", "Berlin"],
    "label_token_ids": [9454, 2753],
}
SEED_TOKEN_REQUEST: dict[str, Any] = {
    "query": [100, 200],
    "items": [[300, 400], [500, 600]],
    "label_token_ids": [9454, 2753],
}
SEED_EMPTY_ITEMS_REQUEST: dict[str, Any] = {
    "query": "test",
    "items": [],
    "label_token_ids": [9454, 2753],
}
# The seed's error body, but for ``param``: vLLM leaves it null, genscore names the offending field
# there, as OpenAI's error bodies do.
SEED_EMPTY_ITEMS_ERROR = {
    "error": {
        "message": "items must contain at least one item.",
        "type": "BadRequestError",
        "param": "items",
        "code": 400,
    }
}


@dataclass
class LiveServer:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    """Runs the server; once it has ended, so has every worker thread of the server's event loop."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, timeout: float = 60.0, alive: Any = None) -> None:
    """Poll ``/health`` until the server answers 200 (its readiness); ``timeout`` bounds the wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the server at {url} died while starting")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"no healthy server at {url} after {timeout} s")


@contextmanager
def serve_in_thread(app: Any) -> Iterator[LiveServer]:
    """Run ``app`` on uvicorn in a background thread, on a socket bound to a free loopback port.

    An app of :func:`~genscore_core.server.create_app` is served as ``genscore serve`` serves it, with
    the connection handling its limits give (keep-alive and header timeouts, connection limit); any
    other app (a scripted stand-in for another server) with uvicorn's defaults."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    limits = getattr(getattr(app, "state", None), "limits", None)
    options = uvicorn_options(limits) if isinstance(limits, ServerLimits) else {}
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_healthy(url, alive=thread.is_alive)
        yield LiveServer(url, app, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def stop_server_process(process: subprocess.Popen[Any]) -> None:
    """Ctrl-C (uvicorn shuts down gracefully on it), then kill if it has not stopped within 30 s."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def genscore_serve_process(
    command: Sequence[str], model_dir: Path, *flags: str, timeout: float = 120
) -> Iterator[tuple[str, subprocess.Popen[Any]]]:
    """``genscore serve`` of ``model_dir`` (fp32 on the CPU, max length 512) in a subprocess on a free
    loopback port, started by ``command`` (the console script, or ``python -m genscore_core.cli``)
    with ``flags`` added: its URL once healthy, and the process, stopped on exit."""
    port = free_port()
    serve = [
        *command, "serve", "--model", str(model_dir), "--port", str(port), "--max-length", "512",
        "--device", "cpu", "--dtype", "float32", "--log-level", "warning", *flags,
    ]  # fmt: skip
    process = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=timeout, alive=lambda: process.poll() is None)
        yield url, process
    finally:
        stop_server_process(process)


def check_against_spec(spec: dict[str, Any], method: str, path: str, response: httpx.Response) -> None:
    """The status is listed for the endpoint, and the body validates against the schema listed for it."""
    listed = spec["paths"][path][method]["responses"]
    status = str(response.status_code)
    assert status in listed, f"{method.upper()} {path} answered {status}; the document lists {sorted(listed)}"
    schema = listed[status]["content"]["application/json"]["schema"]
    # Refs point into the document's components: validate from a root that holds them.
    jsonschema.Draft202012Validator({**schema, "components": spec["components"]}).validate(response.json())


def read_http_message(connection: socket.socket) -> bytes:
    """One HTTP/1.1 request or answer read off ``connection``: its head and the ``Content-Length``
    bytes of body, or what came before the peer closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def random_bodies(
    rng: random.Random, words: Sequence[str], count: int, document_words: Callable[[], int]
) -> list[dict[str, object]]:
    """``count`` rerank bodies of ``words`` drawn by ``rng``: a query of 4 words and 6 documents of
    ``document_words()`` words each."""
    return [
        {
            "query": " ".join(rng.choices(words, k=4)),
            "documents": [" ".join(rng.choices(words, k=document_words())) for _ in range(6)],
        }
        for _ in range(count)
    ]


def rerank_concurrently(
    url: str, bodies: list[dict[str, object]], at_once: int = 0
) -> list[dict[int, float]]:
    """Each body POSTed to ``url``'s /v1/rerank concurrently (at most ``at_once`` in flight when it is
    not 0), in one event loop; each answer as {index: relevance score}, in the order of ``bodies``."""

    async def run() -> list[dict[int, float]]:
        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
            limit = asyncio.Semaphore(at_once or len(bodies) or 1)

            async def one(body: dict[str, object]) -> dict[int, float]:
                async with limit:
                    answer = await client.post("/v1/rerank", json=body)
                answer.raise_for_status()
                return {r["index"]: r["relevance_score"] for r in answer.json()["results"]}

            return list(await asyncio.gather(*(one(b) for b in bodies)))

    return asyncio.run(run())
