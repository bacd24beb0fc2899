"""The gated MLP's first half, ``silu(x @ Wg^T + bg) * (x @ Wu^T + bu)``, with a plain-torch version.

The torch version is two matrix products and the product of their float32 silu and up, rounded once to
``x``'s dtype. The Triton kernel (``gated_mlp_triton.py``) computes both products of a tile in one
program and applies silu*mul to its float32 accumulators before the one store, so the two [T, N]
products are never written or read back; ``impl`` picks one
(:mod:`genscore_core.kernels.dispatch`). Both read the model's ``nn.Linear`` weights in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genscore_core.kernels.dispatch import KernelImpl, use_triton

Linear = tuple[torch.Tensor, torch.Tensor | None]
"""An ``nn.Linear``'s (weight [N, K], bias [N] or None)."""


def unsupported_reason(x: torch.Tensor, gate: Linear, up: Linear) -> str | None:
    """Why the Triton kernel cannot take these inputs (None when it can). ``x`` may be on "meta"."""
    (wg, bg), (wu, bu) = gate, up
    if x.dim() != 2:
        return f"x must be [tokens, hidden], got {tuple(x.shape)}"
    if wg.shape != wu.shape or wg.dim() != 2 or wg.shape[1] != x.shape[1]:
        return f"gate {tuple(wg.shape)} and up {tuple(wu.shape)} weights must both be [N, {x.shape[1]}]"
    if len({x.dtype, wg.dtype, wu.dtype}) != 1:
        return f"x ({x.dtype}) and the weights ({wg.dtype}, {wu.dtype}) must share a dtype"
    if wg.stride(1) != 1 or wu.stride(1) != 1:
        return "the weights' rows must be contiguous"
    for name, bias in (("gate", bg), ("up", bu)):
        if bias is not None and (bias.shape != (wg.shape[0],) or bias.stride(0) != 1):
            return f"the {name} bias must be a contiguous [{wg.shape[0]}] vector"
    return None


def gated_mlp(x: torch.Tensor, gate: Linear, up: Linear, *, impl: KernelImpl = "auto") -> torch.Tensor:
    """``silu(x @ Wg^T + bg) * (x @ Wu^T + bu)`` [T, N] in ``x``'s dtype, silu*mul in float32 (or
    float64 for float64 inputs).

    ``x``: [T, K] (rows may have a stride); ``gate``, ``up``: (weight [N, K], bias [N] or None).
    """
    if use_triton(impl, x.device, kernel="gated_mlp", unsupported=unsupported_reason(x, gate, up)):
        from genscore_core.kernels import gated_mlp_triton

        if x.stride(1) != 1:
            x = x.contiguous()
        return gated_mlp_triton.gated_mlp(x, gate[0], gate[1], up[0], up[1])
    wide = torch.promote_types(x.dtype, torch.float32)  # float64 stays float64
    return (F.silu(F.linear(x, *gate).to(wide)) * F.linear(x, *up).to(wide)).to(x.dtype)
