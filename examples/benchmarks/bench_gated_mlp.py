"""The gate/up GEMM with silu*mul in its epilogue against cuBLAS gate + up and the Triton silu*mul.

    PYTHONPATH=. python examples/benchmarks/bench_gated_mlp.py [--sweep] [--no-engine] [--dry-run]

Two parts, one process, one GPU:

* **one layer** (hidden 1024, intermediate 3072, bf16, the Qwen3-0.6B MLP) at W4-like and W1-like
  token counts: the fused kernel (``genscore_core.kernels.gated_mlp``) with its shipped tiling, and
  with ``--sweep`` every tiling of :data:`SWEEP`, against the decoder's other path (two cuBLAS
  products, then ``fused_ops``' Triton silu*mul), each replayed from a CUDA graph
  (``triton.testing.do_bench_cudagraph``); the products and the silu*mul alone too. Max error of each
  against a float32 reference computed from the same bf16 inputs. With ``--sweep`` the fastest
  tiling of each size class (under / from ``gated_mlp_triton.SMALL_M`` tokens) is printed, and used
  for the engine part unless ``--shipped``;
* **the engine alone** (token-id jobs, as ``bench_ab.py``: a random-init Qwen3-Reranker-0.6B shape in
  bf16, W1 = one query and 256 documents, W4 = one query and 20) with ``PackedOptions(gated_mlp=
  "triton")`` and ``"torch"``, calls alternating between the two, medians; the largest score
  difference between them and each one's error against the same engine on a float32 copy of the
  model; and one profiled call each, kernel time by kind.

``--dry-run`` runs the same code on the CPU (Triton's interpreter, a tiny model, tiny sizes) to
check the script. Prints the tables last and writes ``$OUT/bench_gated_mlp.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_ab import QWEN3_06B, job  # noqa: E402

from genscore_core.engine import ScoringEngine  # noqa: E402
from genscore_core.kernels import fused_ops_triton, gated_mlp_triton  # noqa: E402
from genscore_core.kernels.gated_mlp_triton import GatedMlpConfig  # noqa: E402
from genscore_core.packed import PackedForward, PackedOptions  # noqa: E402
from genscore_core.scoring import LabelHead  # noqa: E402

HIDDEN, INTERMEDIATE = 1024, 3072
DTYPE = torch.float32 if DRY else torch.bfloat16
"""The interpreter's bfloat16 ``tl.dot`` is wrong on the CPU, so the dry run checks in float32."""
TOKENS = [4096, 7424, 16384, 32768, 65536]
"""W4 runs ~5.8-7.4k tokens a call; W1's batches fill 4k/8k/16k/32k/64k targets."""

SWEEP = [
    # Tilings of the shipped kernel. The first H200 call also swept a persistent grid (one program
    # per multiprocessor walking the tiles), the second a flattened persistent loop, Triton's warp
    # specialisation and TMA stores of act: all slower, dropped (docs/benchmarks.md).
    GatedMlpConfig(128, 128, 64, 8, 3),
    GatedMlpConfig(128, 128, 64, 8, 4),
    GatedMlpConfig(128, 128, 32, 8, 4),
    GatedMlpConfig(128, 128, 128, 8, 2),
    GatedMlpConfig(128, 64, 64, 4, 4),
    GatedMlpConfig(128, 64, 64, 8, 4),
    GatedMlpConfig(64, 128, 64, 4, 4),
    GatedMlpConfig(64, 256, 64, 8, 3),
    GatedMlpConfig(256, 64, 64, 8, 3),
    GatedMlpConfig(64, 64, 64, 4, 4),
    GatedMlpConfig(128, 128, 64, 8, 3, group_m=16),
]


def bench(fn: Callable[[], Any]) -> float:
    """Milliseconds per call: CUDA-graph replay on the GPU, a plain timer on the CPU (dry run)."""
    fn()
    if DRY:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=30))


