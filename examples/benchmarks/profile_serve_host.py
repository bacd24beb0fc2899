"""What ``genscore serve`` adds to one lone ``/v1/rerank`` request on the host, on the CPU.

    PYTHONPATH=<tree> python examples/benchmarks/profile_serve_host.py [--requests 200] [--http h11]

A real ``genscore serve`` app (``create_app``: the real front end, tokenizer and batcher) whose
backend answers at once (a stub: no model), on uvicorn in a child process, and one HTTP client
sending bench_text.py's W5 bodies (1 x 20 documents of 128-512 words) back to back. Beside it, in
the same process as the client, the same front end and stub backend called directly
(``GenerativeScorer.rerank``). The difference of the medians is what the server adds around the
library call (HTTP both ways, JSON, validation, the hops between the event loop and the threads,
the response); the client's own share is timed too (a ``GET /health`` round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def stub_scorer(cached: bool = False) -> Any:
    """The real front end (``cached``: each request's prompts built once, then looked up, so that
    the tokenizer's time, the same on both sides, does not hide the rest) over a stub backend."""
    from bench_text import load_tokenizer

    from genscore_core import GenerativeScorer
    from genscore_core.backend import ScoringBackend, ScoringJob
    from genscore_core.config import ScorerConfig
    from genscore_core.frontend import ScoringFrontEnd

    class AtOnce(ScoringBackend):
        """Answers every prompt with a score at once (no model)."""

        def score_jobs(self, jobs: Sequence[ScoringJob], on_progress: Any = None) -> list[list[float]]:
            return [[0.25 + 0.5 * (i % 7) / 7 for i in range(len(job.prompts))] for job in jobs]

    class Cached(ScoringFrontEnd):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.built: dict[Any, Any] = {}

        def prepare_pairs(self, pairs: Any, *, max_tokens_per_doc: int | None = None) -> Any:
            key = (pairs[0][0], pairs[0][1], len(pairs))
            if key not in self.built:
                self.built[key] = super().prepare_pairs(pairs, max_tokens_per_doc=max_tokens_per_doc)
            return self.built[key]

    tokenizer = load_tokenizer()
    config = ScorerConfig(model="Qwen/Qwen3-Reranker-0.6B")
    kind = Cached if cached else ScoringFrontEnd
    front = kind(tokenizer, config, max_length=8192, vocab_size=len(tokenizer))
    return GenerativeScorer(front_end=front, backend=AtOnce())


def serve(port: int, http: str, loop: str, cached: bool) -> None:
    import uvicorn

    from genscore_core.server.app import create_app

    app = create_app(stub_scorer(cached))
    profile_to = os.environ.get("PROFILE_SERVE_HOST_STATS")
    if not profile_to:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http=http, loop=loop)
        return
    import cProfile  # the event loop's thread (the server's Python work besides the threads' own)
    import signal

    profiler = cProfile.Profile()
    # uvicorn re-raises SIGTERM after its shutdown: the parent asks for the stats with SIGUSR1 first.
    signal.signal(signal.SIGUSR1, lambda *_: profiler.dump_stats(profile_to))
    profiler.enable()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http=http, loop=loop)


def bodies() -> list[dict[str, Any]]:
    from bench_text import load_tokenizer, make_text, word_list

    work = make_text(random.Random(5), word_list(load_tokenizer()), 64, 20, (128, 512))
    return [{"query": q, "documents": docs} for q, docs in zip(work.queries, work.documents)]


async def raw_client(url: str, sent: list[dict[str, Any]], requests: int) -> tuple[list[float], list[float]]:
    """The same requests over one keep-alive connection with asyncio streams (no client library)."""
    from bench_text import RawHttp

    rerank: list[float] = []
    async with RawHttp(url) as http:
        for i in range(requests + 8):
            start = time.perf_counter()
            await http.post_json("/v1/rerank", sent[i % len(sent)])
            if i >= 8:
                rerank.append((time.perf_counter() - start) * 1e3)
    return rerank, [float("nan")]


async def client(url: str, sent: list[dict[str, Any]], requests: int) -> tuple[list[float], list[float]]:
    import httpx

    loop = asyncio.get_running_loop()
    rerank, health = [], []
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=httpx.Limits(max_connections=1)) as c:
        for i in range(requests + 8):
            start = loop.time()
            response = await c.post("/v1/rerank", json=sent[i % len(sent)])
            middle = loop.time()
            await c.get("/health")
            end = loop.time()
            response.raise_for_status()
            if i >= 8:
                rerank.append((middle - start) * 1e3)
                health.append((end - middle) * 1e3)
    return rerank, health


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--http", default="h11", help="uvicorn's HTTP implementation (the GPU host has h11)")
    parser.add_argument("--loop", default="auto", help="uvicorn's event loop (auto: uvloop where installed)")
    parser.add_argument("--client", choices=["httpx", "raw"], default="httpx")
    parser.add_argument("--label", default="tree")
    parser.add_argument("--cached", action="store_true", help="prompts built once per body, then looked up")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.http, args.loop, args.cached)
        return
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cmd = [sys.executable, __file__, "--serve", str(port), "--http", args.http, "--loop", args.loop] + (
        ["--cached"] if args.cached else []
    )
    proc = subprocess.Popen(cmd, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        sent = bodies()
        measure = raw_client if args.client == "raw" else client
        rerank, health = asyncio.run(measure(url, sent, args.requests))
    finally:
        if os.environ.get("PROFILE_SERVE_HOST_STATS"):
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
        proc.terminate()
        proc.wait(timeout=30)
    scorer = stub_scorer(args.cached)
    direct = []
    for i in range(args.requests + 8):
        body = sent[i % len(sent)]
        start = time.perf_counter()
        scorer.rerank(body["query"], body["documents"])
        if i >= 8:
            direct.append((time.perf_counter() - start) * 1e3)
    r, d, h = statistics.median(rerank), statistics.median(direct), statistics.median(health)
    print(
        f"{args.label} ({args.http}, loop {args.loop}, {args.client} client): /v1/rerank p50 {r:.2f} ms; direct rerank {d:.2f} ms; "
        f"server adds {r - d:.2f} ms; GET /health round trip {h:.2f} ms "
        f"(quartiles rerank {statistics.quantiles(rerank, n=4)[0]:.2f}-{statistics.quantiles(rerank, n=4)[2]:.2f}, "
        f"direct {statistics.quantiles(direct, n=4)[0]:.2f}-{statistics.quantiles(direct, n=4)[2]:.2f})"
    )


if __name__ == "__main__":
    main()
