"""Packed attention on the W1 layout: the Triton segment kernel against FlashAttention varlen, one GPU.

    PYTHONPATH=. python examples/benchmarks/bench_attention.py

One layer's attention of a Qwen3-0.6B shape (16 query heads, 8 key/value heads, head dim 128, bf16)
over W1's batch: a 90-token shared prefix and 256 prompts of 140-524 tokens (documents of 128-512
tokens plus the 12-token suffix), all in one batch. Steps, in one process:

1. correctness: every kernel config against a float32 per-segment reference (``attention.py``) and
   against FlashAttention on the same data;
2. FlashAttention 2 varlen (``aten._flash_attention_forward``), which needs each prompt's keys
   contiguous, so it runs on a buffer where the prefix keys are copied in front of every prompt (the
   copy is not timed);
3. the Triton kernel reading the prefix in place, for a sweep of tile configs;
4. the last layer's attention (one query per segment), both ways.

TFLOP/s count the causal work only (4 x heads x dim per visible query-key pair). Prints a markdown
table last and writes it to $OUT when OUT is set. ``import genscore_core`` needs pydantic; see
docs/benchmarks.md for running it on a machine without it.
"""

from __future__ import annotations

import datetime
import os
import random
from pathlib import Path

import numpy as np
import torch
import triton

from genscore_core.kernels.attention import (
    DEFAULT_TILING,
    LAST_TOKEN_TILING,
    AttentionTiling,
    Segments,
    segment_attention,
    segment_attention_reference,
)

HEADS, KV_HEADS, DIM = 16, 8, 128
PREFIX, SUFFIX, DOCS, DOC_LEN = 90, 12, 256, (128, 512)
SWEEP = [
    AttentionTiling(block_m=64, block_n=64, heads=2, num_warps=8, num_stages=3),
    AttentionTiling(block_m=64, block_n=32, heads=2, num_warps=8, num_stages=3),
    AttentionTiling(block_m=64, block_n=32, heads=1, num_warps=4, num_stages=3),
    AttentionTiling(block_m=128, block_n=32, heads=2, num_warps=8, num_stages=3),
    AttentionTiling(block_m=64, block_n=64, heads=2, num_warps=4, num_stages=2, tma=True),
    AttentionTiling(block_m=64, block_n=32, heads=2, num_warps=4, num_stages=3, tma=True),
    AttentionTiling(block_m=64, block_n=32, heads=2, num_warps=8, num_stages=4, tma=True),
    AttentionTiling(block_m=64, block_n=32, heads=1, num_warps=4, num_stages=3, tma=True),
]


def w1_table(rng: random.Random) -> np.ndarray:
    """The decoder's segment table for W1 in one batch: the prefix, then every prompt after it."""
    rows = [[0, PREFIX, 0, PREFIX, 0, 0]]
    start = PREFIX
    for _ in range(DOCS):
        n = rng.randint(*DOC_LEN) + SUFFIX
        rows.append([start, n, start, n, 0, PREFIX])
        start += n
    return np.asarray(rows, dtype=np.int64)


def label(config: AttentionTiling) -> str:
    tma = " TMA" if config.tma else ""
    return (
        f"BM{config.block_m} BN{config.block_n} H{config.heads} w{config.num_warps} s{config.num_stages}{tma}"
    )