def layer_part(tokens: list[int], sweep: list[GatedMlpConfig], device: str) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden, inter = (HIDDEN, INTERMEDIATE) if not DRY else (64, 96)
    wg = (torch.randn(inter, hidden, generator=gen) * hidden**-0.5).to(device, DTYPE)
    wu = (torch.randn(inter, hidden, generator=gen) * hidden**-0.5).to(device, DTYPE)
    rows = []
    for m in tokens:
        x = torch.randn(m, hidden, generator=gen).to(device, DTYPE)
        rows.append(one_size(x, wg, wu, sweep))
        print(json.dumps(rows[-1]), flush=True)
    return {"rows": rows, "best": best_configs(rows, sweep)}


def one_size(
    x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, sweep: list[GatedMlpConfig]
) -> dict[str, Any]:
    """Both paths and every tiling of ``sweep`` at one token count."""
    m, hidden = x.shape
    want = F.silu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t())
    g, u = F.linear(x, wg), F.linear(x, wu)
    flop = 2 * m * hidden * 2 * wg.shape[0]

    def err(out: torch.Tensor) -> float:
        return float((out.float() - want).abs().max())

    def unfused() -> torch.Tensor:
        return fused_ops_triton.silu_mul(F.linear(x, wg), F.linear(x, wu))

    def fused(cfg: GatedMlpConfig | None = None) -> torch.Tensor:
        return gated_mlp_triton.gated_mlp(x, wg, None, wu, None, cfg)

    row: dict[str, Any] = {"tokens": m}
    row["unfused_ms"] = bench(unfused)
    row["gemms_ms"] = bench(lambda: (F.linear(x, wg), F.linear(x, wu)))
    row["silu_mul_ms"] = bench(lambda: fused_ops_triton.silu_mul(g, u))
    row["unfused_err"] = err(unfused())
    row["gemms_tflops"] = flop / row["gemms_ms"] / 1e9
    row["shipped"] = gated_mlp_triton.config_for(m).name()
    try:
        row["fused_ms"] = bench(fused)
        row["fused_err"] = err(fused())
    except Exception:  # keep the sweep and the baseline's figures
        traceback.print_exc()
        row["fused_ms"], row["fused_err"] = float("nan"), float("nan")
    row["fused_tflops"] = flop / row["fused_ms"] / 1e9
    row["sweep"] = {}
    for cfg in sweep:
        try:
            row["sweep"][cfg.name()] = {"ms": bench(lambda cfg=cfg: fused(cfg)), "err": err(fused(cfg))}
        except Exception as error:  # a tiling this triton cannot build: record it, go on
            row["sweep"][cfg.name()] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return row


def best_configs(rows: list[dict[str, Any]], sweep: list[GatedMlpConfig]) -> dict[str, str]:
    """The tiling with the least summed time relative to the unfused path, per size class."""
    best: dict[str, str] = {}
    for cls, wanted in (
        ("small", lambda m: m < gated_mlp_triton.SMALL_M),
        ("large", lambda m: m >= gated_mlp_triton.SMALL_M),
    ):
        scores: dict[str, float] = {}
        for cfg in sweep:
            name = cfg.name()
            ratios = [
                r["sweep"][name]["ms"] / r["unfused_ms"]
                for r in rows
                if wanted(r["tokens"]) and "ms" in r["sweep"].get(name, {})
            ]
            if ratios and len(ratios) == sum(1 for r in rows if wanted(r["tokens"])):
                scores[name] = sum(ratios) / len(ratios)
        if scores:
            best[cls] = min(scores, key=scores.__getitem__)
    return best


KINDS = ("gemm", "gated_mlp", "silu", "attention", "rmsnorm", "rope")


