"""Causal attention over packed variable-length segments, bottom-right aligned.

Segment ``i`` has queries ``q[cu_seq_q[i]:cu_seq_q[i+1]]`` and keys/values
``k[cu_seq_k[i]:cu_seq_k[i+1]]``; with ``n`` queries and ``m >= n`` keys, query ``j`` sees keys
``0 .. m - n + j``: the last query sees every key. That is how a prompt's suffix tokens see their
group's shared prefix (the first ``m - n`` keys) and causally their own tokens.

On CUDA in fp16/bf16 this is FlashAttention's variable-length kernel (``varlen_attn`` where torch has
it with sliding-window and GQA arguments, else the ATen op it wraps); FlashAttention aligns a causal
mask bottom-right when ``q_len != k_len``. Elsewhere, one ``scaled_dot_product_attention`` per segment
with an explicit mask: slow but exact, used on the CPU and in tests.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=1)
def _varlen_fn() -> Callable[..., Any] | None:
    """``torch.nn.attention.varlen.varlen_attn`` if it takes ``window_size`` and ``enable_gqa``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    if "window_size" in parameters and "enable_gqa" in parameters:
        return varlen_attn  # type: ignore[no-any-return]
    return None


def flash_available(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float,
    *,
    host_cu_seq: tuple[list[int], list[int]] | None = None,
    force_fallback: bool = False,
) -> torch.Tensor:
    """Bottom-right causal attention per segment: q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D].

    ``cu_seq_q``/``cu_seq_k``: int32 [S + 1] on q's device. ``host_cu_seq``: the same offsets as
    Python lists, which the per-segment fallback needs (it avoids a device sync to read them).
    """
    if flash_available(q) and not force_fallback:
        fn = _varlen_fn()
        if fn is not None:
            out = fn(
                q, k, v, cu_seq_q, cu_seq_k, max_q, max_k,
                scale=scale, window_size=(-1, 0), enable_gqa=True,
            )  # fmt: skip
        else:
            out = torch.ops.aten._flash_attention_forward(
                q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, 0.0, True, False, scale=scale
            )[0]
        return out  # type: ignore[no-any-return]
    if host_cu_seq is None:
        host_cu_seq = (cu_seq_q.tolist(), cu_seq_k.tolist())
    return segment_attention(q, k, v, host_cu_seq[0], host_cu_seq[1], scale)


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq_q: list[int],
    cu_seq_k: list[int],
    scale: float,
) -> torch.Tensor:
    """The reference: one SDPA call per segment with an explicit bottom-right causal mask."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for i in range(len(cu_seq_q) - 1):
        q0, q1, k0, k1 = cu_seq_q[i], cu_seq_q[i + 1], cu_seq_k[i], cu_seq_k[i + 1]
        n, m = q1 - q0, k1 - k0
        if n == 0:
            continue
        if n > m:
            raise ValueError(f"segment {i} has {n} queries but only {m} keys")
        qs = q[q0:q1].transpose(0, 1)  # [Hq, n, D]
        ks = k[k0:k1].transpose(0, 1)
        vs = v[k0:k1].transpose(0, 1)
        if groups > 1:
            ks = ks.repeat_interleave(groups, dim=0)
            vs = vs.repeat_interleave(groups, dim=0)
        mask = None
        if n > 1:  # -inf above the bottom-right-aligned diagonal (an additive mask is the CPU fast path)
            mask = torch.full((n, m), float("-inf"), dtype=q.dtype, device=q.device).triu_(m - n + 1)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        out[q0:q1] = o.transpose(0, 1)
    return out
