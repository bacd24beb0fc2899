"""W5 alone: ``genscore serve`` under concurrent clients, several server variants in one run.

    PYTHONPATH=. python examples/benchmarks/bench_serve.py \\
        --variant "before|/path/to/main" --variant "after|.|--forward-batch-tokens 32768"
    PYTHONPATH=. python examples/benchmarks/bench_serve.py --dry-run    # the same code on the CPU

Builds bench_text.py's model (random-init Qwen3-Reranker-0.6B shape, bf16, the real Qwen3 tokenizer)
once, saves it, and for each ``--variant "NAME|TREE|FLAGS|ENV"`` starts a real ``genscore serve``
(``python -m genscore_core.server``) with ``TREE`` first on its ``PYTHONPATH`` (empty: this one),
the ``genscore serve`` flags ``FLAGS`` and the environment ``ENV`` (``K=V,K=V``). Variants run one
after the other, so a before/after is measured in the same call. For each variant and each client
count of ``--clients`` (default 32, then 1): a warm-up at that count, then a window in which each
client sends 1 x 20 ``/v1/rerank`` requests back to back (bench_text.py's W5 requests: documents of
128-512 words; ``--client httpx,raw`` measures each window with an ``httpx.AsyncClient`` and
again with a bare asyncio HTTP/1.1 connection, which tells the client's own time from the
server's). ``--steady-one`` sends every request body twice at one client before the one-client
window, so that each shape's CUDA graph is captured (steady state).

Reported per window: pairs/s, p50/p99 latency, requests per engine call, the most engine calls a
request waited behind (``/stats``), the share of the window the server spent inside engine calls
(``engine_seconds``), how the forward's batches ran (CUDA graph replays, captures, eager batches)
and the GPU's busy share (``nvidia-smi`` utilization, sampled every 100 ms). The scores of four
requests are compared across variants (largest difference). Writes ``$OUT/bench_serve.{md,json}``.

``--probe NAME`` starts that variant's server through ``serve_probe.py`` (``--via-probe NAME``: only
that, e.g. for its ``GENSCORE_PROBE_SWITCH_MS``) (the same application with
an engine-call log, a torch.profiler hook and a Python stack sampler) and, after its windows, runs a
diagnostic window at ``--probe-clients``: CPU time and run-queue wait of every thread of the server
(``/proc``), ``py-spy`` (``$PYSPY`` or on the PATH: native stacks of all threads idle included, a
few dumps, then who holds the interpreter lock), a torch.profiler trace of a few engine calls, and the
stack sampler. Everything goes to ``$OUT/probe-NAME.tar.gz``; ``probe_summary.py`` reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_text import (
    QWEN3_06B,
    TINY,
    build_model,
    client_load,
    load_tokenizer,
    make_text,
    save_model,
    word_list,
)
from bench_text import start_server as start_text_server
from bench_workloads import stop_server

PROBE_SCRIPT = Path(__file__).with_name("serve_probe.py")


@dataclass
class Variant:
    name: str
    tree: str = ""
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> Variant:
        name, tree, flags, env = [*spec.split("|"), "", "", ""][:4]
        pairs = [item.split("=", 1) for item in env.split(",") if item]
        return cls(name, tree, flags.split(), {k: v for k, v in pairs})


def start_server(
    folder: Path, variant: Variant, probe_dir: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A real server of ``variant``'s tree (first on its PYTHONPATH), flags and environment, once it
    answers /health; with ``probe_dir``, through serve_probe.py (writing its trace there)."""
    env = dict(os.environ, **variant.env)
    if variant.tree:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(variant.tree).resolve()), env.get("PYTHONPATH", "")])
    entry: tuple[str, ...] = ("-m", "genscore_core.server")
    if probe_dir is not None:
        env["GENSCORE_PROBE_DIR"] = str(probe_dir)
        entry = (str(PROBE_SCRIPT),)
    return start_text_server(folder, variant.flags, env, f"the server of {variant.name}", entry)


