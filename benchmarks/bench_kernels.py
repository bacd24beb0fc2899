"""Each kernel's public entry point, Triton against its plain-torch reference, on the 0.6B shape's sizes.

    python benchmarks/bench_kernels.py              # one GPU
    python benchmarks/bench_kernels.py --dry-run    # small sizes on the CPU (the torch paths only)

K1 ``label_logprobs`` (hidden [B, 1024] bf16, the [151669, 1024] LM head, K = 2 labels; GB/s of the
head read, against the device's HBM ceiling); ``segment_attention`` on W1's layout (a 90-token shared
prefix read in place, 256 prompts of 140-524 tokens; 16 query and 8 key/value heads of 128);
``add_rmsnorm``, ``rope``, ``silu_mul`` and ``gated_mlp`` on 65,536 tokens (the packed forward's batch
budget). Times are medians of 20 calls (``impl="triton"`` against ``impl="torch"``, or the kernel's
``*_reference``), with the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import Report, call_times, median, run_reported

from genscore_core.kernels import (
    Segments,
    add_rmsnorm,
    gated_mlp,
    label_logprobs,
    label_logprobs_reference,
    rope,
    segment_attention,
    segment_attention_reference,
    silu_mul,
)


def timed_ms(call: Callable[[], Any]) -> float:
    call()
    return median(call_times([call] * 20)) * 1e3


def compare(
    report: Report, name: str, metric: str, fast: Callable[[], Any], slow: Callable[[], Any], note: str = ""
) -> None:
    """``fast`` (the kernel) and ``slow`` (the reference) timed; the largest difference of their outputs."""
    diff = (fast().float() - slow().float()).abs().max().item()
    report.add(name, metric, timed_ms(fast), "ms", timed_ms(slow), f"largest difference {diff:.2e}" + note)


def run(args: argparse.Namespace, report: Report) -> None:
    dry = args.dry_run
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    impl = "torch" if dry else "triton"  # a dry run checks the script, not the kernels
    torch.manual_seed(0)
    vocab, hidden_size = (1000, 64) if dry else (151669, 1024)
    weight = torch.randn(vocab, hidden_size, device=device, dtype=dtype) * 0.02

    # K1: one LM-head read per call.
    for batch in (1, 16) if dry else (1, 16, 128, 1024):
        hidden = torch.randn(batch, hidden_size, device=device, dtype=dtype)
        labels = torch.tensor([[9, 2]] * batch if dry else [[9693, 2152]] * batch, device=device)
        compare(report, "K1", f"label_logprobs, B {batch}, K 2",
                lambda h=hidden, ids=labels: label_logprobs(h, weight, ids, impl=impl).logprobs,
                lambda h=hidden, ids=labels: label_logprobs_reference(h, weight, ids).logprobs)  # fmt: skip
        head_gb = weight.numel() * weight.element_size() / 1e9
        report.rows[-1].note += f"; the head read at {head_gb / (report.rows[-1].value / 1e3):,.0f} GB/s"

    # Attention on W1's layout: keys = [shared prefix ; every prompt's own keys].
    rng = random.Random(0)
    prefix, prompts = (
        (8, [rng.randint(5, 20) for _ in range(4)])
        if dry
        else (90, [rng.randint(140, 524) for _ in range(256)])
    )
    heads, kv_heads, dim = (4, 2, 16) if dry else (16, 8, 128)
    starts = np.cumsum([0, *prompts[:-1]])
    table = np.array([[s, n, prefix + s, n, 0, prefix] for s, n in zip(starts, prompts)], dtype=np.int64)
    tq = sum(prompts)
    q = torch.randn(tq, heads, dim, device=device, dtype=dtype)
    k = torch.randn(prefix + tq, kv_heads, dim, device=device, dtype=dtype)
    v = torch.randn(prefix + tq, kv_heads, dim, device=device, dtype=dtype)
    segments = Segments.build(table, torch.device(device))
    scale = dim**-0.5
    compare(report, "attention W1", f"segment_attention, {len(prompts)} prompts, {tq:,} queries",
            lambda: segment_attention(q, k, v, segments, scale, impl=impl),
            lambda: segment_attention_reference(q, k, v, table, scale))  # fmt: skip

    # Element-wise and GEMM kernels on one forward batch.
    tokens, inter = (256, 128) if dry else (65536, 3072)
    x = torch.randn(tokens, hidden_size, device=device, dtype=dtype)
    residual = torch.randn(tokens, hidden_size, device=device, dtype=torch.float32)
    norm = torch.rand(hidden_size, device=device, dtype=dtype) + 0.5
    compare(report, "add_rmsnorm", f"{tokens:,} x {hidden_size}",
            lambda: add_rmsnorm(residual.clone(), x, norm, 1e-6, dtype, impl=impl),
            lambda: add_rmsnorm(residual.clone(), x, norm, 1e-6, dtype, impl="torch"),
            " (both times include a clone of the residual)")  # fmt: skip
    qk = torch.randn(tokens, heads, dim, device=device, dtype=dtype)
    angles = torch.arange(8192, device=device, dtype=torch.float32)[:, None] * torch.rand(dim, device=device)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.randint(0, 8192, (tokens,), device=device)
    head_norm = torch.rand(dim, device=device, dtype=dtype) + 0.5

    def rope_out(which: str) -> torch.Tensor:
        out = torch.empty_like(qk)
        rope(qk, heads, head_norm, 1e-6, cos, sin, positions, out, impl=which)  # type: ignore[arg-type]
        return out

    compare(
        report,
        "rope",
        f"{tokens:,} x {heads} heads x {dim}",
        lambda: rope_out(impl),
        lambda: rope_out("torch"),
    )
    gate, up = (
        torch.randn(tokens, inter, device=device, dtype=dtype),
        torch.randn(tokens, inter, device=device, dtype=dtype),
    )
    compare(report, "silu_mul", f"{tokens:,} x {inter:,}",
            lambda: silu_mul(gate, up, impl=impl), lambda: silu_mul(gate, up, impl="torch"))  # fmt: skip
    wg = (torch.randn(inter, hidden_size, device=device, dtype=dtype) * 0.02, None)
    wu = (torch.randn(inter, hidden_size, device=device, dtype=dtype) * 0.02, None)
    compare(report, "gated_mlp", f"{tokens:,} x {hidden_size} -> {inter:,}",
            lambda: gated_mlp(x, wg, wu, impl=impl), lambda: gated_mlp(x, wg, wu, impl="torch"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_reported(
        parser,
        "bench_kernels.py",
        run,
        dry_run="small sizes on the CPU: checks the script",
        name="kernel",
        baseline_name="torch reference",
    )


if __name__ == "__main__":
    main()
