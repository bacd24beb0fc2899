"""Causal attention over packed segments whose shared prefix is read in place.

A *segment* is a run of queries ``q[q_start : q_start + q_len]`` with two key/value ranges:

* its group's shared prefix ``k[prefix_start : prefix_start + prefix_len]``, visible to every query;
* its own keys ``k[k_start : k_start + k_len]`` (``k_len >= q_len``), aligned to the bottom right:
  query ``j`` sees own keys ``0 .. k_len - q_len + j``, so the last query sees all of them.

In most layers a segment's queries are its own tokens (``k_len == q_len``: plain causal attention after
the prefix). In the last layer only each segment's final token is a query (``q_len == 1``). Because the
prefix is addressed where it was computed, the key/value buffer holds each prefix once, however many
prompts share it.

On CUDA this is one Triton kernel (``attention_triton.py``); elsewhere, and as the reference in tests,
one ``scaled_dot_product_attention`` call per segment with an explicit mask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

AttentionImpl = Literal["auto", "triton", "torch"]

SEGMENT_FIELDS = ("q_start", "q_len", "k_start", "k_len", "prefix_start", "prefix_len")
"""The columns of a segment table."""


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch settings of the Triton kernel (tuned on an H200; see docs/benchmarks.md)."""

    block_m: int = 64
    """Queries per program (a power of two, at least 16)."""
    block_n: int = 64
    """Keys per inner-loop tile (a power of two, at least 16)."""
    heads: int = 2
    """Query heads per program, sharing one key/value head; capped by the model's group size."""
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False
    """Load K/V tiles through TMA descriptors where the GPU has them (compute capability 9 and later;
    the CPU interpreter emulates them); elsewhere the kernel loads through pointers."""

    def heads_per_program(self, group: int) -> int:
        """The largest power of two that is at most ``heads`` and divides ``group``."""
        n = 1
        while n * 2 <= self.heads and group % (n * 2) == 0:
            n *= 2
        return n


DEFAULT_CONFIG = KernelConfig(block_m=64, block_n=32, heads=2, num_warps=8, num_stages=3, tma=True)
LAST_TOKEN_CONFIG = KernelConfig(block_m=16, block_n=64, heads=2, num_warps=4, num_stages=2, tma=True)
"""For the last layer, where each segment has a single query."""


@dataclass(frozen=True)
class Segments:
    """A segment table on the host and on the device, with the kernel's work list.

    ``blocks`` lists (segment, first query) for every ``config.block_m`` queries (see
    :func:`plan_blocks` for the order).
    """

    host: np.ndarray  # [S, 6] int64, columns SEGMENT_FIELDS
    table: torch.Tensor  # [S, 6] int64 on the device
    blocks: torch.Tensor  # [NB, 2] int64 on the device
    config: KernelConfig

    @property
    def num_blocks(self) -> int:
        return int(self.blocks.shape[0])

    @classmethod
    def build(
        cls,
        host: np.ndarray,
        device: torch.device,
        config: KernelConfig = DEFAULT_CONFIG,
        *,
        by_segment: bool = True,
    ) -> Segments:
        """Plan the blocks (see :func:`plan_blocks`) and copy the table and blocks to ``device``."""
        host = check_table(host)
        blocks = plan_blocks(host, config, by_segment=by_segment)
        flat = torch.from_numpy(np.concatenate([host.reshape(-1), blocks.reshape(-1)]))
        if device.type == "cuda":
            flat = flat.pin_memory().to(device, non_blocking=True)
        table, block_list = flat.split([host.size, blocks.size])
        return cls(host=host, table=table.view(-1, 6), blocks=block_list.view(-1, 2), config=config)