class GpuBusy:
    """The GPU's utilization (share of time a kernel ran) from ``nvidia-smi``, sampled every 100 ms."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> GpuBusy:
        if shutil.which("nvidia-smi") and torch.cuda.is_available():
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.samples: list[float] = []
        if self.proc is None:
            return
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        for line in out.split():
            try:
                self.samples.append(float(line))
            except ValueError:
                pass

    @property
    def mean(self) -> float | None:
        # The first samples may cover the time before the window.
        samples = self.samples[2:] or self.samples
        return statistics.fmean(samples) / 100 if samples else None


def diff(after: dict[str, Any], before: dict[str, Any], key: str) -> Any:
    a, b = after.get(key), before.get(key)
    if isinstance(a, dict):
        return {k: v - (b or {}).get(k, 0) for k, v in a.items() if isinstance(v, (int, float))}
    return None if a is None or b is None else a - b


def window(
    url: str,
    bodies: list[dict[str, Any]],
    clients: int,
    warmup_s: float,
    measure_s: float,
    client_kind: str = "httpx",
) -> dict[str, Any]:
    import httpx

    before = httpx.get(f"{url}/stats").json()
    gpu = GpuBusy()
    with gpu:
        load = asyncio.run(client_load(url, bodies, clients, warmup_s, measure_s, client_kind))
    after = httpx.get(f"{url}/stats").json()
    latencies = load.latencies
    if not latencies:
        return {"clients": clients, "client": client_kind, "error": "no request finished inside the window"}
    p50, p99 = load.quantile(0.5), load.quantile(0.99)
    waited = diff(after, before, "waited_batches") or {}
    batches = after["batches"] - before["batches"]
    requests = after["requests"] - before["requests"]
    engine_s = diff(after, before, "engine_seconds")
    return {
        "clients": clients,
        "client": client_kind,
        "pairs_per_s": load.pairs_per_s,
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
        "requests_per_call": requests / max(batches, 1),
        "waited_max": max((int(k) for k, v in waited.items() if v > 0), default=None),
        # engine_seconds counts the warm-up too: the share is of the whole time the clients ran.
        "engine_share": None if engine_s is None else engine_s / (warmup_s + measure_s),
        "ahead_share": None
        if "prepared_ahead" not in after
        else diff(after, before, "prepared_ahead") / max(batches, 1),
        "forward": diff(after, before, "forward"),
        "gpu_busy": gpu.mean,
        "latencies_ms": [x * 1e3 for x in latencies],
    }


def scores_of(url: str, bodies: list[dict[str, Any]]) -> list[list[float]]:
    import httpx

    out = []
    for body in bodies:
        results = httpx.post(f"{url}/v1/rerank", json=body, timeout=120).json()["results"]
        out.append([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    return out


def run_variant(
    folder: Path, variant: Variant, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    probe_dir = None
    if variant.name in args.probe or variant.name in args.via_probe:
        probe_dir = Path(tempfile.mkdtemp(prefix=f"probe-{variant.name}-"))
    proc, url = start_server(folder, variant, probe_dir)
    result: dict[str, Any] = {"name": variant.name, "tree": variant.tree, "flags": variant.flags,
                              "env": variant.env, "windows": []}  # fmt: skip
    try:
        asyncio.run(client_load(url, bodies, 4, 0.0, args.warmup))  # compilation, allocator
        result["scores"] = scores_of(url, bodies[:4])
        for clients in args.clients:
            if clients == 1 and args.steady_one:
                # Every body twice at one client: each shape a lone request makes is captured.
                scores_of(url, bodies + bodies)
            for kind in args.client:
                seen = len(probe_timeline(url)) if probe_dir is not None else 0
                w = window(url, bodies, clients, args.window_warmup, args.seconds, kind)
                if probe_dir is not None:  # the engine calls of this window (warm-up included)
                    w["timeline"] = probe_timeline(url)[seen:]
                result["windows"].append(w)
                print(f"  {variant.name} {clients} clients ({kind}): {summary(w)}", flush=True)
        if variant.name in args.probe and probe_dir is not None:
            result["probe"] = diagnose(proc, url, bodies, args, probe_dir)
    finally:
        stop_server(proc)
        if variant.name in args.probe and probe_dir is not None:
            pack(probe_dir, variant.name)
        elif probe_dir is not None:
            shutil.rmtree(probe_dir, ignore_errors=True)
    return result


def probe_timeline(url: str) -> list[dict[str, Any]]:
    """The engine calls a server started through serve_probe.py has answered so far (its timeline)."""
    import httpx

    return list(httpx.get(f"{url}/_probe/report", timeout=30).json()["timeline"])


# -- the diagnostic window (--probe) ------------------------------------------------------------


def thread_times(pid: int) -> dict[int, dict[str, Any]]:
    """Per thread of ``pid``: its name, and (schedstat) ns on a CPU, ns waiting for one, and context
    switches, from /proc; empty where /proc has no such files."""
    out: dict[int, dict[str, Any]] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            entry: dict[str, Any] = {"comm": (task / "comm").read_text().strip()}
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()[:3]
            entry["run_ns"], entry["wait_ns"] = int(run_ns), int(wait_ns)
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    key, value = line.split(":")
                    entry[key] = int(value)
            out[int(task.name)] = entry
        except (OSError, ValueError):
            continue
    return out


def thread_table(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], seconds: float, names: dict[int, str]
) -> list[dict[str, Any]]:
    """Per thread over ``seconds``: share of the time on a CPU and waiting for one, switches a second."""
    rows = []
    for tid, end in after.items():
        start = before.get(tid, {})
        row = {"tid": tid, "comm": end["comm"], "python": names.get(tid, "")}
        for key in ("run_ns", "wait_ns"):
            row[key.replace("_ns", "_share")] = (end.get(key, 0) - start.get(key, 0)) / 1e9 / seconds
        for key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            row[key + "_per_s"] = (end.get(key, 0) - start.get(key, 0)) / seconds
        rows.append(row)
    rows.sort(key=lambda r: -r["run_share"])
    return rows


def py_spy(cmd: list[str], log: list[str], timeout: float) -> None:
    exe = os.environ.get("PYSPY") or shutil.which("py-spy")
    if exe is None:
        log.append("py-spy not found")
        return
    try:
        done = subprocess.run([exe, *cmd], capture_output=True, text=True, timeout=timeout)
        log.append(
            f"$ py-spy {' '.join(cmd)}\nrc {done.returncode}\n{done.stdout[-20000:]}\n{done.stderr[-4000:]}"
        )
    except subprocess.TimeoutExpired:
        log.append(f"$ py-spy {' '.join(cmd)}: timed out after {timeout} s")


def diagnose(
    proc: subprocess.Popen[bytes],
    url: str,
    bodies: list[dict[str, Any]],
    args: argparse.Namespace,
    folder: Path,
) -> dict[str, Any]:
    """Load at ``--probe-clients`` while the server's threads are measured, sampled and profiled."""
    import httpx

    stop = threading.Event()
    load = threading.Thread(
        target=lambda: asyncio.run(steady_load(url, bodies, args.probe_clients, stop)), daemon=True
    )
    load.start()
    log: list[str] = []
    pid = proc.pid
    out: dict[str, Any] = {"clients": args.probe_clients}
    try:
        time.sleep(2.0)
        report = httpx.get(f"{url}/_probe/report", timeout=30).json()
        names = {tid: name for name, tid in report["threads"].items()}
        calls_before = len(report["calls"])
        before, t0 = thread_times(pid), time.perf_counter()
        with GpuBusy() as gpu:
            time.sleep(args.probe_seconds)
        after, t1 = thread_times(pid), time.perf_counter()
        out["threads"] = thread_table(before, after, t1 - t0, names)
        out["gpu_busy"] = gpu.mean
        out["calls_in_window"] = (
            len(httpx.get(f"{url}/_probe/report", timeout=30).json()["calls"]) - calls_before
        )
        spy = ["-p", str(pid)]
        py_spy(["record", "--native", "--idle", "--threads", "-r", "50", "-d", "4", "-f", "raw",
                "-o", str(folder / "pyspy_native.txt"), *spy], log, 60)  # fmt: skip
        for _ in range(2):
            py_spy(["dump", "--native", *spy], log, 30)
            time.sleep(0.3)
        py_spy(["record", "--gil", "--idle", "--threads", "--nonblocking", "-r", "200", "-d", "3", "-f", "raw",
                "-o", str(folder / "pyspy_gil.txt"), *spy], log, 60)  # fmt: skip
        httpx.post(f"{url}/_probe/profile", params={"calls": args.probe_calls}, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(f"{url}/_probe/profile", timeout=30).json()["state"] == "done":
                break
            time.sleep(0.5)
        httpx.post(f"{url}/_probe/sample", params={"seconds": 2.0, "interval_ms": 2.0}, timeout=30)
        time.sleep(2.5)
    finally:
        stop.set()
        load.join(timeout=180)
    report = httpx.get(f"{url}/_probe/report", timeout=30).json()
    (folder / "report.json").write_text(json.dumps(report))
    (folder / "threads.json").write_text(json.dumps(out, indent=1))
    (folder / "pyspy_log.txt").write_text("\n\n".join(log))
    for row in out["threads"][:12]:
        print(f"    {row['tid']} {row['comm']:<16} {row['python']:<24} on CPU {row['run_share']:.0%} "
              f"waiting for a CPU {row['wait_share']:.0%}", flush=True)  # fmt: skip
    return out


async def steady_load(url: str, bodies: list[dict[str, Any]], clients: int, stop: threading.Event) -> None:
    """``clients`` clients sending 1 x 20 requests back to back until ``stop`` is set."""
    import httpx

    async def one(index: int) -> None:
        async with httpx.AsyncClient(
            base_url=url, timeout=120.0, limits=httpx.Limits(max_connections=1)
        ) as c:
            k = index
            while not stop.is_set():
                (await c.post("/v1/rerank", json=bodies[k % len(bodies)])).raise_for_status()
                k += clients

    await asyncio.gather(*(one(i) for i in range(clients)))


def pack(folder: Path, name: str) -> None:
    """The probe's files as ``$OUT/probe-NAME.tar.gz`` (one file back from the device)."""
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with tarfile.open(Path(out, f"probe-{name}.tar.gz"), "w:gz") as tar:
            tar.add(folder, arcname=f"probe-{name}")
    shutil.rmtree(folder, ignore_errors=True)


def summary(w: dict[str, Any]) -> str:
    if "error" in w:
        return str(w["error"])
    parts = [f"{w['pairs_per_s']:,.0f} pairs/s", f"p50 {w['p50_ms']:.1f} ms", f"p99 {w['p99_ms']:.1f} ms",
             f"{w['requests_per_call']:.1f} req/call", f"waited <= {w['waited_max']}"]  # fmt: skip
    if w.get("engine_share") is not None:
        parts.append(f"in engine {w['engine_share']:.0%}")
    if w.get("ahead_share") is not None:
        parts.append(f"laid out ahead {w['ahead_share']:.0%}")
    if w.get("gpu_busy") is not None:
        parts.append(f"GPU busy {w['gpu_busy']:.0%}")
    if w.get("forward"):
        f = w["forward"]
        parts.append(
            f"batches: {f.get('graph_replays', 0)} replayed ({f.get('graph_captures', 0)} captured), "
            f"{f.get('eager_batches', 0)} eager"
        )
    return "; ".join(parts)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| variant | clients | client | pairs/s | p50 ms | p99 ms | req/call | waited | in engine | laid out ahead | GPU busy | batches (replayed / captured / eager) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in results:
        for w in r["windows"]:
            if "error" in w:
                lines.append(f"| {r['name']} | {w['clients']} | {w.get('client', 'httpx')} | {w['error']} |")
                continue
            f = w.get("forward") or {}
            share = "" if w.get("engine_share") is None else f"{w['engine_share']:.0%}"
            busy = "" if w.get("gpu_busy") is None else f"{w['gpu_busy']:.0%}"
            ahead = "" if w.get("ahead_share") is None else f"{w['ahead_share']:.0%}"
            lines.append(
                f"| {r['name']} | {w['clients']} | {w.get('client', 'httpx')} | {w['pairs_per_s']:,.0f} | {w['p50_ms']:.1f} | "
                f"{w['p99_ms']:.1f} | {w['requests_per_call']:.1f} | {w['waited_max']} | {share} | {ahead} | {busy} | "
                f"{f.get('graph_replays', '')} / {f.get('graph_captures', '')} / {f.get('eager_batches', '')} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, a tiny model, short windows")
    parser.add_argument("--variant", action="append", default=[], help='"NAME|TREE|FLAGS|ENV" (repeatable)')
    parser.add_argument("--clients", default="32,1", help="client counts, in order (default 32,1)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measuring window per client count")
    # Shorter windows read the start of a load (clients started together stay in step for seconds).
    parser.add_argument("--window-warmup", type=float, default=5.0, help="load before each window (s)")
    parser.add_argument("--warmup", type=float, default=10.0, help="4-client warm-up after start (s)")
    parser.add_argument(
        "--steady-one", action="store_true", help="every body twice before the 1-client window"
    )
    parser.add_argument(
        "--client",
        default="httpx",
        help="clients measured in turn, each a window of its own: httpx (httpx.AsyncClient) and/or raw "
        "(bench_text.RawHttp: one keep-alive connection, no client library), e.g. httpx,raw",
    )
    parser.add_argument("--probe", action="append", default=[], help="variant NAME to diagnose (repeatable)")
    parser.add_argument(
        "--via-probe",
        action="append",
        default=[],
        help="variant NAME started through serve_probe.py, not diagnosed",
    )
    parser.add_argument("--probe-clients", type=int, default=32, help="clients of the diagnostic window")
    parser.add_argument("--probe-seconds", type=float, default=4.0, help="/proc window of the diagnosis")
    parser.add_argument("--probe-calls", type=int, default=4, help="engine calls under torch.profiler")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.client = args.client.split(",")
    variants = [Variant.parse(v) for v in args.variant] or [Variant("this tree")]
    if args.dry_run:
        args.seconds, args.window_warmup, args.warmup = min(args.seconds, 2.0), 0.5, 1.0

    device = torch.device("cpu" if args.dry_run else "cuda")
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    rng = random.Random(5)
    work = make_text(rng, words, 64, 20, (128, 512))
    bodies = [{"query": q, "documents": docs} for q, docs in zip(work.queries, work.documents)]
    model = build_model(
        TINY if args.dry_run else QWEN3_06B, device, torch.float32 if args.dry_run else torch.bfloat16
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    header = f"bench_serve {stamp}; GPU {gpu}; torch {torch.__version__}; {os.cpu_count()} CPUs"
    print(header, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="genscore-serve-"))
    results = []
    try:
        save_model(model, tokenizer, folder)
        del model
        if not args.dry_run:
            torch.cuda.empty_cache()
        for variant in variants:
            try:
                results.append(run_variant(folder, variant, bodies, args))
            except Exception as error:  # reported; the other variants still run
                print(f"variant {variant.name} failed: {error!r}", flush=True)
                results.append({"name": variant.name, "windows": [], "error": repr(error)})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    notes = []
    scored = [r for r in results if r.get("scores")]
    for r in scored[1:]:
        worst = max(abs(a - b) for x, y in zip(r["scores"], scored[0]["scores"]) for a, b in zip(x, y))
        notes.append(f"scores of {r['name']} against {scored[0]['name']}: largest difference {worst:.2e}")
    text = header + "\n\n" + table(results) + "\n\n" + "\n".join(notes) + "\n"
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "bench_serve.md").write_text(text)
        Path(out, "bench_serve.json").write_text(json.dumps({"header": header, "results": results}, indent=1))
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
