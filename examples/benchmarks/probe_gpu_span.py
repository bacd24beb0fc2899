"""Where a call's time goes between its kernels: W1 and W4, text in and the engine alone, on the GPU.

    OUT=out PYTHONPATH=. python examples/benchmarks/probe_gpu_span.py [--no-blas]

For each of W1 text in (``rerank``, 1 x 256 documents of 128-512 words), the W1 engine alone (the same
prompts as token-id jobs), W4 text in (1 x 20) and the W4 engine alone, it gives the median call time,
then one call under torch.profiler: kernel time by kind, the GPU's span from the first kernel to the
last, the idle time inside that span by gap size and by the pair of kernel kinds around each gap, the
cuBLAS kernels chosen, and how long the call ran before its first kernel and after its last. Then
(unless ``--no-blas``) the W1 engine alone with ``torch.backends.cuda.preferred_blas_library`` set to
cuBLAS and to cuBLASLt in turn, three rounds, medians of 7 calls.

The profiler slows the host: a streamed text call's producer thread falls behind under it, so idle
time inside a text call's span reads higher than without it (probe_overlap.py's CUDA-event timeline
measures that without the profiler). Kernel durations are the device's own. Without a GPU the same code
runs on the CPU with tiny shapes (no kernels to report), as a check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_text import QWEN3_06B, TINY, build_model, engine_jobs, load_tokenizer, make_text, word_list
from profile_small_call import category, trace_summary

from genscore_core import GenerativeScorer

GAP_BUCKETS = ((2.0, "<2us"), (5.0, "2-5us"), (20.0, "5-20us"), (100.0, "20-100us"), (float("inf"), ">100us"))


def kind(name: str) -> str:
    return "gated_mlp (fused)" if "gated_mlp" in name.lower() else category(name)


def gaps(kernels: list[dict[str, Any]]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Idle time inside the span: by gap size (count, ms) and by the kinds of the kernels around it."""
    by_size: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_pair: dict[str, float] = defaultdict(float)
    end = None
    before = ""
    for k in kernels:
        if end is not None and k["ts"] > end:
            gap = k["ts"] - end
            label = next(label for bound, label in GAP_BUCKETS if gap < bound)
            by_size[label][0] += 1
            by_size[label][1] += gap / 1e3
            by_pair[f"{kind(before)} -> {kind(k['name'])}"] += gap / 1e3
        if end is None or k["ts"] + k["dur"] > end:
            end = k["ts"] + k["dur"]
        before = k["name"]
    return dict(by_size), dict(sorted(by_pair.items(), key=lambda kv: -kv[1])[:8])


def profiled(call: Callable[[], Any], sync: Callable[[], None]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile, record_function

    call()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        with record_function("call"):
            call()
            sync()
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    summary = trace_summary(trace)
    kernels = sorted(
        (
            e
            for e in trace["traceEvents"]
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e
        ),
        key=lambda e: e["ts"],
    )
    by_kind: dict[str, float] = defaultdict(float)
    gemms: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        by_kind[kind(k["name"])] += k["dur"] / 1e3
        if kind(k["name"]) == "GEMM":
            gemms[k["name"][:60]][0] += 1
            gemms[k["name"][:60]][1] += k["dur"] / 1e3
    summary["by_kind_ms"] = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
    summary["gaps_by_size"], summary["gaps_by_kinds"] = gaps(kernels)
    summary["gemm_kernels"] = dict(sorted(gemms.items(), key=lambda kv: -kv[1][1])[:6])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--no-blas", action="store_true", help="skip the cuBLAS / cuBLASLt comparison")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    rng = random.Random(0)
    w1 = make_text(rng, words, 1, 256 if gpu else 24, (128, 512))
    w4 = make_text(rng, words, 1, 20 if gpu else 4, (128, 512))
    model = build_model(QWEN3_06B if gpu else TINY, torch.device("cuda" if gpu else "cpu"),
                        torch.bfloat16 if gpu else torch.float32)  # fmt: skip
    scorer = GenerativeScorer.from_model(model, tokenizer, forward="packed")
    engine = scorer.backend
    jobs1, jobs4 = engine_jobs(scorer, w1.pairs), engine_jobs(scorer, w4.pairs)
    calls: dict[str, Callable[[], Any]] = {
        "W1 text in": lambda: scorer.rerank(w1.queries[0], w1.documents[0]),
        "W1 engine alone": lambda: engine.score_jobs(jobs1),
        "W4 text in": lambda: scorer.rerank(w4.queries[0], w4.documents[0]),
        "W4 engine alone": lambda: engine.score_jobs(jobs4),
    }

    def median_ms(call: Callable[[], Any], n: int) -> tuple[float, float, float]:
        times = []
        for _ in range(n):
            sync()
            start = time.perf_counter()
            call()
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), min(times), max(times)

    for call in calls.values():  # the second sight of a shape captures its graph; replays after
        for _ in range(3):
            call()
    sync()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if gpu else "cpu", "calls": {}}
    for name, call in calls.items():
        med, low, high = median_ms(call, 9 if name.startswith("W1") else 30)
        report["calls"][name] = {
            "median_ms": med,
            "min_ms": low,
            "max_ms": high,
            "profile": profiled(call, sync),
        }
        p = report["calls"][name]["profile"]
        print(f"== {name}: median {med:.2f} ms (min {low:.2f}, max {high:.2f})")
        for key in ("call_us", "first_kernel_after_us", "gpu_span_us", "gpu_busy_us", "gpu_idle_in_span_us",
                    "after_last_kernel_us"):  # fmt: skip
            value = p.get(key)
            print(f"  {key[:-3]} ms: {value / 1e3:.2f}" if isinstance(value, float) else f"  {key}: {value}")
        print("  kernels ms by kind:", {k: round(v, 2) for k, v in p["by_kind_ms"].items()})
        print(
            "  idle by gap size (count, ms):",
            {k: [c, round(v, 2)] for k, (c, v) in p["gaps_by_size"].items()},
        )
        print("  idle by kinds around it (ms):", {k: round(v, 2) for k, v in p["gaps_by_kinds"].items()})
        print(
            "  cuBLAS kernels (count, ms):", {k: [c, round(v, 2)] for k, (c, v) in p["gemm_kernels"].items()}
        )
    blas: dict[str, list[float]] = defaultdict(list)
    if gpu and not args.no_blas:
        for _ in range(3):
            for library in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(library)
                for _ in range(2):
                    calls["W1 engine alone"]()
                blas[library].append(median_ms(calls["W1 engine alone"], 7)[0])
        torch.backends.cuda.preferred_blas_library("cublas")
    report["blas_w1_engine_ms"] = dict(blas)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "probe_gpu_span.json").write_text(json.dumps(report, default=float))
    print(
        "\n| call | median ms | kernels ms | GPU span ms | idle in span ms | before first kernel ms | after last ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in report["calls"].items():
        p = row["profile"]
        print(f"| {name} | {row['median_ms']:.2f} | {p['gpu_busy_us'] / 1e3:.2f} | {p['gpu_span_us'] / 1e3:.2f} "
              f"| {p['gpu_idle_in_span_us'] / 1e3:.2f} | {(p['first_kernel_after_us'] or 0) / 1e3:.2f} "
              f"| {(p['after_last_kernel_us'] or 0) / 1e3:.2f} |")  # fmt: skip
    for library, medians in blas.items():
        print(
            f"| W1 engine alone, {library} preferred | {', '.join(f'{m:.2f}' for m in medians)} | | | | | |"
        )


if __name__ == "__main__":
    main()
