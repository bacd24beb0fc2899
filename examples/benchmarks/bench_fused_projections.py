"""One q/k/v GEMM and one gate/up GEMM per layer against the five separate products, engine alone.

    PYTHONPATH=. python examples/benchmarks/bench_fused_projections.py [--dry-run]

One process, one GPU, one random-init Qwen3-Reranker-0.6B-shape model in bf16 (token-id jobs as
``bench_ab.py``: W1 = one query and 256 documents, W4 = one query and 20):

* two engines over the same model, ``PackedOptions(fused_projections=False)`` ("separate": q, k, v,
  gate and up as five cuBLAS products a layer, what main ran) and the default ("fused": one q/k/v and
  one gate/up product, the model's weights re-pointed to views of the fused tensors), calls
  alternating between them, medians;
* the largest score difference between the two, and each one's error against the same engine on a
  float32 copy of the model;
* memory: allocated after the model, after both engines were built (the fused weights must not be a
  second copy), and the peak of one W1 call beyond what was allocated before it (an engine without
  CUDA graphs, so its buffers are its own);
* the paired differences of the alternating calls (fused minus the separate call of the same round; the layout that goes first alternates);
* one profiled call of each layout without CUDA graphs (so each product is attributed to its shape):
  kernel ms by kind, and each GEMM shape's ms and TFLOP/s.

``--dry-run`` runs the same code on the CPU (Triton's interpreter, float32, a tiny model). Prints the
tables last and writes ``$OUT/bench_fused_projections.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_gated_mlp import kind_of, models_and_jobs  # noqa: E402

from genscore_core.engine import ScoringEngine  # noqa: E402
from genscore_core.packed import PackedForward, PackedOptions  # noqa: E402
from genscore_core.scoring import LabelHead  # noqa: E402

LAYOUTS = {"separate": False, "fused": True}


def sync() -> None:
    if torch.cuda.is_available() and not DRY:
        torch.cuda.synchronize()


def engine(model: Any, fused: bool, graphs: bool = True) -> ScoringEngine:
    options = PackedOptions(fused_projections=fused)
    if not graphs:
        options = PackedOptions(fused_projections=fused, graph_tokens=0, large_graph_tokens=0)
    return ScoringEngine(model, PackedForward(model, options=options), LabelHead(model))  # type: ignore[arg-type]


def profiled(call: Callable[[], Any]) -> dict[str, Any]:
    """Kernel ms by kind, and per GEMM shape (K, N) its ms, TFLOP/s and launches, over one call."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])
    with profile(activities=activities, record_shapes=True) as prof:
        call()
        sync()
    kinds: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type.name == "CUDA":
            kinds[kind_of(event.name)] += event.device_time / 1e3
    gemms: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for avg in prof.key_averages(group_by_input_shape=True):
        if avg.key not in ("aten::mm", "aten::addmm"):
            continue
        shapes = avg.input_shapes
        (m, k), (_, n) = (shapes[0], shapes[1]) if avg.key == "aten::mm" else (shapes[1], shapes[2])
        entry = gemms[f"K={k} N={n}"]
        entry[0] += getattr(avg, "device_time_total", 0.0) / 1e3
        entry[1] += 2.0 * m * k * n * avg.count
        entry[2] += avg.count
    table = {
        key: {"ms": round(ms, 3), "tflops": round(flop / ms / 1e9, 1) if ms else None, "launches": int(c)}
        for key, (ms, flop, c) in sorted(gemms.items())
    }
    return {"kinds_ms": {k: round(v, 3) for k, v in sorted(kinds.items())}, "gemms": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny sizes")
    parser.add_argument("--w1-repeats", type=int, default=9)
    parser.add_argument("--w4-repeats", type=int, default=25)
    parser.add_argument("--no-reference", action="store_true", help="skip the float32 copy's scores")
    parser.add_argument("--no-profile", action="store_true", help="skip the eager profiles and memory peaks")
    args = parser.parse_args()
    device = "cpu" if DRY else "cuda"
    report: dict[str, Any] = {"torch": torch.__version__}
    if not DRY:
        import triton

        report["device"] = torch.cuda.get_device_name()
        report["triton"] = triton.__version__
    model32, model, w1, w4 = models_and_jobs(device)
    memory: dict[str, float] = {}
    gib = 2**30
    if not DRY:
        sync()
        memory["weights_gib"] = torch.cuda.memory_allocated() / gib  # both models (fp32 and bf16)
    engines = {label: engine(model, fused) for label, fused in LAYOUTS.items()}
    assert engines["fused"].forward.decoder.layers[0].qkv is not None  # type: ignore[attr-defined]
    assert engines["separate"].forward.decoder.layers[0].qkv is None  # type: ignore[attr-defined]
    if not DRY:
        sync()
        memory["after_both_engines_gib"] = torch.cuda.memory_allocated() / gib
    reference = None if args.no_reference else engine(model32, True).score_jobs([w1, w4])
    del model32
    result: dict[str, Any] = {}
    for name, w, repeats in (("W1", w1, args.w1_repeats), ("W4", w4, args.w4_repeats)):
        scores = {}
        for label, e in engines.items():
            for _ in range(3):  # compile, then the graph's capture (second sight of a shape)
                scores[label] = e.score_jobs([w])[0]
        times: dict[str, list[float]] = {label: [] for label in engines}
        for i in range(repeats if not DRY else 1):
            # Each layout goes first every other round, so that an order effect cancels.
            for label in list(engines) if i % 2 == 0 else list(engines)[::-1]:
                e = engines[label]
                sync()
                start = time.perf_counter()
                e.score_jobs([w])
                sync()
                times[label].append((time.perf_counter() - start) * 1e3)
        paired = sorted(f - s for f, s in zip(times["fused"], times["separate"], strict=True))
        entry: dict[str, Any] = {
            "paired_diff_ms": {"median": statistics.median(paired), "mean": statistics.mean(paired)},
            "prompts": len(w.prompts),
            "tokens": sum(len(p) for p in w.prompts),
            "fused_vs_separate_max_score_diff": max(
                abs(a - b) for a, b in zip(scores["fused"], scores["separate"], strict=True)
            ),
        }
        for label in engines:
            entry[label] = {
                "median_ms": statistics.median(times[label]),
                "times_ms": [round(t, 2) for t in times[label]],
            }
            if reference is not None:
                ref = reference[0] if name == "W1" else reference[1]
                errors = [abs(a - b) for a, b in zip(scores[label], ref, strict=True)]
                entry[label]["max_err_vs_fp32"] = max(errors)
                entry[label]["mean_err_vs_fp32"] = sum(errors) / len(errors)
        result[name] = entry
        print(json.dumps({name: entry}), flush=True)
    # Eager engines (no graphs): each product attributed to its shape; W1's peak memory.
    for label, fused in LAYOUTS.items() if not args.no_profile else ():
        eager = engine(model, fused, graphs=False)
        for name, w in (("W1", w1), ("W4", w4)):
            eager.score_jobs([w])  # warm
            result[name][label]["eager_profile"] = profiled(lambda e=eager, w=w: e.score_jobs([w]))
        if not DRY:
            sync()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            eager.score_jobs([w1])
            sync()
            memory[f"w1_peak_beyond_before_{label}_gib"] = (torch.cuda.max_memory_allocated() - base) / gib
        del eager
    report["engine"] = result
    report["memory"] = memory
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_fused_projections.json").write_text(json.dumps(report, indent=1))
    print(tables(report), flush=True)


def tables(report: dict[str, Any]) -> str:
    lines = [
        "| workload | tokens | calls | separate median ms | fused median ms | fused / separate | "
        "fused - separate, paired: median / mean ms | score diff | max/mean err vs fp32 separate | fused |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    engine = report["engine"]

    def err(x: dict[str, Any]) -> str:
        return f"{x['max_err_vs_fp32']:.1e} / {x['mean_err_vs_fp32']:.1e}" if "max_err_vs_fp32" in x else ""

    for name, e in engine.items():
        s, f, d = e["separate"], e["fused"], e["paired_diff_ms"]
        lines.append(
            f"| {name} | {e['tokens']} | {len(s['times_ms'])} | {s['median_ms']:.2f} | {f['median_ms']:.2f} | "
            f"{f['median_ms'] / s['median_ms']:.3f} | {d['median']:+.2f} / {d['mean']:+.2f} | "
            f"{e['fused_vs_separate_max_score_diff']:.1e} | {err(s)} | {err(f)} |"
        )
    for name, e in engine.items():
        for label in LAYOUTS:
            prof = e[label].get("eager_profile")
            if prof:
                lines.append(f"\n{name} {label}, eager, kernels (ms): {prof['kinds_ms']}")
                lines.append("| GEMM | ms | TFLOP/s | launches |")
                lines.append("|---|---:|---:|---:|")
                for key, g in prof["gemms"].items():
                    lines.append(f"| {key} | {g['ms']} | {g['tflops']} | {g['launches']} |")
    lines.append(f"\nmemory (GiB): {report['memory']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
