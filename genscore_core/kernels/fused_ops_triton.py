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
    normed, cols, mask = _added_normed_row(res_ptr, delta_ptr, w_ptr, row, H, eps, HAS_DELTA, BLOCK)
    tl.store(out_ptr + row * H + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _added_normed_row(  # type: ignore[no-untyped-def]
    res_ptr, delta_ptr, w_ptr, row, H, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
):
    """Row ``row`` of ``res (+ delta, stored back into res)``, RMS-normed and times ``w``: float32
    [BLOCK], with its columns and their mask. The one body of the bf16 and the FP8 kernels."""
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
    return r * rstd * w, cols, mask


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


# -- FP8 outputs (opt-in quantization, genscore_core.packed.fp8) ------------------------------------
#
# The same operations, each writing its row as float8 e4m3 values plus one float32 scale per row
# (amax / 448), so the next product reads a quarter of the bytes of a float32 row and no separate
# quantisation pass is run. Rows are whole in one program: the scale needs the row's absolute maximum.

# Instances of tl.constexpr (an annotation would not do: compiled kernels may read no other globals).
E4M3_MAX = tl.constexpr(448.0)
MIN_AMAX = tl.constexpr(1e-12)


@triton.jit
def _e4m3_round(v):  # type: ignore[no-untyped-def]
    """``v`` (float32, |v| <= 448) rounded to the nearest e4m3 value (ties to even), still float32.

    Rounded here, not by the float32 -> float8 conversion, so the result is the same on the GPU
    and in the CPU interpreter (whose conversion drops the carry into the next power of two: 127.6
    became 64): with the step of ``v``'s binade (3 mantissa bits; 2^-9 below the smallest normal,
    2^-6), adding and subtracting 1.5 * 2^23 * step leaves float32's own round-to-nearest-even at
    that step. The conversion that follows is then exact."""
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    magic = step * 12582912.0  # 1.5 * 2^23
    return tl.minimum(tl.maximum((v + magic) - magic, -E4M3_MAX), E4M3_MAX)


@triton.jit
def _store_e4m3_row(y, mask, out_ptr, scale_ptr, row):  # type: ignore[no-untyped-def]
    """Store one float32 row ``y`` (masked lanes zero) as e4m3 values and its scale amax / 448."""
    # amax / 448 and the division rounded as IEEE says (plain "/" is approximate on the GPU), so the
    # values are those of quantize_rows_e4m3, ties of e4m3 rounding included.
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), MIN_AMAX), E4M3_MAX)
    q = _e4m3_round(tl.math.div_rn(y, scale))
    tl.store(out_ptr, q.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _add_rmsnorm_fp8_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    res_ptr,  # [T, H], updated in place when HAS_DELTA
    delta_ptr,  # [T, H]
    w_ptr,  # [H]
    out_ptr,  # [T, H] float8 e4m3
    scale_ptr,  # [T] float32
    H,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    normed, cols, mask = _added_normed_row(res_ptr, delta_ptr, w_ptr, row, H, eps, HAS_DELTA, BLOCK)
    _store_e4m3_row(normed, mask, out_ptr + row * H + cols, scale_ptr, row)


def _row_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def add_rmsnorm_fp8(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    assert residual.is_contiguous()
    t, h = residual.shape
    out = torch.empty((t, h), dtype=torch.float8_e4m3fn, device=residual.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=residual.device)
    if t == 0:
        return out, scale
    if delta is not None:
        delta = delta.contiguous()
    block = triton.next_power_of_2(h)
    _add_rmsnorm_fp8_kernel[(t,)](
        residual,
        delta if delta is not None else residual,
        weight.contiguous(),
        out,
        scale,
        h,
        eps,
        HAS_DELTA=delta is not None,
        BLOCK=block,
        num_warps=_row_warps(block),
    )
    return out, scale


@triton.jit
def _silu_mul_fp8_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    gate_ptr,  # [M, N] (row stride stride_g)
    up_ptr,  # [M, N] (row stride stride_u)
    out_ptr,  # [M, N] float8 e4m3, contiguous
    scale_ptr,  # [M] float32
    N,
    stride_g,
    stride_u,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    _store_e4m3_row(g / (1.0 + tl.exp(-g)) * u, mask, out_ptr + row * N + cols, scale_ptr, row)


def silu_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert gate.shape == up.shape and gate.dim() == 2
    m, n = gate.shape
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn, device=gate.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=gate.device)
    if m == 0:
        return out, scale
    g, u = _rows(gate), _rows(up)
    block = triton.next_power_of_2(n)
    _silu_mul_fp8_kernel[(m,)](
        g, u, out, scale, n, g.stride(0), u.stride(0), BLOCK=block, num_warps=_row_warps(block)
    )
    return out, scale
