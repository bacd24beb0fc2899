"""W5: ``genscore serve`` under 1, 8, 32 and 64 concurrent HTTP clients, each sending 1 x 20 ``/v1/rerank``.

    python benchmarks/bench_serve.py                 # one GPU: the 0.6B shape, bf16
    python benchmarks/bench_serve.py --fresh         # every request brings new documents
    python benchmarks/bench_serve.py --dry-run       # a tiny model on the CPU, short windows
    python benchmarks/bench_serve.py --one-client    # one client's p50 against the in-process call
    python benchmarks/bench_serve.py --one-client --cpu   # the same with the tiny model on the CPU

The random-init model (``common.SHAPES``) and the Qwen3 tokenizer are saved to a temporary folder and
served by a real ``genscore serve`` process (the console script's entry point, ``genscore_core.cli``).
Each level's window of ``--seconds`` opens after ``--warmup`` seconds of its own load: clients started
together come back together, and the first seconds of a load alternate large and small batches.
Pairs/s counts the requests answered inside the window; p50/p99 are over the requests sent inside it,
each followed to its answer. Needs httpx besides the server's own dependencies.

``--one-client``: what the server adds to a lone request. One client sends 1 x 20 requests of fresh
documents one after another; in the same process the same scorer (``GenerativeScorer`` on the same
folder, as the server builds it) reranks fresh 1 x 20 calls in process (W4 fresh), and the same client
sends the same kind of bodies to a bare uvicorn app that parses the JSON and answers the server's own
answer bytes (the HTTP floor: the client, the connection and uvicorn, no genscore). Blocks of each
alternate, so that a shared machine's load falls on all three alike; p50 of each and the server's
excess over the in-process call. Where that excess goes: the server's own split of its requests'
time (``genscore_request_stage_seconds`` in ``/metrics``, scraped around the timed blocks), each
stage's mean beside the in-process call's and the client's means.
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
from prometheus_client.parser import text_string_to_metric_families

from genscore_core.request_timing import STAGES, RequestTiming, timed

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


FLOOR = """
import json, sys, uvicorn
answer = open(sys.argv[2], "rb").read()
headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if body:
        json.loads(body)
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", http="h11")
"""


def start_floor(answer: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A bare uvicorn app (the server's h11 protocol) answering ``answer``'s bytes to any request."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", FLOOR, str(port), str(answer)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2.0)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("the HTTP floor's app did not start")


def loop_thread_seconds(pid: int) -> float | None:
    """CPU seconds the server's main thread (uvicorn's event loop) has run; None off Linux."""
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


async def stage_sums(client: httpx.AsyncClient) -> dict[str, float]:
    """The server's seconds so far in each stage of its ``/v1/rerank`` requests, and in whole ones
    (``total``), with the number of requests (``count``), from ``/metrics``."""
    answer = await client.get("/metrics")
    answer.raise_for_status()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            if sample.labels.get("route") != "/v1/rerank":
                continue
            if sample.name == "genscore_request_stage_seconds_sum":
                sums[sample.labels["stage"]] = sample.value
            elif sample.name == "genscore_request_duration_seconds_sum" and sample.labels["status"] == "200":
                sums["total"] = sample.value
            elif (
                sample.name == "genscore_request_duration_seconds_count" and sample.labels["status"] == "200"
            ):
                sums["count"] = sample.value
    return sums


def one_client(args: argparse.Namespace, folder: Path, proc: subprocess.Popen[bytes], url: str,
               texts: Texts, report: Report) -> None:  # fmt: skip
    """A lone client's p50 against the in-process call and the HTTP floor (``--one-client``)."""
    from genscore_core.scorer import GenerativeScorer

    requests, block = (20, 5) if args.dry_run else (args.requests, args.block)
    words = args.doc_words

    def documents() -> list[str]:
        if not words:
            return texts.documents(20)
        return [texts.text(texts.rng.randint(max(1, words // 2), words)) for _ in range(20)]

    scorer = GenerativeScorer(str(folder), device="cpu") if args.cpu else GenerativeScorer(str(folder))
    answer = httpx.post(f"{url}/v1/rerank", json={"query": texts.query(), "documents": documents()},
                        timeout=120.0)  # fmt: skip
    answer.raise_for_status()
    (folder / "answer.json").write_bytes(answer.content)
    floor, floor_url = start_floor(folder / "answer.json")
    times: dict[str, list[float]] = {"in-process": [], "server": [], "floor": []}
    loop_cpu = 0.0  # the server's event-loop thread, over its timed blocks
    stages: dict[str, float] = {}  # the server's own split of the timed requests' time, summed
    in_process_tokenize = 0.0  # the in-process calls' time holding the tokenizer, summed

    async def measure() -> None:
        nonlocal loop_cpu, in_process_tokenize
        limits = httpx.Limits(max_connections=1)
        async with (
            httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as server,
            httpx.AsyncClient(base_url=floor_url, timeout=120.0, limits=limits) as bare,
        ):
            clients = {"server": server, "floor": bare}
            for turn in range(-1, requests // block):  # turn -1: untimed, each path warmed
                if turn == 0:
                    stages.update(await stage_sums(server))
                order = list(times) if turn % 2 else list(reversed(times))
                for name in order:
                    bodies = [(texts.query(), documents()) for _ in range(block)]
                    before = loop_thread_seconds(proc.pid)
                    for query, docs in bodies:
                        start = time.perf_counter()
                        if name == "in-process":
                            # The server's own stage clock, around the library call: its tokenizer time.
                            with timed(RequestTiming(start)) as timing:
                                scorer.rerank(query, docs)
                            if turn >= 0:
                                in_process_tokenize += timing.tokenizer_seconds
                        else:
                            answered = await clients[name].post(
                                "/v1/rerank", json={"query": query, "documents": docs}
                            )
                            answered.raise_for_status()
                        if turn >= 0:
                            times[name].append(time.perf_counter() - start)
                    after = loop_thread_seconds(proc.pid)
                    if name == "server" and turn >= 0 and before is not None and after is not None:
                        loop_cpu += after - before
            ended = await stage_sums(server)
            stages.update({key: ended.get(key, 0.0) - stages.get(key, 0.0) for key in ended})

    try:
        asyncio.run(measure())
    finally:
        stop_server(floor)
    p50 = {name: quantile(values, 0.5) * 1e3 for name, values in times.items()}
    report.add("W4 fresh, in process", "p50 latency, 1 x 20, beside W5 1 client", p50["in-process"], "ms",
               note=f"{len(times['in-process'])} calls")  # fmt: skip
    sizes = f"documents of {max(1, words // 2)}-{words} words" if words else "W4's documents"
    report.add("W5 1 client fresh", "p50 latency, /v1/rerank 1 x 20", p50["server"], "ms",
               note=f"{p50['server'] - p50['in-process']:+.2f} ms over the in-process call; "
                    f"p99 {quantile(times['server'], 0.99) * 1e3:.1f} ms; {sizes}")  # fmt: skip
    if loop_cpu:
        report.add("W5 1 client fresh", "server event-loop thread CPU per request", loop_cpu / len(times["server"]) * 1e3,
                   "ms", note="uvicorn's loop: HTTP, the app, the batcher's worker (not tokenizing, not the model)")  # fmt: skip
    report.add("HTTP floor", "p50 latency, the same client and bodies, a bare uvicorn app", p50["floor"], "ms",
               note="the answer's bytes canned; no genscore")  # fmt: skip
    report_stages(report, stages, times, in_process_tokenize)


def report_stages(
    report: Report, stages: dict[str, float], times: dict[str, list[float]], in_process_tokenize: float
) -> None:
    """Means per request: the client's and the in-process call's, the server's time inside the app
    and its stages (they add up to it), and what lies outside the app (HTTP, the client). The
    in-process call's tokenizer time is measured the same way as the server's ``tokenize``."""
    count = stages.get("count", 0.0)
    if count != len(times["server"]):  # another client, or a request refused: the sums are not these
        print(
            f"stages: {count:.0f} requests in /metrics against {len(times['server'])} sent", file=sys.stderr
        )
        return
    mean = {name: sum(values) / len(values) * 1e3 for name, values in times.items()}
    inside = stages["total"] / count * 1e3
    report.add("W5 1 client fresh", "mean latency, /v1/rerank 1 x 20 (client)", mean["server"], "ms",
               note=f"in process {mean['in-process']:.2f} ms; HTTP floor {mean['floor']:.2f} ms")  # fmt: skip
    report.add("W5 1 client fresh", "mean time inside the server's app", inside, "ms",
               note=f"outside it (the client, HTTP): {mean['server'] - inside:.2f} ms")  # fmt: skip
    for stage in STAGES:
        report.add("W5 1 client fresh", f"mean {stage} stage (server)", stages.get(stage, 0.0) / count * 1e3, "ms",
                   note="genscore_request_stage_seconds")  # fmt: skip
    tokenize = in_process_tokenize / len(times["in-process"]) * 1e3
    report.add("W4 fresh, in process", "mean time holding the tokenizer", tokenize, "ms",
               note=f"the rest of the call (the engine, host work): {mean['in-process'] - tokenize:.2f} ms")  # fmt: skip


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
    small = dry or args.cpu
    with tempfile.TemporaryDirectory(prefix="genscore-bench-") as tmp:
        folder = Path(tmp)
        model = build_model(
            "tiny" if small else args.shape, "cpu", torch.float32 if small else torch.bfloat16
        )
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        del model
        server_args = shlex.split(args.server_args) + (["--device", "cpu"] if args.cpu else [])
        proc, url = start_server(folder, server_args)
        try:
            if args.one_client:
                one_client(args, folder, proc, url, texts, report)
                return
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
        "--one-client",
        action="store_true",
        help="a lone client's p50 against the in-process call and the HTTP floor, instead of the levels",
    )
    parser.add_argument(
        "--requests", type=int, default=200, help="--one-client: requests (and calls) of each"
    )
    parser.add_argument("--block", type=int, default=20, help="--one-client: requests of each in a row")
    parser.add_argument(
        "--doc-words",
        type=int,
        default=0,
        help="--one-client: documents of N/2-N words (default: W4's 128-512); on the CPU, a small forward",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="the tiny model on the CPU in fp32 (with --one-client)"
    )
    parser.add_argument(
        "--server-args", default="", help='more `genscore serve` flags, e.g. "--batch-max-wait-ms 2"'
    )
    run_reported(parser, "bench_serve.py", run, dry_run="tiny model on the CPU: checks the script")


if __name__ == "__main__":
    main()
