"""Where a large text-in call loses the GPU: W1 text in and the engine alone under variants of the
interpreter's switch interval and of the packed decoder's CUDA graphs, and W5 (32 clients) likewise.

    OUT=out PYTHONPATH=<tree> python examples/benchmarks/probe_overlap.py --label new
    python examples/benchmarks/probe_overlap.py --compare out/main.json out/new.json

Each variant is a scorer of its own over the same model (random-init Qwen3-Reranker-0.6B shape, bf16)
and W1's text of ``bench_text.py`` (1 query x 256 documents of 128-512 words). Text-in and engine-alone
calls are timed in turn, medians of ``--repeats``; the switch interval is set around the timed calls
only (``sys.setswitchinterval``, process-wide) and restored. Scores of every variant are written out,
so that ``--compare`` can give the largest difference between variants and between trees. W5 starts
``python -m genscore_core.server`` of the tree on the PYTHONPATH (with the switch interval set before
the server starts) and runs 32 clients sending 1 x 20 ``/v1/rerank`` requests for ``--server-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_text import (
    QWEN3_06B,
    TINY,
    build_model,
    client_load,
    free_port,
    load_tokenizer,
    make_text,
    save_model,
    word_list,
)
from bench_workloads import stop_server, sync

from genscore_core import GenerativeScorer
from genscore_core.engine import ScoringEngine
from genscore_core.packed import PackedForward
from genscore_core.packed.decoder import PackedOptions
from genscore_core.scoring import LabelHead


def options(**wanted: Any) -> PackedOptions | None:
    """PackedOptions with the fields this tree has (None when it lacks one: skip the variant)."""
    if any(name not in PackedOptions.model_fields for name in wanted):
        return None
    return PackedOptions(**wanted)


EAGER = {"large_graph_tokens": 0, "graph_prefixes": False}
VARIANTS: dict[str, tuple[dict[str, Any], float, dict[str, Any] | None]] = {
    # name: (PackedOptions fields, switch interval in seconds, stream settings or None: rerank)
    "defaults": ({}, 0.005, None),
    "graphs of large/prefix batches off": (EAGER, 0.005, None),
    "eager; first 4k tokens": (EAGER, 0.005, {"first_batch_tokens": 4096}),
    "eager; growth 1.5": (EAGER, 0.005, {"batch_growth": 1.5}),
    "eager; first 4k, growth 1.5, parts 16k/32k chars": (
        EAGER,
        0.005,
        {"first_batch_tokens": 4096, "batch_growth": 1.5, "first_part_chars": 16000, "part_chars": 32000},
    ),
    "eager; parts 24k/16k chars": (EAGER, 0.005, {"part_chars": 16000}),
    "graphs; growth 1.5, parts 16k/32k chars": (
        {},
        0.005,
        {"batch_growth": 1.5, "first_part_chars": 16000, "part_chars": 32000},
    ),
    # The third round (host time around the GPU work): the stream's part and first-batch sizes.
    "stream; defaults": ({}, 0.005, {}),
    "stream; parts built in turn": ({}, 0.005, {"build_ahead": False}),
    "stream; first batch waits to fill": ({}, 0.005, {"first_batch_early": False}),
    "stream; first batch 2k, first part 12k chars": (
        {},
        0.005,
        {"first_batch_tokens": 2048, "first_part_chars": 12000},
    ),
    "stream; first part 36k chars": ({}, 0.005, {"first_part_chars": 36000}),
    "stream; later parts 32k chars": ({}, 0.005, {"part_chars": 32000}),
    # Fewer, larger later batches (2026-12-02): GEMMs of a few thousand rows run below the rate of
    # the engine alone's 64k-row ones; "defaults, again" closes the run to show its drift.
    "stream; growth 2.5": ({}, 0.005, {"batch_growth": 2.5}),
    "stream; growth 3": ({}, 0.005, {"batch_growth": 3.0}),
    "stream; growth 4": ({}, 0.005, {"batch_growth": 4.0}),
    # Batches capped (the forward's ``max_batch_tokens``, so the engine alone's batches too): a
    # layer's products ran 43-44 us per 1k rows at 8k-16k rows against 46.5 at 32k-64k (gemm rates
    # of 2026-12-02), whose activations no longer fit the 50 MB L2.
    "rerank; batches of at most 16k": ({"max_batch_tokens": 16384}, 0.005, None),
    "stream; batches of at most 16k": ({"max_batch_tokens": 16384}, 0.005, {}),
    "stream; at most 16k, gate/up by cuBLAS": (
        {"max_batch_tokens": 16384, "gated_mlp_max_tokens": 1},
        0.005,
        {},
    ),
    "stream; at most 16k, gate/up by Triton": (
        {"max_batch_tokens": 16384, "gated_mlp_max_tokens": 65536},
        0.005,
        {},
    ),
    "stream; batches of at most 8k": ({"max_batch_tokens": 8192}, 0.005, {}),
    "stream; batches of at most 24k": ({"max_batch_tokens": 24576}, 0.005, {}),
    "stream; defaults, again": ({}, 0.005, {}),
}


FRONT_END_SETTINGS = {"first_part_chars", "part_chars", "build_ahead"}
"""Settings of ``stream_pairs``; the others are ``score_stream``'s."""