def kind_of(name: str) -> str:
    lowered = name.lower()
    if "gated_mlp" in lowered:
        return "gated_mlp (fused)"
    if "silu" in lowered:
        return "silu_mul"
    if "segment_attention" in lowered:
        return "attention"
    if "add_rmsnorm" in lowered:
        return "add_rmsnorm"
    if "rope" in lowered:
        return "rope"
    if any(k in lowered for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")):
        return "GEMM (cuBLAS)"
    return "other"


def kernel_times(call: Callable[[], Any]) -> dict[str, float]:
    """Kernel milliseconds by kind over one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type.name == "CUDA":
            out[kind_of(event.name)] += event.device_time / 1e3
    return {k: round(v, 3) for k, v in sorted(out.items())}


def models_and_jobs(device: str) -> tuple[Any, Any, Any, Any]:
    """The random-init Qwen3-0.6B (tiny with --dry-run) in float32 and in DTYPE, and the W1 / W4
    token-id jobs of bench_ab.py (seed 0, so every engine benchmark scores the same prompts)."""
    import random

    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = dict(QWEN3_06B)
    if DRY:
        shape.update(vocab_size=152000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    config = Qwen3Config(**shape)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model32 = Qwen3ForCausalLM(config).eval()
    model = copy.deepcopy(model32).to(DTYPE)
    rng = random.Random(0)
    docs1, docs4 = (256, 20) if not DRY else (6, 3)
    return model32, model, job(rng, docs1), job(rng, docs4)


def engine_part(device: str, w1_repeats: int, w4_repeats: int) -> dict[str, Any]:
    model32, model, w1, w4 = models_and_jobs(device)

    def engine(m: Any, impl: str) -> ScoringEngine:
        return ScoringEngine(m, PackedForward(m, options=PackedOptions(gated_mlp=impl)), LabelHead(m))  # type: ignore[arg-type]

    engines = {"fused": engine(model, "triton"), "unfused": engine(model, "torch")}
    assert engines["fused"].forward.decoder.mlp_impl == "triton"  # type: ignore[attr-defined]
    reference = engine(model32, "torch").score_jobs([w1, w4])
    result: dict[str, Any] = {}
    for name, w, repeats in (("W1", w1, w1_repeats), ("W4", w4, w4_repeats)):
        scores = {}
        for label, e in engines.items():
            for _ in range(3):  # compile, then the graph's capture (second sight of a shape)
                scores[label] = e.score_jobs([w])[0]
        times: dict[str, list[float]] = {label: [] for label in engines}
        for _ in range(repeats):
            for label, e in engines.items():
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                e.score_jobs([w])
                if device == "cuda":
                    torch.cuda.synchronize()
                times[label].append((time.perf_counter() - start) * 1e3)
        ref = reference[0] if name == "W1" else reference[1]
        entry: dict[str, Any] = {
            "prompts": len(w.prompts),
            "tokens": sum(len(p) for p in w.prompts),
            "fused_vs_unfused_max_score_diff": max(
                abs(a - b) for a, b in zip(scores["fused"], scores["unfused"])
            ),
        }
        for label in engines:
            errors = [abs(a - b) for a, b in zip(scores[label], ref)]
            entry[label] = {
                "median_ms": statistics.median(times[label]),
                "times_ms": [round(t, 2) for t in times[label]],
                "max_err_vs_fp32": max(errors),
                "mean_err_vs_fp32": sum(errors) / len(errors),
            }
            if device == "cuda":
                entry[label]["kernels_ms"] = kernel_times(lambda e=engines[label], w=w: e.score_jobs([w]))
        result[name] = entry
        print(json.dumps({name: entry}), flush=True)
    return result


def tables(report: dict[str, Any]) -> str:
    lines = []
    layer = report.get("layer")
    if layer:
        lines += [
            "| tokens | cuBLAS gate+up + silu*mul (ms) | gate+up GEMMs alone | silu*mul alone | fused, shipped (ms) | fused / unfused | shipped tiling | GEMM TFLOP/s (cuBLAS / fused) | max err unfused / fused |",
            "|---:|---:|---:|---:|---:|---:|---|---|---|",
        ]
        for r in layer["rows"]:
            lines.append(
                f"| {r['tokens']} | {r['unfused_ms']:.4f} | {r['gemms_ms']:.4f} | {r['silu_mul_ms']:.4f} | "
                f"{r['fused_ms']:.4f} | {r['fused_ms'] / r['unfused_ms']:.3f} | {r['shipped']} | "
                f"{r['gemms_tflops']:.0f} / {r['fused_tflops']:.0f} | {r['unfused_err']:.2e} / {r['fused_err']:.2e} |"
            )
        names = list(layer["rows"][0]["sweep"]) if layer["rows"] else []
        if names:
            lines += ["", "sweep, ms (fused / unfused in brackets):", ""]
            lines.append("| tiling | " + " | ".join(str(r["tokens"]) for r in layer["rows"]) + " |")
            lines.append("|---|" + "---:|" * len(layer["rows"]))
            for name in names:
                cells = []
                for r in layer["rows"]:
                    s = r["sweep"][name]
                    cells.append(
                        f"{s['ms']:.4f} ({s['ms'] / r['unfused_ms']:.3f})" if "ms" in s else "failed"
                    )
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            lines.append(f"\nbest per size class: {layer['best']}")
    engine = report.get("engine")
    if engine:
        lines += [
            "",
            "| workload | tokens | unfused median ms | fused median ms | fused / unfused | score diff | max/mean err vs fp32 unfused | fused |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for name, e in engine.items():
            u, f = e["unfused"], e["fused"]
            lines.append(
                f"| {name} | {e['tokens']} | {u['median_ms']:.2f} | {f['median_ms']:.2f} | "
                f"{f['median_ms'] / u['median_ms']:.3f} | {e['fused_vs_unfused_max_score_diff']:.1e} | "
                f"{u['max_err_vs_fp32']:.1e} / {u['mean_err_vs_fp32']:.1e} | {f['max_err_vs_fp32']:.1e} / {f['mean_err_vs_fp32']:.1e} |"
            )
        for name, e in engine.items():
            for label in ("unfused", "fused"):
                if "kernels_ms" in e[label]:
                    lines.append(f"{name} {label} kernels (ms): {e[label]['kernels_ms']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny sizes")
    parser.add_argument("--sweep", action="store_true", help="time every tiling of SWEEP too")
    parser.add_argument("--shipped", action="store_true", help="the engine part keeps the shipped tilings")
    parser.add_argument("--no-engine", action="store_true")
    parser.add_argument("--no-layer", action="store_true")
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=TOKENS, help="token counts of the layer part"
    )
    parser.add_argument("--w1-repeats", type=int, default=7)
    parser.add_argument("--w4-repeats", type=int, default=20)
    args = parser.parse_args()
    device = "cpu" if DRY else "cuda"
    report: dict[str, Any] = {"torch": torch.__version__}
    if device == "cuda":
        import triton

        report["device"] = torch.cuda.get_device_name()
        report["triton"] = triton.__version__
    if not args.no_layer:
        tokens = args.tokens if not DRY else [5, 130]
        sweep = (
            SWEEP
            if not DRY
            else [GatedMlpConfig(16, 16, 16, 4, 1), GatedMlpConfig(16, 32, 16, 4, 1, group_m=2)]
        )
        report["layer"] = layer_part(tokens, sweep if args.sweep else [], device)
        best = report["layer"]["best"]
        if args.sweep and best and not args.shipped:
            # A benchmark's own choice for the engine part: the shipped table is edited by hand.
            by_name = {c.name(): c for c in sweep}
            for cls, name in best.items():
                gated_mlp_triton.CONFIGS[cls] = by_name[name]
            report["engine_tilings"] = {cls: c.name() for cls, c in gated_mlp_triton.CONFIGS.items()}
    if not args.no_engine:
        try:
            report["engine"] = engine_part(
                device, args.w1_repeats if not DRY else 1, args.w4_repeats if not DRY else 1
            )
        except Exception:  # the layer figures still get written
            traceback.print_exc()
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_gated_mlp.json").write_text(json.dumps(report, indent=1))
    print(tables(report), flush=True)


if __name__ == "__main__":
    main()