def check_table(host: np.ndarray) -> np.ndarray:
    """``host`` as an [S, 6] int64 array; raises ValueError for a segment with more queries than keys."""
    host = np.asarray(host, dtype=np.int64).reshape(-1, len(SEGMENT_FIELDS))
    q_len, k_len = host[:, 1], host[:, 3]
    if (q_len > k_len).any():
        bad = int(np.argmax(q_len > k_len))
        raise ValueError(f"segment {bad} has {q_len[bad]} queries but only {k_len[bad]} own keys")
    return host


def plan_blocks(host: np.ndarray, config: KernelConfig, *, by_segment: bool = True) -> np.ndarray:
    """[NB, 2] int64: (segment, first query) of each block of ``config.block_m`` queries.

    Longest work first, so that no long block starts last. ``by_segment`` (the default) keeps the
    blocks of one segment together, so they run at the same time and read the segment's keys from
    L2 rather than each from memory; otherwise blocks are ordered by their own work alone.
    """
    q_len, k_len, prefix_len = host[:, 1], host[:, 3], host[:, 5]
    per_segment = -(-q_len // config.block_m)
    segment = np.repeat(np.arange(len(host)), per_segment)
    first = (
        np.arange(len(segment)) - np.repeat(np.cumsum(per_segment) - per_segment, per_segment)
    ) * config.block_m
    # Keys each block reads.
    work = prefix_len[segment] + (k_len - q_len)[segment] + np.minimum(first + config.block_m, q_len[segment])
    if by_segment:
        segment_work = np.bincount(segment, weights=work, minlength=len(host))
        rank = np.empty(len(host), dtype=np.int64)
        rank[np.argsort(-segment_work, kind="stable")] = np.arange(len(host))
        order = np.lexsort((-work, rank[segment]))
    else:
        order = np.argsort(-work, kind="stable")
    return np.stack([segment[order], first[order]], axis=1).astype(np.int64)


@functools.lru_cache(maxsize=1)
def _triton_attention() -> ModuleType | None:
    try:
        from genscore_core.packed import attention_triton
    except ImportError:
        return None
    return attention_triton


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Segments,
    scale: float,
    *,
    impl: AttentionImpl = "auto",
) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D]: each segment's causal attention over its prefix
    and its own keys. Rows of ``q`` outside every segment come back unspecified.

    ``impl``: "triton" (CUDA, or the CPU under ``TRITON_INTERPRET=1``), "torch" (the reference), or
    "auto": Triton on CUDA when it is installed, else torch.
    """
    if impl == "triton" or (impl == "auto" and q.is_cuda):
        kernels = _triton_attention()
        if kernels is not None:
            return kernels.segment_attention(q, k, v, segments, scale)  # type: ignore[no-any-return]
        if impl == "triton":
            raise RuntimeError("impl='triton' needs the triton package")
    return segment_attention_reference(q, k, v, segments.host, scale)


def segment_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: np.ndarray,
    scale: float,
) -> torch.Tensor:
    """One SDPA call per segment on ``[prefix keys ; own keys]`` with a bottom-right causal mask."""
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[1]
    for q_start, q_len, k_start, k_len, prefix_start, prefix_len in table.tolist():
        if q_len == 0:
            continue
        rows = slice(prefix_start, prefix_start + prefix_len)
        own = slice(k_start, k_start + k_len)
        ks = torch.cat([k[rows], k[own]]).transpose(0, 1)  # [Hkv, m, D]
        vs = torch.cat([v[rows], v[own]]).transpose(0, 1)
        if groups > 1:
            ks = ks.repeat_interleave(groups, dim=0)
            vs = vs.repeat_interleave(groups, dim=0)
        qs = q[q_start : q_start + q_len].transpose(0, 1)  # [Hq, n, D]
        n, m = q_len, prefix_len + k_len
        mask = None
        if n > 1:  # -inf above the bottom-right-aligned diagonal (an additive mask is the CPU fast path)
            mask = torch.full((n, m), float("-inf"), dtype=q.dtype, device=q.device).triu_(m - n + 1)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        out[q_start : q_start + q_len] = o.transpose(0, 1)
    return out