class GcWatch:
    """The garbage collector's passes while the timed calls run (``gc.callbacks``): how many of each
    generation, their total and longest time, and the objects it tracks at the end."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self._began = 0.0

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.passes.append((info["generation"], time.perf_counter() - self._began))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)

    def summary(self) -> dict[str, Any]:
        return {
            "passes": [sum(1 for g, _ in self.passes if g == gen) for gen in range(3)],
            "ms": round(sum(t for _, t in self.passes) * 1e3, 1),
            "longest_ms": round(max((t for _, t in self.passes), default=0.0) * 1e3, 1),
            "tracked": len(gc.get_objects()),
        }


def stream_text(
    scorer: Any, engine: Any, query: str, docs: list[str], settings: dict[str, Any]
) -> list[float]:
    """The scorer's streamed text path (``_score_texts``) with other batch and part sizes."""
    chars = {k: v for k, v in settings.items() if k in FRONT_END_SETTINGS}
    planning = {k: v for k, v in settings.items() if k not in FRONT_END_SETTINGS}
    stream = scorer.front_end.stream_pairs([(query, d) for d in docs], **chars)
    scores = engine.score_stream(stream.jobs, stream.parts(), **planning)
    return [score for score, _ in stream.assemble(scores)]


def graph_check(engine: Any, call: Any) -> list[str]:
    """Each batch of ``call`` run eagerly and then through :meth:`decode` (graphs): NaNs and the
    largest difference of the rows and saved prefixes, with the batch's graph shape."""
    forward = engine.forward
    graphs = forward.graphs
    decode = forward.decode
    lines: list[str] = []

    def checked(packed: Any, dev: Any, loaded: Any, **kw: Any) -> Any:
        forward.graphs = None
        eager = decode(packed, dev, loaded, **kw)
        forward.graphs = graphs
        out = decode(packed, dev, loaded, **kw)
        diff = (eager[0] - out[0]).abs().max().item()
        saved = (
            ""
            if eager[1] is None or out[1] is None
            else f"{(eager[1][0] - out[1][0]).abs().max().item():.1e}"
        )
        lines.append(
            f"tokens {packed.num_tokens} segments {len(packed.segments)} load {packed.kv_len - packed.num_tokens} "
            f"shape {graphs.shape_for(packed) if graphs else None}: nan eager {int(eager[0].isnan().sum())} "
            f"graph {int(out[0].isnan().sum())}; max diff {diff:.1e}; saved diff {saved}; "
            f"captures {graphs.captures if graphs else 0}"
        )
        return out

    forward.decode = checked
    try:
        for _ in range(3):
            try:
                call()
            except Exception as error:  # reported, the check goes on
                lines.append(f"call failed: {error!r}")
    finally:
        del forward.decode
    return lines


