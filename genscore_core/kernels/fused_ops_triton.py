"""Triton kernels for the packed decoder's small operations; ``fused_ops.py`` holds their torch versions.

Each kernel is one pass over its tensors, computing in float32 and rounding once on the store:

* ``add_rmsnorm``: residual += delta (in float32, stored in place in the residual's dtype) and RMSNorm *
  weight, one program per row;
* ``rope``: per-head RMSNorm (Qwen3's q/k norms) and the rotary embedding, in place or not, one
  program per token;
* ``silu_mul``: silu(gate) * up, reading rows with a stride (the two halves of one gate/up product).

This module imports triton at the top; ``fused_ops.py`` imports it only when it is needed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    res_ptr,  # [T, H] (float32 in the decoder by default), updated in place when HAS_DELTA
    delta_ptr,  # [T, H]
    w_ptr,  # [H]
    out_ptr,  # [T, H]
    H,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    r = tl.load(res_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        r = r + d
        tl.store(res_ptr + row * H + cols, r.to(res_ptr.dtype.element_ty), mask=mask)
    variance = tl.sum(r * r, axis=0) / H
    rstd = 1.0 / tl.sqrt(variance + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, (r * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(
    residual: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    assert residual.is_contiguous()
    t, h = residual.shape
    out = torch.empty((t, h), dtype=out_dtype, device=residual.device)
    if t == 0:
        return out
    if delta is not None:
        delta = delta.contiguous()
    weight = weight.contiguous()  # read by column index
    block = triton.next_power_of_2(h)
    _add_rmsnorm_kernel[(t,)](
        residual,
        delta if delta is not None else residual,
        weight,
        out,
        h,
        eps,
        HAS_DELTA=delta is not None,
        BLOCK=block,
        num_warps=4 if block <= 2048 else 8,
    )
    return out


@triton.jit
def _rope_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    x_ptr,  # [T, NH * D] (row stride x_stride)
    x_stride,
    w_ptr,  # [D] head norm weight (unused unless HAS_NORM)
    cos_ptr,  # [P, D] float32
    sin_ptr,  # [P, D] float32
    pos_ptr,  # [T] int64
    out_ptr,  # [T, NH, D] (row stride out_stride); may be x itself
    out_stride,
    eps,
    NH: tl.constexpr,
    NH_P2: tl.constexpr,
    D: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = D // 2
    heads = tl.arange(0, NH_P2)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < NH
    src = x_ptr + t * x_stride + heads * D + cols
    # Both halves are read before anything is stored, so out may alias x.
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        variance = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D
        rstd = (1.0 / tl.sqrt(variance + eps))[:, None]
        w1 = tl.load(w_ptr + cols).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + cols).to(tl.float32)
        x1 = x1 * rstd * w1
        x2 = x2 * rstd * w2
    pos = tl.load(pos_ptr + t)
    c1 = tl.load(cos_ptr + pos * D + cols)
    c2 = tl.load(cos_ptr + pos * D + HALF + cols)
    s1 = tl.load(sin_ptr + pos * D + cols)
    s2 = tl.load(sin_ptr + pos * D + HALF + cols)
    o1 = x1 * c1 - x2 * s1
    o2 = x2 * c2 + x1 * s2
    dst = out_ptr + t * out_stride + heads * D + cols
    tl.store(dst, o1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, o2.to(out_ptr.dtype.element_ty), mask=mask)


def rope(
    x: torch.Tensor,
    num_heads: int,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
) -> None:
    t = x.shape[0]
    if t == 0:
        return
    d = out.shape[-1]
    x = x.view(t, -1)
    assert x.stride(1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    assert out.stride(-1) == 1 and out.stride(-2) == d
    _rope_kernel[(t,)](
        x,
        x.stride(0),
        norm_weight.contiguous() if norm_weight is not None else cos,
        cos,
        sin,
        positions,
        out,
        out.stride(0),
        eps,
        NH=num_heads,
        NH_P2=triton.next_power_of_2(num_heads),
        D=d,
        HAS_NORM=norm_weight is not None,
        num_warps=4,
    )


@triton.jit
def _silu_mul_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    gate_ptr,  # [M, N] (row stride stride_g)
    up_ptr,  # [M, N] (row stride stride_u)
    out_ptr,  # [M, N] (row stride stride_o)
    M,
    N,
    stride_g,
    stride_u,
    stride_o,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Rows with a stride: gate and up may be the two halves of one [M, 2N] gate/up product.
    col_blocks = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    rows = ((pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
    cols = ((pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
    mask = (rows < M) & (cols < N)
    g = tl.load(gate_ptr + rows * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + rows * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as [rows, last dim] with unit column stride: itself when it is one, else a copy."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    return x.contiguous().view(-1, x.shape[-1] if x.dim() else 1)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, contiguous, in gate's dtype and shape; [M, N] inputs may have row strides."""
    assert gate.shape == up.shape
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if gate.numel() == 0:
        return out
    g, u, o = _rows(gate), _rows(up), _rows(out)
    m, n = g.shape
    # 2,048 elements a program (16-byte accesses with 8 warps), at most 1,024 of them in a row.
    block_n = min(1024, triton.next_power_of_2(n))
    block_m = 2048 // block_n
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _silu_mul_kernel[grid](
        g, u, o, m, n, g.stride(0), u.stride(0), o.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=8
    )
    return out
