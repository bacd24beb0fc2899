"""Triton kernel for the packed decoder's attention; ``attention.py`` holds the torch reference.

Each query segment attends to two key ranges (see :class:`~genscore_core.kernels.attention.Segments`):
its group's shared prefix, which every query sees in full, then its own keys, causally aligned to the
bottom right. Reading the prefix keys where they lie means no per-prompt copy of them is ever made.

One program computes one block of ``BLOCK_M`` queries of one segment for ``HEADS`` query heads that
share a key/value head (grouped-query attention), so each K/V tile is loaded once for all of them.
Softmax is the streaming (online) form, in float32, with ``exp2``, over one loop of key tiles
(prefix, then own keys) masked per query. The host orders blocks so the longest run first, which
keeps the last wave of the grid short.

This module imports triton at the top; ``attention.py`` imports it only when it is needed.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from genscore_core.kernels.attention import Segments

LOG2E = 1.4426950408889634


@triton.jit
def _load_tile(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    src,
    first_row,
    kv_head,
    stride_t,
    stride_h,
    limit,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    TMA: tl.constexpr,
):
    """Rows ``first_row + [0, BLOCK_N)`` of one key/value head: [BLOCK_N, D].

    With TMA, ``src`` is a tensor descriptor over [rows, heads * D]; rows past the tensor read as
    zero and rows of other segments come in too (the caller masks their scores). Otherwise ``src`` is
    a pointer and rows from ``limit`` on read as zero.
    """
    if TMA:
        tile = src.load([first_row.to(tl.int32), kv_head * D])
    else:
        rows = tl.arange(0, BLOCK_N)
        ptrs = src + (first_row + rows)[:, None] * stride_t + kv_head * stride_h + tl.arange(0, D)[None, :]
        tile = tl.load(ptrs, mask=(rows < limit)[:, None], other=0.0)
    return tile


@triton.jit
def _segment_attention_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    q_ptr,  # [Tq, Hq, D]
    k_src,  # [Tk, Hkv, D]: a pointer, or a descriptor over [Tk, Hkv * D] when TMA
    v_src,  # same as k_src
    o_ptr,  # [Tq, Hq, D]
    seg_ptr,  # [S, 6] int64: q_start, q_len, k_start, k_len, prefix_start, prefix_len
    blocks_ptr,  # [NB, 2] int64: segment, first query (within the segment) of the block
    scale_log2e,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,  # query heads per key/value head
    HEADS: tl.constexpr,  # query heads per program (divides GROUP)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    TMA: tl.constexpr,
    PRECISION: tl.constexpr,
    FP32_DOT: tl.constexpr,  # bfloat16 in the CPU interpreter: dots on float32 copies of the tiles
):
    pack = tl.program_id(0)
    block = tl.program_id(1)
    # Row offsets stay 64-bit for addressing; lengths and in-segment indices are 32-bit, which
    # keeps the inner loops' index arithmetic cheap (64-bit lengths cost 40% of the speed).
    seg = tl.load(blocks_ptr + 2 * block)
    m_start = tl.load(blocks_ptr + 2 * block + 1).to(tl.int32)
    q_start = tl.load(seg_ptr + 6 * seg)
    q_len = tl.load(seg_ptr + 6 * seg + 1).to(tl.int32)
    k_start = tl.load(seg_ptr + 6 * seg + 2)
    k_len = tl.load(seg_ptr + 6 * seg + 3).to(tl.int32)
    p_start = tl.load(seg_ptr + 6 * seg + 4)
    p_len = tl.load(seg_ptr + 6 * seg + 5).to(tl.int32)

    ROWS: tl.constexpr = HEADS * BLOCK_M
    rows = tl.arange(0, ROWS)
    qi = m_start + rows % BLOCK_M  # query index within the segment
    head = pack * HEADS + rows // BLOCK_M
    kv_head = (pack * HEADS) // GROUP
    valid = qi < q_len
    d = tl.arange(0, D)
    q_rows = q_ptr + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_rows + d[None, :], mask=valid[:, None], other=0.0)
    if FP32_DOT:
        q = q.to(tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    cols = tl.arange(0, BLOCK_N)

    # One loop over the block's key tiles: the prefix's first (tile t < n_prefix), then its own
    # keys up to the last one its last query sees. Query qi sees the prefix keys below p_len and own
    # keys up to shift + qi (bottom-right causal), so every tile is masked per query; one pipeline
    # for all tiles beats separate unmasked and diagonal loops (each a few tiles long, each with its
    # own pipeline to fill and drain): docs/benchmarks.md, "Attention kernel".
    shift = k_len - q_len
    n_prefix = tl.cdiv(p_len, BLOCK_N)
    n_own = tl.cdiv(tl.minimum(shift + m_start + BLOCK_M, k_len), BLOCK_N)
    own_limit = tl.minimum(shift + qi + 1, k_len)  # own keys query qi sees
    for t in range(0, n_prefix + n_own):
        in_prefix = t < n_prefix
        start = tl.where(in_prefix, t, t - n_prefix) * BLOCK_N
        row = tl.where(in_prefix, p_start, k_start) + start
        limit = tl.where(in_prefix, p_len, k_len) - start
        k = _load_tile(k_src, row, kv_head, stride_kt, stride_kh, limit, BLOCK_N, D, TMA)
        v = _load_tile(v_src, row, kv_head, stride_vt, stride_vh, limit, BLOCK_N, D, TMA)
        if FP32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        visible = cols[None, :] < (tl.where(in_prefix, p_len, own_limit) - start)[:, None]
        # Streaming softmax in base 2 (the scale carries log2(e)), float32.
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(visible, s * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every query sees the first tile's first key
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(
        o_ptr + (q_start + qi)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=valid[:, None],
    )


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Segments,
    scale: float,
) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D]; ``segments`` on q's device."""
    heads, dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and dim & (dim - 1) == 0
    # Contiguous whatever q's row stride (q may be a column block of the fused q/k/v product).
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    config = segments.tiling
    per_program = config.heads_per_program(group)
    if segments.num_blocks == 0:
        return out
    k_src: object = k
    v_src: object = v
    tma = config.tma and _has_tma(q.device) and _tma_ready(k) and _tma_ready(v)
    if tma:
        k_src = _descriptor(k, config.block_n)
        v_src = _descriptor(v, config.block_n)
    # The CPU interpreter multiplies bfloat16 bit patterns in tl.dot (it stores bfloat16 as uint16;
    # triton-lang/triton#11584): there the tiles are upcast first, which is exact.
    fp32_dot = q.dtype == torch.bfloat16 and not q.is_cuda
    _segment_attention_kernel[(heads // per_program, segments.num_blocks)](
        q,
        k_src,
        v_src,
        out,
        segments.table,
        segments.blocks,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEADS=per_program,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        D=dim,
        TMA=tma,
        PRECISION="ieee" if q.dtype == torch.float32 or fp32_dot else "tf32",
        FP32_DOT=fp32_dot,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def _descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A TMA descriptor over [rows, heads * D] with [block_rows, D] tiles. Rows may have a stride (K
    and V as column blocks of the fused q/k/v product); the heads of a row must be contiguous."""
    rows, heads, dim = x.shape
    return TensorDescriptor.from_tensor(x.view(rows, heads * dim), [block_rows, dim])


def _tma_ready(x: torch.Tensor) -> bool:
    """Whether a descriptor can cover ``x`` [rows, heads, D]: heads contiguous in a row, a 16-byte
    aligned start and row stride (other tensors go through pointer loads)."""
    return (
        x.stride(2) == 1
        and x.stride(1) == x.shape[2]
        and x.data_ptr() % 16 == 0
        and (x.stride(0) * x.element_size()) % 16 == 0
    )


@functools.lru_cache(maxsize=8)
def _has_tma(device: torch.device) -> bool:
    if device.type != "cuda":
        return True  # the interpreter
    return torch.cuda.get_device_capability(device)[0] >= 9
