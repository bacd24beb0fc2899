"""Triton kernels for label log-probabilities: one fused pass over the LM head, no [B, V] tensor.

Two launches:

1. ``_partial_lse_kernel``, grid (row blocks, vocabulary splits). Each program multiplies tiles of W
   with a block of rows of h on the tensor cores and keeps a running max and sum of exponentials
   (online softmax, Milakov & Gimelshein 2018, arXiv:1805.02867) in fp32 over its
   ``tiles_per_split`` tiles. It writes only one (max, sum) pair per (row, split) into a
   [B, n_splits] scratch: the split-vocabulary reduction of flash-decoding. For small B the cost
   is reading W once (311 MB for Qwen3), so all rows of h share each W tile; for large B it
   becomes a matmul and rows are tiled too.
2. ``_finish_kernel``, one program per row: merges the splits into log Z (the same running max and
   sum, over splits) and takes the K label logits as dot products with the gathered rows W[label]
   (K x H reads, no [B, K, H] copy).

This module imports triton at the top; ``label_logprobs.py`` imports it only when it is needed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from genscore_core.kernels.label_logprobs import LabelLogprobs


class LabelLogprobsTiling(NamedTuple):
    """Tiling of ``_partial_lse_kernel``.

    ``tiles_per_split`` vocabulary tiles per program (the online softmax runs across them);
    ``swap_ab`` computes W_tile @ h^T instead of h @ W_tile^T, which puts the vocabulary on the
    wide "M" side of the tensor-core instruction when B is narrow (swap-AB, as in skinny GEMMs).
    """

    block_b: int
    block_v: int
    block_h: int
    num_warps: int
    num_stages: int
    tiles_per_split: int
    swap_ab: bool


def default_config(n_rows: int) -> LabelLogprobsTiling:
    """Tiling by batch size: the best of a sweep on one H200 (H = 1024, V = 151669, bf16).

    See docs/benchmarks.md, "Label log-probabilities kernel". Only B = 1, 16, 64, 128 and 1024 were
    swept: B = 2..8 use the tiling of B = 1, 17..32 that of B = 64 with 32-row blocks, and B > 128
    that of B = 1024.
    """
    # Small B is memory-bound: one row block, so W is read once. tl.dot needs at least 16 rows;
    # padded rows are masked. One vocabulary tile per program measured as fast as or faster
    # than several: the GPU overlaps a new program's first loads with the others' work, while
    # a program's own next tile waits for its epilogue.
    if n_rows <= 8:
        return LabelLogprobsTiling(16, 64, 128, 4, 4, 1, True)
    if n_rows <= 16:
        return LabelLogprobsTiling(16, 128, 128, 4, 3, 1, False)
    if n_rows <= 32:
        return LabelLogprobsTiling(32, 128, 64, 4, 4, 1, False)
    if n_rows <= 64:
        return LabelLogprobsTiling(64, 128, 64, 4, 4, 1, False)
    if n_rows <= 128:
        return LabelLogprobsTiling(128, 128, 64, 8, 3, 1, False)
    # Large B: a compute-bound matmul with a max / sum-of-exp epilogue.
    return LabelLogprobsTiling(128, 256, 64, 8, 3, 1, False)


@triton.jit
def _partial_lse_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    h_ptr,  # [B, H]
    w_ptr,  # [V, H]
    bias_ptr,  # [V] (unused unless HAS_BIAS)
    max_ptr,  # [B, n_splits] fp32
    sum_ptr,  # [B, n_splits] fp32
    n_rows,
    n_vocab,
    hidden_size,
    n_splits,
    tiles_per_split,
    h_stride,
    w_stride,
    HAS_BIAS: tl.constexpr,
    FP32_DOT: tl.constexpr,
    SWAP_AB: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # Row blocks are axis 0, the fastest-varying program id, so programs that share a W tile run
    # together and all but the first read it from L2 (matters for large B only).
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    # int64 offsets: row * stride overflows int32 once B * H or V * H passes 2**31
    # (https://github.com/triton-lang/triton/issues/1058).
    rows = pid_b.to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    offs_h = tl.arange(0, BLOCK_H)

    run_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_B], tl.float32)
    first_tile = pid_s * tiles_per_split
    for t in range(0, tiles_per_split):
        cols = (first_tile + t).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
        col_ok = cols < n_vocab
        # fp32 accumulation; acc is logits^T [BLOCK_V, BLOCK_B] when SWAP_AB, else [BLOCK_B, BLOCK_V].
        if SWAP_AB:
            acc = tl.zeros([BLOCK_V, BLOCK_B], tl.float32)
        else:
            acc = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
        for k in range(0, hidden_size, BLOCK_H):
            hk = k + offs_h
            hk_ok = hk < hidden_size
            if SWAP_AB:
                a = tl.load(
                    w_ptr + cols[:, None] * w_stride + hk[None, :],
                    mask=col_ok[:, None] & hk_ok[None, :],
                    other=0.0,
                )
                b = tl.load(
                    h_ptr + rows[None, :] * h_stride + hk[:, None],
                    mask=row_ok[None, :] & hk_ok[:, None],
                    other=0.0,
                )
            else:
                a = tl.load(
                    h_ptr + rows[:, None] * h_stride + hk[None, :],
                    mask=row_ok[:, None] & hk_ok[None, :],
                    other=0.0,
                )
                b = tl.load(
                    w_ptr + cols[None, :] * w_stride + hk[:, None],
                    mask=col_ok[None, :] & hk_ok[:, None],
                    other=0.0,
                )
            if FP32_DOT:
                # fp32 inputs: full precision, not TF32 (10-bit mantissa), tl.dot's default.
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        # The epilogue works on [BLOCK_B, BLOCK_V]; transposing a narrow tile once per vocabulary
        # tile is cheap next to the H / BLOCK_H dot products before it.
        if SWAP_AB:
            logits = tl.trans(acc)
        else:
            logits = acc
        if HAS_BIAS:
            logits += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        logits = tl.where(col_ok[None, :], logits, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(logits, axis=1))
        # A split can start past the vocabulary only for the tail tiles; a row whose max is still
        # -inf must not produce exp(-inf - -inf) = NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.sum(tl.exp(logits - safe_max[:, None]), axis=1)
        run_max = new_max

    out = rows * n_splits + pid_s
    tl.store(max_ptr + out, run_max, mask=row_ok)
    tl.store(sum_ptr + out, run_sum, mask=row_ok)


@triton.jit
def _finish_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    h_ptr,  # [B, H]
    w_ptr,  # [V, H]
    bias_ptr,  # [V] (unused unless HAS_BIAS)
    ids_ptr,  # [B, K] integer
    mask_ptr,  # [B, K] uint8 (unused unless HAS_MASK)
    max_ptr,  # [B, n_splits] fp32
    sum_ptr,  # [B, n_splits] fp32
    out_ptr,  # [B, K] fp32
    lse_ptr,  # [B] fp32
    n_labels,
    n_vocab,
    hidden_size,
    n_splits,
    h_stride,
    w_stride,
    ids_stride,
    mask_stride,
    out_stride,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)

    # log Z = logsumexp over splits of (max_s + log sum_s), merged element-wise then reduced.
    acc_max = tl.full([BLOCK_S], float("-inf"), tl.float32)
    acc_sum = tl.zeros([BLOCK_S], tl.float32)
    for s in range(0, n_splits, BLOCK_S):
        offs = s + tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        m = tl.load(max_ptr + row * n_splits + offs, mask=ok, other=float("-inf"))
        z = tl.load(sum_ptr + row * n_splits + offs, mask=ok, other=0.0)
        new_max = tl.maximum(acc_max, m)
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        acc_sum = acc_sum * tl.exp(acc_max - safe) + z * tl.exp(m - safe)
        acc_max = new_max
    top = tl.max(acc_max, axis=0)
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    lse = safe_top + tl.log(tl.sum(acc_sum * tl.exp(acc_max - safe_top), axis=0))
    tl.store(lse_ptr + row, lse)

    offs_h = tl.arange(0, BLOCK_H)
    for k0 in range(0, n_labels, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < n_labels
        valid = k_ok
        if HAS_MASK:
            valid = valid & (tl.load(mask_ptr + row * mask_stride + ks, mask=k_ok, other=0) != 0)
        # Padded label slots may hold any id (-1, V, ...): never dereference them. Nor an unmasked
        # id outside the vocabulary (GPU ids are not checked on the host): its slot is NaN.
        ids = tl.load(ids_ptr + row * ids_stride + ks, mask=valid, other=0).to(tl.int64)
        in_vocab = (ids >= 0) & (ids < n_vocab)
        valid_id = valid & in_vocab
        dots = tl.zeros([BLOCK_K], tl.float32)
        for k in range(0, hidden_size, BLOCK_H):
            hk = k + offs_h
            hk_ok = hk < hidden_size
            w = tl.load(
                w_ptr + ids[:, None] * w_stride + hk[None, :],
                mask=valid_id[:, None] & hk_ok[None, :],
                other=0.0,
            )
            hv = tl.load(h_ptr + row * h_stride + hk, mask=hk_ok, other=0.0)
            dots += tl.sum(w.to(tl.float32) * hv.to(tl.float32)[None, :], axis=1)
        if HAS_BIAS:
            dots += tl.load(bias_ptr + ids, mask=valid_id, other=0.0).to(tl.float32)
        logp = tl.where(valid, tl.where(in_vocab, dots - lse, float("nan")), float("-inf"))
        tl.store(out_ptr + row * out_stride + ks, logp, mask=k_ok)


def label_logprobs_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    out: LabelLogprobs | None = None,
    config: LabelLogprobsTiling | None = None,
) -> LabelLogprobs:
    """Launch the fused kernels. Inputs are assumed validated by ``label_logprobs``.

    Args:
        out: Optional preallocated ([B, K] fp32, [B] fp32) buffers, written in place (tests
            poison them to catch unwritten elements).
        config: Tile sizes; ``default_config(B)`` when omitted (tests run others).
    """
    # hidden: [B, H], weight: [V, H], label_ids: [B, K], label_mask: [B, K], bias: [V]
    n_rows, hidden_size = hidden.shape
    n_vocab = weight.shape[0]
    n_labels = label_ids.shape[1]
    device = hidden.device
    if out is None:
        out = LabelLogprobs(
            torch.empty((n_rows, n_labels), dtype=torch.float32, device=device),
            torch.empty((n_rows,), dtype=torch.float32, device=device),
        )
    if n_rows == 0:
        return out

    weight = weight.detach()
    if weight.stride(1) != 1:
        weight = weight.contiguous()  # rare (a transposed view); copies W once
    hidden = hidden.detach().to(weight.dtype)
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()  # rows may be strided (h[:, -1, :]), elements may not
    label_ids = label_ids.contiguous()
    if label_mask is not None:
        label_mask = label_mask.contiguous().view(torch.uint8)
    if bias is not None:
        bias = bias.detach().contiguous()

    cfg = config or default_config(n_rows)
    n_tiles = triton.cdiv(n_vocab, cfg.block_v)
    n_splits = triton.cdiv(n_tiles, cfg.tiles_per_split)
    # The only intermediate: one (max, sum) per row and split, [B, n_splits] fp32.
    part_max = torch.empty((n_rows, n_splits), dtype=torch.float32, device=device)
    part_sum = torch.empty((n_rows, n_splits), dtype=torch.float32, device=device)

    grid = (triton.cdiv(n_rows, cfg.block_b), n_splits)
    _partial_lse_kernel[grid](
        hidden,
        weight,
        bias if bias is not None else weight,
        part_max,
        part_sum,
        n_rows,
        n_vocab,
        hidden_size,
        n_splits,
        cfg.tiles_per_split,
        hidden.stride(0),
        weight.stride(0),
        HAS_BIAS=bias is not None,
        # The CPU interpreter multiplies bf16 bit patterns in tl.dot (it stores bf16 as uint16;
        # triton-lang/triton#11584), so there bf16 tiles are upcast first: exact, same result.
        FP32_DOT=weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and not weight.is_cuda),
        SWAP_AB=cfg.swap_ab,
        BLOCK_B=cfg.block_b,
        BLOCK_V=cfg.block_v,
        BLOCK_H=cfg.block_h,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    logprobs, log_normalizer = out
    _finish_kernel[(n_rows,)](
        hidden,
        weight,
        bias if bias is not None else weight,
        label_ids,
        label_mask if label_mask is not None else label_ids,
        part_max,
        part_sum,
        logprobs,
        log_normalizer,
        n_labels,
        n_vocab,
        hidden_size,
        n_splits,
        hidden.stride(0),
        weight.stride(0),
        label_ids.stride(0),
        label_mask.stride(0) if label_mask is not None else 0,
        logprobs.stride(0),
        HAS_BIAS=bias is not None,
        HAS_MASK=label_mask is not None,
        BLOCK_S=512,  # fixed, so that the split count does not trigger a recompile
        BLOCK_K=min(max(triton.next_power_of_2(n_labels), 16), 64),
        BLOCK_H=128,
        num_warps=4,
    )
    return out
