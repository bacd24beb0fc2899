"""The small fused operations of the packed decoder, with a plain-torch version of each.

The residual stream stays in float32: norms and rotary embeddings are computed in float32 and only the
inputs of matrix products are cast to the model's dtype, so bf16 rounding does not pile up over the
layers. On CUDA (with Triton installed) each operation is one Triton kernel (``triton_ops.py``);
elsewhere, and as the reference in tests, the torch versions below compute the same function.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=1)
def _triton_ops() -> ModuleType | None:
    try:
        from genscore_core.packed import triton_ops
    except ImportError:
        return None
    return triton_ops


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernels run on this tensor's device."""
    return tensor.is_cuda and _triton_ops() is not None


def add_rmsnorm(
    residual: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype,
    *,
    triton: bool | None = None,
) -> torch.Tensor:
    """``residual += delta`` (in place), then ``RMSNorm(residual) * weight`` as ``out_dtype``.

    ``residual``: [T, H], float32 in the decoder; ``delta``: [T, H] in any float dtype, or None to only
    normalise. The arithmetic is float32 whatever the dtypes.
    """
    kernels = _triton_ops() if (residual.is_cuda if triton is None else triton) else None
    if kernels is not None:
        return kernels.add_rmsnorm(residual, delta, weight, eps, out_dtype)
    if residual.dtype == torch.float32:
        r = residual if delta is None else residual.add_(delta.float())
    else:  # a lower-precision residual (a benchmark step): add in float32, store rounded
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
    triton: bool | None = None,
) -> None:
    """Per-head RMSNorm (when ``norm_weight`` is given, as Qwen3's q/k norms) and rotary embedding.

    ``x``: [T, heads, D] (or [T, heads * D]) projections; ``cos``/``sin``: [max position, D] float32
    tables; ``positions``: [T]. Writes [T, heads, D] to ``out``, which may be ``x`` itself.
    """
    head_dim = out.shape[-1]
    on_triton = (x.is_cuda if triton is None else triton) and head_dim & (head_dim - 1) == 0
    kernels = _triton_ops() if on_triton else None
    if kernels is not None:
        kernels.rope(x, num_heads, norm_weight, eps, cos, sin, positions, out)
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


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, triton: bool | None = None) -> torch.Tensor:
    """``silu(gate) * up`` computed in float32, returned in ``gate``'s dtype."""
    kernels = _triton_ops() if (gate.is_cuda if triton is None else triton) else None
    if kernels is not None:
        return kernels.silu_mul(gate, up)
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)