def causal_flops(table: np.ndarray) -> float:
    pairs = sum(ql * (pl + kl - ql) + ql * (ql + 1) // 2 for _, ql, _, kl, _, pl in table.tolist())
    return 4.0 * HEADS * DIM * pairs


def flash_layout(table: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[prefix ; own] keys copied contiguously per segment, with cumulative offsets for varlen."""
    index: list[np.ndarray] = []
    q_lens, k_lens = [], []
    for _, ql, ks, kl, ps, pl in table.tolist():
        index.append(np.concatenate([np.arange(ps, ps + pl), np.arange(ks, ks + kl)]))
        q_lens.append(ql)
        k_lens.append(pl + kl)
    rows = torch.from_numpy(np.concatenate(index)).to(k.device)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32, device=k.device)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(k_lens)]), dtype=torch.int32, device=k.device)
    return k.index_select(0, rows), v.index_select(0, rows), cu_q, cu_k, max(q_lens), max(k_lens)


def flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float,
) -> torch.Tensor:
    """FlashAttention 2's variable-length causal forward (bottom-right aligned), as ATen ships it.

    ``torch.nn.attention.varlen.varlen_attn`` wraps the same kernel but, in torch 2.11, takes no
    grouped-query argument.
    """
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale
    )
    return out[0]  # type: ignore[no-any-return]


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    table = w1_table(random.Random(0))
    tokens = int(table[:, 1].sum())
    q = torch.randn(tokens, HEADS, DIM, device=device, dtype=torch.bfloat16)
    k = torch.randn(tokens, KV_HEADS, DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    scale = DIM**-0.5
    kf, vf, cu_q, cu_k, max_q, max_k = flash_layout(table, k, v)
    work = causal_flops(table)
    rows: list[tuple[str, float, float, float, float]] = []  # name, ms, TFLOP/s, err vs fp32, err vs flash

    # The float32 reference on a sample of segments (the whole batch takes a while one by one).
    sample = table[[0, 1, 2, 100, 200, 256]]
    reference = segment_attention_reference(q.float(), k.float(), v.float(), sample, scale)
    sample_rows = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in sample[:, :2]])).to(device)

    def error(out: torch.Tensor) -> float:
        return float(
            (out.index_select(0, sample_rows).float() - reference.index_select(0, sample_rows)).abs().max()
        )

    def flash() -> torch.Tensor:
        return flash_varlen(q, kf, vf, cu_q, cu_k, max_q, max_k, scale)

    flash_out = flash()
    ms = triton.testing.do_bench(flash)
    rows.append(("flash varlen (prefix copied per prompt)", ms, work / ms / 1e9, error(flash_out), 0.0))
    # The same kernel with blocks ordered by their own work alone (blocks of a segment scattered).
    scattered = Segments.build(table, device, DEFAULT_TILING, by_segment=False)
    out = segment_attention(q, k, v, scattered, scale, impl="triton")
    ms = triton.testing.do_bench(lambda: segment_attention(q, k, v, scattered, scale, impl="triton"))
    rows.append(("triton " + label(DEFAULT_TILING) + ", blocks by own work", ms, work / ms / 1e9, error(out),
                 float((out.float() - flash_out.float()).abs().max())))  # fmt: skip
    best: tuple[float, AttentionTiling] | None = None
    for config in [DEFAULT_TILING] + [c for c in SWEEP if c != DEFAULT_TILING]:
        segments = Segments.build(table, device, config)
        try:
            out = segment_attention(q, k, v, segments, scale, impl="triton")
            ms = triton.testing.do_bench(
                lambda s=segments: segment_attention(q, k, v, s, scale, impl="triton")
            )
        except Exception as exc:  # a config that does not fit (shared memory, registers) is reported
            print(f"{config}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        name = (
            f"triton BM{config.block_m} BN{config.block_n} H{config.heads} "
            f"w{config.num_warps} s{config.num_stages}"
            + (" TMA" if config.tma else "")
            + (" (default)" if config == DEFAULT_TILING else "")
        )
        diff = float((out.float() - flash_out.float()).abs().max())
        rows.append((name, ms, work / ms / 1e9, error(out), diff))
        print(rows[-1], flush=True)
        if best is None or ms < best[0]:
            best = (ms, config)

    # Last layer: one query per segment.
    last = table.copy()
    last[:, 0] = np.arange(len(last))
    last[:, 1] = 1
    ql = torch.randn(len(last), HEADS, DIM, device=device, dtype=torch.bfloat16)
    last_work = causal_flops(last)
    cu_last = torch.arange(len(last) + 1, dtype=torch.int32, device=device)
    ref_last = segment_attention_reference(ql.float(), k.float(), v.float(), last, scale)

    def flash_last() -> torch.Tensor:
        return flash_varlen(ql, kf, vf, cu_last, cu_k, 1, max_k, scale)

    ms = triton.testing.do_bench(flash_last)
    out_flash_last = flash_last()
    rows.append(
        (
            "last layer: flash varlen",
            ms,
            last_work / ms / 1e9,
            float((out_flash_last.float() - ref_last).abs().max()),
            0.0,
        )
    )
    for config in (
        LAST_TOKEN_TILING,
        AttentionTiling(block_m=16, block_n=32),
        AttentionTiling(block_m=16, tma=True),
        AttentionTiling(block_m=16, block_n=32, tma=True),
    ):
        segments = Segments.build(last, device, config)
        out = segment_attention(ql, k, v, segments, scale, impl="triton")
        ms = triton.testing.do_bench(lambda s=segments: segment_attention(ql, k, v, s, scale, impl="triton"))
        rows.append(
            ("last layer: triton " + label(config), ms,
             last_work / ms / 1e9, float((out.float() - ref_last).abs().max()),
             float((out.float() - out_flash_last.float()).abs().max()))
        )  # fmt: skip

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{stamp}; {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
        f"W1 batch: {tokens} query tokens, {len(table)} segments, {work / 1e12:.2f} TFLOP of causal attention",
        "",
        "| attention | ms/layer | TFLOP/s | max err vs fp32 | max diff vs flash |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {ms:.3f} | {tf:.0f} | {e:.1e} | {d:.1e} |" for n, ms, tf, e, d in rows]
    if best is not None:
        lines.append(f"\nfastest sweep config: {best[1]}")
    text = "\n".join(lines)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "bench_attention.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
