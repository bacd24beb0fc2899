"""K1: fused label log-probability kernel against the torch path, in one run on one GPU.

    PYTHONPATH=. python examples/benchmarks/bench_label_logprobs.py

It needs only torch and triton, but ``import genscore_core`` pulls in pydantic. On a machine without
it, point an empty ``genscore_core`` package at the kernels folder and the errors module (how
docs/benchmarks.md was made):

    mkdir -p /tmp/shim/genscore_core && touch /tmp/shim/genscore_core/__init__.py
    ln -s $PWD/genscore_core/kernels /tmp/shim/genscore_core/kernels
    ln -s $PWD/genscore_core/errors.py /tmp/shim/genscore_core/errors.py
    PYTHONPATH=/tmp/shim python examples/benchmarks/bench_label_logprobs.py

Steps, all in the same process (machines are shared; only same-run ratios mean much):
1. correctness at Qwen3 sizes (H = 1024, V = 151669, bf16; B in 1, 16, 128, 1024; K in 2, 8, 128,
   ragged label sets) against a float64 reference, outputs poisoned with NaN before each run;
   plus bias, fp16 and fp32 spot checks;
2. a device-copy ceiling (1 GiB copy; GB/s = 2 x bytes / time);
3. a small sweep of tile configs per batch size (K = 2);
4. the table: kernel (default config, through ``label_logprobs``) against
   ``(h @ W.T).float().log_softmax(-1).gather(-1, ids)`` with ``triton.testing.do_bench`` medians (warm-up excluded, L2 flushed between runs), achieved
   GB/s (W + h bytes read / time), and extra peak memory of each path; then the sweep's best
   config per batch size timed again on every row;
5. K = 2 again under CUDA-graph replay, which removes Python launch overhead from the timing.

Prints a markdown table last and writes it (plus a CSV) to $OUT when OUT is set.
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.testing

from genscore_core.kernels.label_logprobs import LabelLogprobs, label_logprobs
from genscore_core.kernels.label_logprobs_triton import (
    LabelLogprobsTiling,
    default_config,
    label_logprobs_triton,
)

HIDDEN, VOCAB = 1024, 151669  # Qwen3-Reranker-0.6B LM head (tied embeddings)
CHECK_BATCHES = (1, 16, 128, 1024)
TIME_BATCHES = (1, 16, 64, 128, 1024)
LABEL_COUNTS = (2, 8, 128)
DEVICE = torch.device("cuda")
OUT = os.environ.get("OUT")

# Candidate tilings per batch size; tiles_per_split is a runtime argument, so it costs no compile.
# (block_b, block_v, block_h, num_warps, num_stages, swap_ab)
_SMALL = [
    (16, 64, 128, 4, 4, True),
    (16, 128, 128, 4, 3, True),
    (16, 128, 64, 4, 4, True),
    (16, 64, 256, 4, 3, True),
    (16, 64, 128, 4, 4, False),
    (16, 128, 128, 4, 3, False),
]
SWEEP: dict[int, list[tuple[int, int, int, int, int, bool]]] = {
    1: _SMALL,
    16: _SMALL,
    64: [
        (64, 64, 128, 4, 4, True),
        (64, 128, 64, 4, 4, True),
        (64, 64, 128, 4, 4, False),
        (64, 128, 64, 4, 4, False),
        (64, 128, 128, 8, 3, False),
    ],
    128: [
        (128, 64, 128, 8, 3, False),
        (128, 128, 64, 8, 3, False),
        (128, 64, 128, 4, 4, True),
        (128, 128, 64, 8, 3, True),
        (64, 128, 64, 4, 4, False),
    ],
    1024: [
        (128, 128, 64, 8, 3, False),
        (128, 128, 64, 8, 4, False),
        (128, 256, 64, 8, 3, False),
        (256, 128, 64, 8, 3, False),
        (128, 128, 64, 8, 3, True),
        (64, 128, 64, 4, 4, False),
    ],
}
SWEEP_TILES_PER_SPLIT = (1, 2, 8)


def fmt(cfg: LabelLogprobsTiling) -> str:
    return "/".join(str(x) for x in cfg[:6]) + ("/swap" if cfg.swap_ab else "/noswap")


def log(msg: str) -> None:
    print(msg, flush=True)


def bench_ms(fn: Callable[[], Any]) -> tuple[float, float, float]:
    """Median, 20th and 80th percentile in ms (do_bench: warm-up excluded, L2 flushed per run)."""
    q = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    return float(q[0]), float(q[1]), float(q[2])


def extra_peak_mib(fn: Callable[[], Any]) -> float:
    """Peak memory allocated during one call beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_ceiling_gbs() -> float:
    src = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))[0]
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def make_labels(batch: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-row label ids (the worst case for the label gather) and ragged masks."""
    ids = torch.randint(0, VOCAB, (batch, k), device=DEVICE, generator=gen)
    lengths = torch.randint(1, k + 1, (batch,), device=DEVICE, generator=gen)
    mask = torch.arange(k, device=DEVICE)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, -1), mask


def float64_reference(
    h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None = None
) -> LabelLogprobs:
    """float64 log Z over vocabulary chunks (a [B, V] float64 tensor would be 1.2 GB at B = 1024)."""
    h64 = h.double()
    lse = torch.full((h.shape[0],), float("-inf"), dtype=torch.float64, device=DEVICE)
    for start in range(0, VOCAB, 16384):
        logits = h64 @ w[start : start + 16384].double().T
        if bias is not None:
            logits += bias[start : start + 16384].double()
        lse = torch.logaddexp(lse, logits.logsumexp(-1))
    safe = ids.masked_fill(~mask, 0)
    label = torch.einsum("bh,bkh->bk", h64, w[safe].double())
    if bias is not None:
        label += bias[safe].double()
    return LabelLogprobs((label - lse[:, None]).masked_fill(~mask, float("-inf")), lse)


def max_errors(got: LabelLogprobs, ref: LabelLogprobs, mask: torch.Tensor) -> tuple[float, float, bool]:
    lp_err = (got.logprobs.double() - ref.logprobs)[mask].abs().max().item()
    lse_err = (got.log_normalizer.double() - ref.log_normalizer).abs().max().item()
    masked_ok = (
        bool(torch.isneginf(got.logprobs[~mask]).all().item()) and not got.logprobs.isnan().any().item()
    )
    return lp_err, lse_err, masked_ok


def check_correctness(w: torch.Tensor, gen: torch.Generator) -> bool:
    log("## correctness (kernel vs float64; max |error| over valid labels, and over log Z)")
    log("| B | K | dtype | extra | max err logprobs | max err logZ | masked -inf | torch path max err |")
    log("|---|---|---|---|---|---|---|---|")
    atol = 2e-3
    ok = True
    cases: list[tuple[int, int, torch.dtype, str]] = [
        (b, k, torch.bfloat16, "") for b in CHECK_BATCHES for k in LABEL_COUNTS
    ]
    cases += [(16, 8, torch.bfloat16, "bias"), (16, 8, torch.float16, ""), (16, 8, torch.float32, "")]
    for batch, k, dtype, extra in cases:
        weight = w if dtype == torch.bfloat16 else w.to(dtype)
        h = torch.randn(batch, HIDDEN, device=DEVICE, generator=gen).to(dtype)
        ids, mask = make_labels(batch, k, gen)
        bias = torch.randn(VOCAB, device=DEVICE, generator=gen).to(dtype) if extra == "bias" else None
        poison = LabelLogprobs(
            torch.full((batch, k), float("nan"), device=DEVICE),
            torch.full((batch,), float("nan"), device=DEVICE),
        )
        got = label_logprobs_triton(h, weight, ids, mask, bias, out=poison)
        ref = float64_reference(h, weight, ids, mask, bias)
        lp_err, lse_err, masked_ok = max_errors(got, ref, mask)
        torch_err = float("nan")
        if bias is None:
            naive = (h @ weight.T).float().log_softmax(-1).gather(-1, ids.masked_fill(~mask, 0))
            torch_err = (naive.double() - ref.logprobs)[mask].abs().max().item()
            del naive
        passed = lp_err < atol and lse_err < atol and masked_ok
        ok &= passed
        log(
            f"| {batch} | {k} | {str(dtype).removeprefix('torch.')} | {extra} | {lp_err:.2e} | {lse_err:.2e} "
            f"| {'ok' if masked_ok else 'FAIL'} | {torch_err:.2e} |{'' if passed else ' **FAIL**'}"
        )
        if weight is not w:
            del weight
    log(f"correctness: {'PASS' if ok else 'FAIL'} (atol {atol})")
    return ok


def sweep(
    w: torch.Tensor, ceiling: float, gen: torch.Generator
) -> dict[int, tuple[LabelLogprobsTiling, float]]:
    log("## config sweep (K = 2, median us; % of copy ceiling)")
    best: dict[int, tuple[LabelLogprobsTiling, float]] = {}
    for batch, shapes in SWEEP.items():
        h = torch.randn(batch, HIDDEN, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        ids = torch.randint(0, VOCAB, (batch, 2), device=DEVICE, generator=gen)
        nbytes = w.numel() * w.element_size() + h.numel() * h.element_size()
        for shape in shapes:
            for tps in SWEEP_TILES_PER_SPLIT:
                block_b, block_v, block_h, warps, stages, swap = shape
                cfg = LabelLogprobsTiling(block_b, block_v, block_h, warps, stages, tps, swap)
                try:
                    ms = bench_ms(functools.partial(label_logprobs_triton, h, w, ids, config=cfg))[0]
                except Exception as exc:  # out of shared memory, registers, ...
                    log(f"B={batch} {fmt(cfg)}: failed: {type(exc).__name__}: {str(exc)[:120]}")
                    break
                pct = 100 * nbytes / (ms * 1e-3) / 1e9 / ceiling
                log(f"B={batch} {fmt(cfg)}: {ms * 1e3:.1f} us, {pct:.0f}%")
                if batch not in best or ms < best[batch][1]:
                    best[batch] = (cfg, ms)
        cfg, ms = best[batch]
        log(f"best B={batch}: {fmt(cfg)} {ms * 1e3:.1f} us; default {fmt(default_config(batch))}")
    return best


def timing_table(w: torch.Tensor, ceiling: float, gen: torch.Generator) -> list[dict[str, Any]]:
    """The kernel through the engine's entry point (default config) against the torch path."""
    rows = []
    for batch in TIME_BATCHES:
        h = torch.randn(batch, HIDDEN, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        nbytes = w.numel() * w.element_size() + h.numel() * h.element_size()
        for k in LABEL_COUNTS:
            ids = torch.randint(0, VOCAB, (batch, k), device=DEVICE, generator=gen)

            def kernel(h: torch.Tensor = h, ids: torch.Tensor = ids) -> LabelLogprobs:
                return label_logprobs(h, w, ids)  # dispatches to Triton on CUDA

            def naive(h: torch.Tensor = h, ids: torch.Tensor = ids) -> torch.Tensor:
                return (h @ w.T).float().log_softmax(-1).gather(-1, ids)

            k_ms, t_ms = bench_ms(kernel)[0], bench_ms(naive)[0]
            row = {
                "B": batch,
                "K": k,
                "config": fmt(default_config(batch)),
                "kernel_us": k_ms * 1e3,
                "torch_us": t_ms * 1e3,
                "speedup": t_ms / k_ms,
                "kernel_gbs": nbytes / (k_ms * 1e-3) / 1e9,
                "torch_gbs": nbytes / (t_ms * 1e-3) / 1e9,
                "pct_ceiling": 100 * nbytes / (k_ms * 1e-3) / 1e9 / ceiling,
                "kernel_extra_mib": extra_peak_mib(kernel),
                "torch_extra_mib": extra_peak_mib(naive),
            }
            rows.append(row)
            log(str({key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()}))
    return rows


def add_tuned(
    rows: list[dict[str, Any]],
    w: torch.Tensor,
    ceiling: float,
    gen: torch.Generator,
    tuned: dict[int, LabelLogprobsTiling],
) -> None:
    """Time each row again with the sweep's best config for its batch size."""
    for row in rows:
        if row["B"] not in tuned:
            continue
        cfg = tuned[row["B"]]
        h = torch.randn(row["B"], HIDDEN, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        ids = torch.randint(0, VOCAB, (row["B"], row["K"]), device=DEVICE, generator=gen)
        nbytes = w.numel() * w.element_size() + h.numel() * h.element_size()
        ms = bench_ms(functools.partial(label_logprobs_triton, h, w, ids, config=cfg))[0]
        row.update(
            tuned_config=fmt(cfg),
            tuned_us=ms * 1e3,
            tuned_speedup=row["torch_us"] / (ms * 1e3),
            tuned_pct_ceiling=100 * nbytes / (ms * 1e-3) / 1e9 / ceiling,
        )


def markdown(rows: list[dict[str, Any]], ceiling: float, header: str) -> str:
    tuned = all("tuned_us" in r for r in rows)
    lines = [
        header,
        "",
        f"Device-copy ceiling measured in the same run: {ceiling:.0f} GB/s (1 GiB bf16 copy, read + write).",
        "",
        "| B | K | kernel (us) | torch (us) | speedup | kernel GB/s | % of copy ceiling | torch GB/s "
        "| kernel extra MiB | torch extra MiB | config |"
        + (" best swept config | best (us) | best speedup | best % |" if tuned else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---|---:|---:|---:|" if tuned else ""),
    ]
    for r in rows:
        line = (
            f"| {r['B']} | {r['K']} | {r['kernel_us']:.1f} | {r['torch_us']:.1f} | {r['speedup']:.2f}x "
            f"| {r['kernel_gbs']:.0f} | {r['pct_ceiling']:.0f}% | {r['torch_gbs']:.0f} "
            f"| {r['kernel_extra_mib']:.2f} | {r['torch_extra_mib']:.0f} | {r['config']} |"
        )
        if tuned:
            line += (
                f" {r['tuned_config']} | {r['tuned_us']:.1f} | {r['tuned_speedup']:.2f}x "
                f"| {r['tuned_pct_ceiling']:.0f}% |"
            )
        lines.append(line)
    lines.append("")
    lines.append("config = block_b/block_v/block_h/num_warps/num_stages/tiles_per_split/(no)swap_ab.")
    return "\n".join(lines)


def emit(rows: list[dict[str, Any]], ceiling: float, header: str) -> None:
    table = markdown(rows, ceiling, header)
    log("\n" + table + "\n")
    if OUT:
        with open(os.path.join(OUT, "k1_table.md"), "w") as f:
            f.write(table + "\n")
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[-1]))
        writer.writeheader()
        writer.writerows(rows)
        with open(os.path.join(OUT, "k1_results.csv"), "w") as f:
            f.write(buf.getvalue())


def graph_table(w: torch.Tensor, ceiling: float, gen: torch.Generator) -> str:
    """K = 2 again, timed by CUDA-graph replay: no host launch overhead (as in a graphed engine).

    Plain do_bench includes any gap while Python launches the next kernel; for a ~100 us kernel
    that gap can show. No L2 flush between replays, which matters little: W is 5x the L2.
    """
    lines = [
        "| B | K | kernel, graph (us) | torch, graph (us) | speedup | % of copy ceiling |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for batch in TIME_BATCHES:
        h = torch.randn(batch, HIDDEN, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        ids = torch.randint(0, VOCAB, (batch, 2), device=DEVICE, generator=gen)
        nbytes = w.numel() * w.element_size() + h.numel() * h.element_size()
        try:
            times = [
                triton.testing.do_bench_cudagraph(fn, rep=50)
                for fn in (
                    functools.partial(label_logprobs, h, w, ids),
                    lambda h=h, ids=ids: (h @ w.T).float().log_softmax(-1).gather(-1, ids),
                )
            ]
        except Exception as exc:  # capture not supported here: report, keep the rest
            log(f"graph timing failed at B={batch}: {type(exc).__name__}: {str(exc)[:160]}")
            break
        k_ms, t_ms = (float(t[0] if isinstance(t, (list, tuple)) else t) for t in times)
        pct = 100 * nbytes / (k_ms * 1e-3) / 1e9 / ceiling
        lines.append(
            f"| {batch} | 2 | {k_ms * 1e3:.1f} | {t_ms * 1e3:.1f} | {t_ms / k_ms:.2f}x | {pct:.0f}% |"
        )
    return "\n".join(lines)


def main() -> int:
    if not torch.cuda.is_available():
        log("needs a CUDA GPU")
        return 1
    props = torch.cuda.get_device_properties(DEVICE)
    header = (
        f"{datetime.date.today().isoformat()}, {props.name} ({props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, "
        f"Python {platform.python_version()}; H = {HIDDEN}, V = {VOCAB}, bf16; medians of triton.testing.do_bench."
    )
    log(header)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    # LM head with Qwen3-like logit spread (std about 4).
    w = (torch.randn(VOCAB, HIDDEN, device=DEVICE, generator=gen) * (4 / HIDDEN**0.5)).to(torch.bfloat16)

    ok = check_correctness(w, gen)
    ceiling = copy_ceiling_gbs()
    log(f"copy ceiling: {ceiling:.0f} GB/s")
    rows = timing_table(w, ceiling, gen)
    emit(rows, ceiling, header)  # the main table first, in case the sweep runs out of time
    if "--no-sweep" not in sys.argv:
        best = sweep(w, ceiling, gen)
        add_tuned(rows, w, ceiling, gen, {b: cfg for b, (cfg, _) in best.items()})
        emit(rows, ceiling, header)
    graphs = graph_table(w, ceiling, gen)
    log("\n## CUDA-graph replay (K = 2, default configs)\n\n" + graphs)
    if OUT:
        with open(os.path.join(OUT, "k1_graphs.md"), "w") as f:
            f.write(graphs + "\n")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
