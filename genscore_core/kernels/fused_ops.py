"""The small fused operations of the packed decoder, with a plain-torch version of each.

The decoder's residual stream stays in float32: norms and rotary embeddings are computed in float32 and
only the inputs of matrix products are cast to the model's dtype, so bf16 rounding does not pile up
over the layers. Each operation is one Triton kernel (``fused_ops_triton.py``) or the torch version
below, which computes the same function, as ``impl`` asks (:mod:`genscore_core.kernels.dispatch`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from genscore_core.kernels.dispatch import KernelImpl, use_triton


def _dims(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _check_add_rmsnorm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> None:
    # Checked on both paths: the kernel reads by these sizes, past a short tensor without a word.
    if residual.dim() != 2:
        raise ValueError(f"add_rmsnorm: the residual must be [tokens, hidden], got {_dims(residual)}")
    if delta is not None and delta.shape != residual.shape:
        raise ValueError(f"add_rmsnorm: delta {_dims(delta)} does not match the residual {_dims(residual)}")
    if weight.shape != residual.shape[1:]:
        raise ValueError(f"add_rmsnorm: weight {_dims(weight)} does not match the residual {_dims(residual)}")


def add_rmsnorm(
    residual: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype,
    *,
    impl: KernelImpl = "auto",
) -> torch.Tensor:
    """``residual += delta`` (in place), then ``RMSNorm(residual) * weight`` as ``out_dtype``.

    ``residual``: [T, H], float32 in the decoder (a lower-precision one works too); ``delta``: [T, H]
    in any float dtype, or None to only normalise. The arithmetic is float32 whatever the dtypes: a
    lower-precision residual stores the sum rounded and normalises the unrounded sum.
    """
    _check_add_rmsnorm(residual, delta, weight)
    # Updated in place, so the kernel cannot take a contiguous copy.
    strided = None if residual.is_contiguous() else "the residual's rows are not contiguous"
    if use_triton(impl, residual.device, kernel="add_rmsnorm", unsupported=strided):
        from genscore_core.kernels import fused_ops_triton

        return fused_ops_triton.add_rmsnorm(residual, delta, weight, eps, out_dtype)
    if residual.dtype == torch.float32:
        r = residual if delta is None else residual.add_(delta.float())
    else:  # a residual in a bf16/fp16 model's dtype: add in float32, store rounded
        r = residual.float() if delta is None else residual.float() + delta.float()
        residual.copy_(r)
    variance = r.pow(2).mean(-1, keepdim=True)
    return (r * torch.rsqrt(variance + eps) * weight.float()).to(out_dtype)


def rope(
    x: torch.Tensor,
    num_heads: int,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
    *,
    impl: KernelImpl = "auto",
) -> None:
    """Per-head RMSNorm (when ``norm_weight`` is given, as Qwen3's q/k norms) and rotary embedding.

    ``x``: [T, heads, D] (or [T, heads * D]) projections; ``cos``/``sin``: [max position, D] float32
    tables; ``positions``: [T]. Writes [T, heads, D] to ``out``, which may be ``x`` itself.
    """
    head_dim = out.shape[-1]
    _check_rope(x, num_heads, norm_weight, cos, sin, positions, out)
    odd = f"head dimension {head_dim} is not a power of two" if head_dim & (head_dim - 1) else None
    if use_triton(impl, x.device, kernel="rope", unsupported=odd):
        from genscore_core.kernels import fused_ops_triton

        fused_ops_triton.rope(x, num_heads, norm_weight, eps, cos, sin, positions, out)
        return
    t = x.shape[0]
    h = x.reshape(t, num_heads, -1).float()
    if norm_weight is not None:
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + eps) * norm_weight.float()
    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)
    half = h.shape[-1] // 2
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    out.copy_(((h * c) + (rotated * s)).to(out.dtype).view(out.shape))


def _check_rope(
    x: torch.Tensor,
    num_heads: int,
    norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
) -> None:
    # Checked on both paths: the kernel reads by these sizes, past a short tensor without a word.
    head_dim = out.shape[-1]
    rows = x.shape[0]
    if math.prod(x.shape[1:]) != num_heads * head_dim:
        raise ValueError(f"rope: x {_dims(x)} does not hold {num_heads} heads of {head_dim}")
    if out.shape[0] != rows or math.prod(out.shape[1:]) != num_heads * head_dim:
        raise ValueError(f"rope: out {_dims(out)} does not hold x's {rows} rows of {num_heads} heads")
    if norm_weight is not None and norm_weight.shape != (head_dim,):
        raise ValueError(
            f"rope: norm_weight {_dims(norm_weight)} does not match the head dimension {head_dim}"
        )
    if cos.dim() != 2 or cos.shape[1] != head_dim or sin.shape != cos.shape:
        raise ValueError(
            f"rope: cos and sin {_dims(cos)}, {_dims(sin)} do not match the head dimension {head_dim}"
        )
    if positions.shape != (rows,):
        raise ValueError(f"rope: positions {_dims(positions)} do not match x's {rows} rows")


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: KernelImpl = "auto") -> torch.Tensor:
    """``silu(gate) * up`` computed in float32, returned contiguous in ``gate``'s dtype.

    [M, N] inputs may be views with a row stride, such as the two halves of one [M, 2N] gate/up
    product: they are read in place."""
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {_dims(gate)} and up {_dims(up)} differ in shape")
    if use_triton(impl, gate.device, kernel="silu_mul"):
        from genscore_core.kernels import fused_ops_triton

        return fused_ops_triton.silu_mul(gate, up)
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


# -- FP8 outputs (opt-in quantization, genscore_core.packed.fp8) ------------------------------------

E4M3_MAX = 448.0
"""The largest finite float8 e4m3 value: a row's scale is its absolute maximum over this."""
MIN_AMAX = 1e-12
"""A row's absolute maximum is taken to be at least this (an all-zero row gets a finite scale)."""


def quantize_rows_e4m3(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 rows ``y`` [M, N] as float8 e4m3 values and one float32 scale [M, 1] each: the scale
    is the row's absolute maximum / 448, the values ``y / scale`` rounded to nearest (ties to even),
    so that ``values * scale`` approximates ``y``. What every FP8-output kernel stores."""
    scale = y.abs().amax(-1, keepdim=True).clamp(min=MIN_AMAX) / E4M3_MAX
    return (y / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def add_rmsnorm_fp8(
    residual: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    impl: KernelImpl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rmsnorm` whose output is quantised per row: (float8 e4m3 [T, H], float32 scale [T, 1]),
    the normalised row quantised from float32 (never rounded to bf16 first)."""
    _check_add_rmsnorm(residual, delta, weight)
    strided = None if residual.is_contiguous() else "the residual's rows are not contiguous"
    if use_triton(impl, residual.device, kernel="add_rmsnorm_fp8", unsupported=strided):
        from genscore_core.kernels import fused_ops_triton

        return fused_ops_triton.add_rmsnorm_fp8(residual, delta, weight, eps)
    return quantize_rows_e4m3(add_rmsnorm(residual, delta, weight, eps, torch.float32, impl="torch"))


def silu_mul_fp8(
    gate: torch.Tensor, up: torch.Tensor, *, impl: KernelImpl = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`silu_mul` quantised per row: (float8 e4m3 [M, N], float32 scale [M, 1])."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(f"silu_mul_fp8: gate {_dims(gate)} and up {_dims(up)} must be one [M, N] shape")
    if use_triton(impl, gate.device, kernel="silu_mul_fp8"):
        from genscore_core.kernels import fused_ops_triton

        return fused_ops_triton.silu_mul_fp8(gate, up)
    return quantize_rows_e4m3(F.silu(gate.float()) * up.float())
