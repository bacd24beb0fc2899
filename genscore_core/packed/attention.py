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


def square_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq: torch.Tensor,
    max_len: int,
    scale: float,
    *,
    host_cu_seq: list[int] | None = None,
) -> torch.Tensor:
    """Causal attention over square segments (queries laid out like the keys): [Tk, Hq, D] out.

    On CUDA this is cuDNN's ragged fused attention (faster than FlashAttention 2 on Hopper; see
    docs/benchmarks.md), used when :func:`cudnn_ragged_ok` says it runs and matches here.
    """
    if q.is_cuda and cudnn_ragged_ok(q.device, q.dtype, q.shape[1], k.shape[1], q.shape[2]):
        if _CUDNN_EXPAND_KV.get((q.device, q.dtype, q.shape[1], k.shape[1], q.shape[2]), False):
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return _cudnn_ragged(q, k, v, cu_seq, max_len, scale)
    cu = host_cu_seq if host_cu_seq is not None else cu_seq.tolist()
    return segment_attention(q, k, v, cu, cu, scale)


def _cudnn_ragged(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    out = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu_seq, cu_seq, max_len, max_len, False, 0.0, True, False, scale=scale
    )[0]
    return out  # type: ignore[no-any-return]


_CUDNN_OK: dict[tuple[Any, ...], bool] = {}
_CUDNN_EXPAND_KV: dict[tuple[Any, ...], bool] = {}


def cudnn_ragged_ok(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> bool:
    """Whether cuDNN's ragged attention runs here and matches the reference (checked once per shape).

    Tries grouped K/V heads first, then K/V expanded to the query heads.
    """
    key = (device, dtype, heads, kv_heads, dim)
    if key in _CUDNN_OK:
        return _CUDNN_OK[key]
    ok = False
    if (
        device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and hasattr(torch.ops.aten, "_cudnn_attention_forward")
    ):
        generator = torch.Generator(device=device).manual_seed(0)
        lengths = [37, 129, 5, 64, 1, 200]
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        q = torch.randn(cu[-1], heads, dim, device=device, dtype=dtype, generator=generator)
        k = torch.randn(cu[-1], kv_heads, dim, device=device, dtype=dtype, generator=generator)
        v = torch.randn(cu[-1], kv_heads, dim, device=device, dtype=dtype, generator=generator)
        expected = segment_attention(q, k, v, cu, cu, dim**-0.5).float()
        cu_seq = torch.tensor(cu, dtype=torch.int32, device=device)
        for expand in [False, True] if kv_heads != heads else [False]:
            try:
                kk = k.repeat_interleave(heads // kv_heads, dim=1) if expand else k
                vv = v.repeat_interleave(heads // kv_heads, dim=1) if expand else v
                got = _cudnn_ragged(q, kk, vv, cu_seq, max(lengths), dim**-0.5).float()
                if bool(((got - expected).abs().max() < 3e-2).item()):
                    ok = True
                    _CUDNN_EXPAND_KV[key] = expand
                    break
            except RuntimeError:
                continue
    _CUDNN_OK[key] = ok
    return ok
