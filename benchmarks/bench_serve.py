"""W5: ``genscore serve`` under 1, 8, 32 and 64 concurrent HTTP clients, each sending 1 x 20 ``/v1/rerank``.

    python benchmarks/bench_serve.py                 # one GPU: the 0.6B shape, bf16
    python benchmarks/bench_serve.py --fresh         # every request brings new documents
    python benchmarks/bench_serve.py --dry-run       # a tiny model on the CPU, short windows

The random-init model (``common.SHAPES``) and the Qwen3 tokenizer are saved to a temporary folder and
served by a real ``genscore serve`` process (the console script's entry point, ``genscore_core.cli``).
Each level's window of ``--seconds`` opens after ``--warmup`` seconds of its own load: clients started
together come back together, and the first seconds of a load alternate large and small batches.
Pairs/s counts the requests answered inside the window; p50/p99 are over the requests sent inside it,
each followed to its answer. Needs httpx besides the server's own dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from common import (
    SHAPES,
    Report,
    Texts,
    build_model,
    load_tokenizer,
    quantile,
    run_reported,
    word_list,
)

SERVE = "import sys; from genscore_core.cli import main; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(folder: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """``genscore serve --model folder``, once it answers /health."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-c", SERVE, "serve", "--model", str(folder), "--port", str(port),
           "--log-level", "warning", *extra]  # fmt: skip
    # Started in the model folder: a checkout in the current folder would shadow the tree on PYTHONPATH.
    proc = subprocess.Popen(cmd, env=dict(os.environ), cwd=folder)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"genscore serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("genscore serve did not become healthy")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def client_load(
    url: str, texts: Texts, pool: list[dict[str, Any]] | None, clients: int, warmup_s: float, measure_s: float
) -> tuple[list[float], int]:
    """Latencies (s) of the requests sent inside the window and pairs answered inside it. ``pool``: the
    bodies sent in turn; None: a new body for every request (made before its clock starts)."""
    import httpx

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    window = (t0 + warmup_s, t0 + warmup_s + measure_s)
    latencies: list[float] = []
    answered = 0

    async def one(index: int) -> None:
        nonlocal answered
        k = index
        async with httpx.AsyncClient(
            base_url=url, timeout=120.0, limits=httpx.Limits(max_connections=1)
        ) as client:
            while loop.time() < window[1]:
                body = (
                    pool[k % len(pool)]
                    if pool
                    else {"query": texts.query(), "documents": texts.documents(20)}
                )
                k += clients
                start = loop.time()
                response = await client.post("/v1/rerank", json=body)
                response.raise_for_status()
                end = loop.time()
                if window[0] <= start < window[1]:
                    latencies.append(end - start)
                if window[0] <= end <= window[1]:
                    answered += len(body["documents"])

    await asyncio.gather(*(one(i) for i in range(clients)))
    return latencies, answered


def forward_stats(url: str) -> dict[str, int]:
    """The server's forward counters (``/stats``): batches replayed as graphs, batches run eagerly."""
    answer = httpx.get(f"{url}/stats", timeout=30).json()
    forward = answer.get("forward") or {}
    return {key: int(value) for key, value in forward.items() if isinstance(value, int)}


def run(args: argparse.Namespace, report: Report) -> None:
    dry = args.dry_run
    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    pool = (
        None
        if args.fresh
        else [{"query": texts.query(), "documents": texts.documents(20)} for _ in range(64)]
    )
    levels = [1, 4] if dry else args.clients
    seconds, warmup = (3.0, 1.0) if dry else (args.seconds, args.warmup)
    with tempfile.TemporaryDirectory(prefix="genscore-bench-") as tmp:
        folder = Path(tmp)
        model = build_model("tiny" if dry else args.shape, "cpu", torch.float32 if dry else torch.bfloat16)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        del model
        proc, url = start_server(folder, shlex.split(args.server_args))
        try:
            asyncio.run(client_load(url, texts, pool, 4, 0.0, seconds / 2))  # compilation, allocator, graphs
            for clients in levels:
                before = forward_stats(url)
                latencies, answered = asyncio.run(client_load(url, texts, pool, clients, warmup, seconds))
                after = forward_stats(url)
                if not latencies:
                    print(f"W5 {clients} clients: no request inside the window", file=sys.stderr)
                    continue
                p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
                name = f"W5 {clients} client{'s' if clients > 1 else ''}" + (" fresh" if args.fresh else "")
                replays = after.get("graph_replays", 0) - before.get("graph_replays", 0)
                eager = after.get("eager_batches", 0) - before.get("eager_batches", 0)
                report.add(name, "pairs/s, /v1/rerank 1 x 20", answered / seconds, "pairs/s",
                           note=f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms ({p99 / p50:.1f}x p50); "
                                f"batches: {replays} graph replays, {eager} eager")  # fmt: skip
        finally:
            stop_server(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if s not in ("tiny", "cpu")], default="0.6b")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--seconds", type=float, default=15.0, help="each level's measuring window")
    parser.add_argument("--warmup", type=float, default=8.0, help="each level's load before its window")
    parser.add_argument("--fresh", action="store_true", help="new documents in every request")
    parser.add_argument(
        "--server-args", default="", help='more `genscore serve` flags, e.g. "--batch-max-wait-ms 2"'
    )
    run_reported(parser, "bench_serve.py", run, dry_run="tiny model on the CPU: checks the script")


if __name__ == "__main__":
    main()