def gpu_busy(call: Any) -> tuple[float, float, float]:
    """(wall ms, kernel ms, ms to the first kernel) of one call under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        call()
        sync()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    busy = sum(e.device_time for e in kernels) / 1e3
    first = min((e.time_range.start for e in kernels), default=0)
    begin = min((e.time_range.start for e in prof.events()), default=0)
    return round(wall * 1e3, 1), round(busy, 1), round((first - begin) / 1e3, 1)


def timeline(engine: Any, call: Any, front_end: Any = None) -> list[dict[str, float]]:
    """Per batch of one call (ms from its start): when the producer had it laid out, when the
    launching thread began and finished launching it, and when the GPU began and finished it.

    With ``front_end``, a last row of host marks too: when each part of documents began and ended
    being built (tokenized) on the producer thread, when the forward handed back the rows, when the
    label head was first called, when the last scores were checked (after the wait for the device)
    and when ``rank_results`` began and ended (a rerank only)."""
    import genscore_core.engine as engine_module
    import genscore_core.scorer as scorer_module

    forward = engine.forward
    rows: list[dict[str, float]] = []
    marks: list[tuple[Any, Any]] = []
    host: dict[str, Any] = {"parts": []}
    start_event = torch.cuda.Event(enable_timing=True)
    prepare, decode = forward.prepare_stream_batch, forward.decode
    run_stream, head_scores = forward.run_stream, engine.head.scores
    check, rank = engine_module.check_scores, scorer_module.rank_results
    builder = front_end._builder if front_end is not None else None
    build = builder.build if builder is not None else None
    t0 = 0.0

    def now() -> float:
        return round((time.perf_counter() - t0) * 1e3, 2)

    def built(*args: Any, **kw: Any) -> Any:
        begin = now()
        done = build(*args, **kw)  # type: ignore[misc]
        host["parts"].append((begin, now(), len(done)))
        return done

    def ran(*args: Any, **kw: Any) -> Any:
        done = run_stream(*args, **kw)
        host["forward_returned"] = now()
        return done

    def head(*args: Any, **kw: Any) -> Any:
        host.setdefault("head_first", now())
        return head_scores(*args, **kw)

    def checked(*args: Any, **kw: Any) -> Any:
        done = check(*args, **kw)
        host["checked_last"] = now()
        return done

    def ranked(*args: Any, **kw: Any) -> Any:
        host["rank_begin"] = now()
        done = rank(*args, **kw)
        host["rank_end"] = now()
        return done

    def prepared(batch: Any) -> Any:
        done = prepare(batch)
        rows.append({"ready": (time.perf_counter() - t0) * 1e3, "tokens": float(batch.tokens)})
        return done

    def decoded(packed: Any, dev: Any, loaded: Any, **kw: Any) -> Any:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launch = time.perf_counter()
        begin.record()
        out = decode(packed, dev, loaded, **kw)
        end.record()
        marks.append((begin, end))
        rows[len(marks) - 1].update(
            launch=(launch - t0) * 1e3,
            launched=(time.perf_counter() - t0) * 1e3,
            padded=float(packed.num_tokens),
        )
        return out

    forward.prepare_stream_batch, forward.decode = prepared, decoded
    if front_end is not None:
        forward.run_stream, engine.head.scores = ran, head
        engine_module.check_scores, scorer_module.rank_results = checked, ranked  # type: ignore[assignment]
        if builder is not None:
            builder.build = built
    try:
        sync()
        t0 = time.perf_counter()
        start_event.record()
        call()
        sync()
        total = (time.perf_counter() - t0) * 1e3
    finally:
        del forward.prepare_stream_batch, forward.decode
        if front_end is not None:
            del forward.run_stream, engine.head.scores
            engine_module.check_scores, scorer_module.rank_results = check, rank  # type: ignore[assignment]
            if builder is not None:
                del builder.build
    for row, (begin, end) in zip(rows, marks):
        row["gpu_begin"] = start_event.elapsed_time(begin)
        row["gpu_end"] = start_event.elapsed_time(end)
    rows.append({"total": total})
    if front_end is not None:
        rows.append(host)
    return rows


def measure_w1(args: argparse.Namespace, out: dict[str, Any]) -> None:
    dry = args.dry_run
    device = torch.device("cpu" if dry else "cuda")
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    w1 = make_text(random.Random(0), words, 1, 32 if dry else 256, (128, 512))
    model = build_model(TINY if dry else QWEN3_06B, device, torch.float32 if dry else torch.bfloat16)
    base = GenerativeScorer.from_model(model, tokenizer, **({"forward": "packed"} if dry else {}))
    query, docs = w1.queries[0], w1.documents[0]
    jobs = base.prepare_pairs(w1.pairs).jobs
    default_interval = sys.getswitchinterval()
    import inspect

    streamed = set(inspect.signature(ScoringEngine.score_stream).parameters)
    streamed |= set(inspect.signature(type(base.front_end).stream_pairs).parameters)
    for name in args.variants or VARIANTS:  # in the order asked for, so that a run can repeat one
        fields, interval, settings = VARIANTS[name]
        fields = dict(fields)
        budget = {"max_batch_tokens": fields.pop("max_batch_tokens")} if "max_batch_tokens" in fields else {}
        opts = options(**fields)
        if opts is None or (settings and not set(settings) <= streamed):
            print(f"{name}: this tree has no such options, skipped", flush=True)
            continue
        engine = ScoringEngine(model, PackedForward(model, options=opts, **budget), LabelHead(model))
        scorer = GenerativeScorer(front_end=base.front_end, backend=engine)
        if not dry:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if not dry else 0

        def calls(scorer: Any, engine: Any, settings: Any = settings) -> tuple[Any, Any]:
            def call_text() -> list[float]:
                if settings is None:
                    got = [0.0] * len(docs)
                    for r in scorer.rerank(query, docs):
                        got[r.index] = r.score
                    return got
                return stream_text(scorer, engine, query, docs, settings)

            return call_text, lambda: engine.score_jobs(jobs)

        prefix_graphs = "graph_prefixes" in PackedOptions.model_fields and fields.get("graph_prefixes", True)
        first = name == next(iter(args.variants or VARIANTS))
        checks = not args.no_graph_check and (not args.graph_check_first or first)
        if not dry and engine.forward.graphs is not None and prefix_graphs and checks:
            for check in (calls(scorer, engine)[0], calls(scorer, engine)[1]):
                for line in graph_check(engine, check):
                    print("   graph check:", line, flush=True)
            engine = ScoringEngine(model, PackedForward(model, options=opts, **budget), LabelHead(model))
            scorer = GenerativeScorer(front_end=base.front_end, backend=engine)
        text, alone = calls(scorer, engine)
        t_text: list[float] = []
        t_engine: list[float] = []
        sys.setswitchinterval(interval)
        collections = GcWatch()
        try:
            for _ in range(3):  # a shape is captured the second time it is seen
                text()
                alone()
            with collections:
                for _ in range(args.repeats):
                    for fn, times in ((text, t_text), (alone, t_engine)):
                        sync()
                        start = time.perf_counter()
                        fn()
                        sync()
                        times.append(time.perf_counter() - start)
            busy = None if dry or args.no_gpu_busy else gpu_busy(text)
            line = None if dry else timeline(engine, text, scorer.front_end)
            got = text()
            engine_scores = alone()[0]
        except Exception as error:  # one variant failing leaves the others
            print(f"{args.label} | {name} | FAILED: {error!r}", flush=True)
            continue
        finally:
            sys.setswitchinterval(default_interval)
        graphs = engine.forward.graphs
        row = {
            "text_s": t_text,
            "engine_s": t_engine,
            "text_pairs_per_s": len(docs) / statistics.median(t_text),
            "engine_pairs_per_s": len(docs) / statistics.median(t_engine),
            "scores": got,
            "engine_scores": engine_scores,
            "gpu_busy": busy,
            "timeline": line,
            "graphs": None if graphs is None else [graphs.captures, graphs.replays, len(graphs.graphs)],
            "peak_allocated_gib": (torch.cuda.max_memory_allocated() - before) / 2**30 if not dry else 0.0,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30 if not dry else 0.0,
            "gc": collections.summary(),
        }
        repeat = sum(1 for key in out["w1"] if key == name or key.startswith(f"{name} ("))
        out["w1"][name if not repeat else f"{name} ({repeat + 1})"] = row
        print(
            f"{args.label} | {name} | text {row['text_pairs_per_s']:,.0f} | engine {row['engine_pairs_per_s']:,.0f} "
            f"| {row['text_pairs_per_s'] / row['engine_pairs_per_s']:.1%} | busy {busy} | graphs {row['graphs']} "
            f"| peak {row['peak_allocated_gib']:.2f} GiB, reserved {row['reserved_gib']:.2f} GiB | gc {row['gc']}",
            flush=True,
        )
        for step in line or []:
            print("   ", {k: round(v, 1) if isinstance(v, float) else v for k, v in step.items()}, flush=True)
        del scorer, engine
    if args.server_seconds > 0:
        folder = Path(tempfile.mkdtemp(prefix="genscore-probe-"))
        try:
            save_model(model, tokenizer, folder)
            del base, model
            if not dry:
                torch.cuda.empty_cache()
            for interval in args.server_intervals:
                try:
                    out["w5"][str(interval)] = serve(folder, words, interval, args)
                except Exception as error:  # reported; the W1 figures stay
                    print(f"{args.label} | W5 switch {interval} FAILED: {error!r}", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def serve(folder: Path, words: list[str], interval: float, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    port = free_port()
    code = (
        f"import sys, runpy; sys.setswitchinterval({interval}); "
        "sys.argv = ['genscore_core.server'] + sys.argv[1:]; "
        "runpy.run_module('genscore_core.server', run_name='__main__')"
    )
    cmd = [sys.executable, "-c", code, "--model", str(folder), "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        work = make_text(random.Random(5), words, 64, 20, (128, 512))
        bodies = [{"query": q, "documents": d} for q, d in zip(work.queries, work.documents)]
        asyncio.run(client_load(url, bodies, 32, 0.0, args.server_warmup))
        before = httpx.get(f"{url}/stats").json()
        load = asyncio.run(client_load(url, bodies, 32, 1.0, args.server_seconds))
        after = httpx.get(f"{url}/stats").json()
    finally:
        stop_server(proc)
    p50, p99 = load.quantile(0.5), load.quantile(0.99)
    calls = after["batches"] - before["batches"]
    result = {
        "pairs_per_s": load.pairs_per_s,
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
        "requests_a_call": (after["requests"] - before["requests"]) / max(calls, 1),
        "waited": {
            k: v - before.get("waited_batches", {}).get(k, 0)
            for k, v in after.get("waited_batches", {}).items()
        },
    }
    print(f"{args.label} | W5 32 clients, switch {interval * 1e3:g} ms | {result}", flush=True)
    return result


def compare(paths: list[Path]) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in paths}
    first = next(iter(runs.values()))
    ref = next(iter(first["w1"].values()))
    print(
        "| tree | variant | W1 text in pairs/s | engine alone pairs/s | text / engine | max diff text vs first | max diff engine vs first | peak alloc GiB | reserved GiB | graphs (captures, replays, kept) | text in profiled: wall, kernels, first kernel (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for tree, run in runs.items():
        for name, row in run["w1"].items():
            d_text = max(abs(a - b) for a, b in zip(row["scores"], ref["scores"]))
            d_engine = max(abs(a - b) for a, b in zip(row["engine_scores"], ref["engine_scores"]))
            print(
                f"| {tree} | {name} | {row['text_pairs_per_s']:,.0f} ({min(row['text_s']) * 1e3:.0f}-{max(row['text_s']) * 1e3:.0f} ms) "
                f"| {row['engine_pairs_per_s']:,.0f} | {row['text_pairs_per_s'] / row['engine_pairs_per_s']:.1%} "
                f"| {d_text:.1e} | {d_engine:.1e} | {row['peak_allocated_gib']:.2f} | {row['reserved_gib']:.2f} | {row['graphs']} | {row.get('gpu_busy')} |"
            )
    print()
    timeline_table(runs)
    print()
    print(
        "| tree | switch interval (s) | W5 32 clients pairs/s | p50 ms | p99 ms | p99/p50 | requests a call | waited |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for tree, run in runs.items():
        for interval, r in run["w5"].items():
            print(
                f"| {tree} | {interval} | {r['pairs_per_s']:,.0f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} "
                f"| {r['p99_ms'] / r['p50_ms']:.1f} | {r['requests_a_call']:.1f} | {r['waited']} |"
            )


def timeline_table(runs: dict[str, Any]) -> None:
    """One timed call of each variant (ms from its start): the first batch laid out and begun on the
    GPU, the GPU's idle time between its first and last batch, its end, the call's end, and the
    host marks (parts built, the wait for the scores, the ranking)."""
    print(
        "| tree | variant | batches (tokens) | first batch laid out | GPU begins | GPU idle between batches "
        "| GPU ends | call ends | parts built (end of 1st, 2nd, last) | forward returned | scores checked | ranked |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for tree, run in runs.items():
        for name, row in run["w1"].items():
            line = row.get("timeline")
            if not line:
                continue
            batches = [r for r in line if "gpu_begin" in r]
            total = next((r["total"] for r in line if "total" in r), float("nan"))
            host = next((r for r in line if "parts" in r), {})
            idle = sum(max(0.0, b["gpu_begin"] - a["gpu_end"]) for a, b in itertools.pairwise(batches))
            parts = host.get("parts", [])
            built = ", ".join(f"{p[1]:.1f}" for p in (parts[:2] + parts[-1:])) if parts else ""
            print(
                f"| {tree} | {name} | {' / '.join(str(int(b['tokens'])) for b in batches)} "
                f"| {batches[0]['ready']:.1f} | {batches[0]['gpu_begin']:.1f} | {idle:.1f} "
                f"| {batches[-1]['gpu_end']:.1f} | {total:.1f} | {built} ({len(parts)} parts) "
                f"| {host.get('forward_returned', float('nan')):.1f} | {host.get('checked_last', float('nan')):.1f} "
                f"| {host.get('rank_end', float('nan')):.1f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--label", default="tree")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--server-seconds", type=float, default=5.0, help="0: no W5")
    parser.add_argument("--server-warmup", type=float, default=4.0)
    parser.add_argument("--server-intervals", type=float, nargs="*", default=[0.005, 1e-4])
    parser.add_argument("--compare", type=Path, nargs="*")
    parser.add_argument("--variants", nargs="*", help="names of the variants to run (default: all)")
    parser.add_argument(
        "--graph-check-first",
        action="store_true",
        help="check graphs against eager batches in the first variant only",
    )
    parser.add_argument(
        "--no-graph-check", action="store_true", help="no check of graphs against eager batches"
    )
    parser.add_argument("--no-gpu-busy", action="store_true", help="skip the profiled call (GPU busy time)")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    out: dict[str, Any] = {"label": args.label, "w1": {}, "w5": {}}
    measure_w1(args, out)
    folder = Path(os.environ.get("OUT", "."))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{args.label}.json").write_text(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
