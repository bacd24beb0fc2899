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
``scaled_dot_product_attention`` per block of queries with an explicit mask, in bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from genscore_core.kernels.dispatch import KernelImpl, use_triton

SEGMENT_FIELDS = ("q_start", "q_len", "k_start", "k_len", "prefix_start", "prefix_len")
"""The columns of a segment table."""


@dataclass(frozen=True)
class AttentionTiling:
    """Tile sizes and launch settings of the Triton kernel (H200; docs/benchmarks.md, "Attention kernel")."""

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


DEFAULT_TILING = AttentionTiling(block_m=32, block_n=32, heads=2, num_warps=4, num_stages=3, tma=True)
LAST_TOKEN_TILING = AttentionTiling(block_m=16, block_n=32, heads=2, num_warps=4, num_stages=3, tma=True)
"""For the last layer, where each segment has a single query."""


@dataclass(frozen=True)
class Segments:
    """A segment table on the host and on the device, with the kernel's work list.

    ``blocks`` lists (segment, first query) for every ``tiling.block_m`` queries (see
    :func:`plan_blocks` for the order).
    """

    host: np.ndarray  # [S, 6] int64, columns SEGMENT_FIELDS
    table: torch.Tensor  # [S, 6] int64 on the device
    blocks: torch.Tensor  # [NB, 2] int64 on the device
    tiling: AttentionTiling

    @property
    def num_blocks(self) -> int:
        return int(self.blocks.shape[0])

    @classmethod
    def build(
        cls,
        host: np.ndarray,
        device: torch.device,
        tiling: AttentionTiling = DEFAULT_TILING,
    ) -> Segments:
        """Plan the blocks (see :func:`plan_blocks`) and copy the table and blocks to ``device``."""
        host = check_table(host)
        blocks = plan_blocks(host, tiling)
        flat = torch.from_numpy(np.concatenate([host.reshape(-1), blocks.reshape(-1)]))
        if device.type == "cuda":
            flat = flat.pin_memory().to(device, non_blocking=True)
        table, block_list = flat.split([host.size, blocks.size])
        return cls(host=host, table=table.view(-1, 6), blocks=block_list.view(-1, 2), tiling=tiling)


def check_table(host: np.ndarray) -> np.ndarray:
    """``host`` as an [S, 6] int64 array; raises ValueError for a negative entry or a segment with
    more queries than keys."""
    host = np.asarray(host, dtype=np.int64).reshape(-1, len(SEGMENT_FIELDS))
    if (host < 0).any():
        # Python slicing would wrap a negative start around; the kernel would read before the tensor.
        bad, field = (int(i) for i in np.argwhere(host < 0)[0])
        raise ValueError(f"segment {bad} has a negative {SEGMENT_FIELDS[field]} ({host[bad, field]})")
    q_len, k_len = host[:, 1], host[:, 3]
    if (q_len > k_len).any():
        bad = int(np.argmax(q_len > k_len))
        raise ValueError(f"segment {bad} has {q_len[bad]} queries but only {k_len[bad]} own keys")
    return host


def plan_blocks(host: np.ndarray, tiling: AttentionTiling) -> np.ndarray:
    """[NB, 2] int64: (segment, first query) of each block of ``tiling.block_m`` queries.

    Longest work first, so that no long block starts last, with the blocks of one segment together,
    so that they run at the same time and read the segment's keys from L2 rather than each from
    memory (blocks ordered by their own work alone ran 5% slower on W1: docs/benchmarks.md,
    "Attention kernel").
    """
    q_len, k_len, prefix_len = host[:, 1], host[:, 3], host[:, 5]
    per_segment = -(-q_len // tiling.block_m)
    segment = np.repeat(np.arange(len(host)), per_segment)
    first = (
        np.arange(len(segment)) - np.repeat(np.cumsum(per_segment) - per_segment, per_segment)
    ) * tiling.block_m
    # Keys each block reads.
    work = prefix_len[segment] + (k_len - q_len)[segment] + np.minimum(first + tiling.block_m, q_len[segment])
    segment_work = np.bincount(segment, weights=work, minlength=len(host))
    rank = np.empty(len(host), dtype=np.int64)
    rank[np.argsort(-segment_work, kind="stable")] = np.arange(len(host))
    order = np.lexsort((-work, rank[segment]))
    return np.stack([segment[order], first[order]], axis=1).astype(np.int64)


def unsupported_reason(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot take these query/key tensors (None when it can)."""
    dim = q.shape[-1]
    if dim < 16 or dim & (dim - 1):
        return f"head dimension {dim} is not a power of two of at least 16"
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads do not divide into {k.shape[1]} key/value heads"
    return None


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Segments,
    scale: float,
    *,
    impl: KernelImpl = "auto",
) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D] (contiguous): each segment's causal attention over
    its prefix and its own keys. Rows of ``q``, ``k`` and ``v`` may have a stride (column blocks of one
    q/k/v product). Rows of ``q`` outside every segment come back unspecified.

    ``impl`` picks the Triton kernel or the torch reference (:mod:`genscore_core.kernels.dispatch`).
    """
    if use_triton(impl, q.device, kernel="segment_attention", unsupported=unsupported_reason(q, k)):
        from genscore_core.kernels import attention_triton

        return attention_triton.segment_attention(q, k, v, segments, scale)
    return segment_attention_reference(q, k, v, segments.host, scale)


MASK_BLOCK_ELEMENTS = 1 << 21
"""Most mask elements the reference holds at once (8 MiB in float32), whatever the prompt length."""


def segment_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: np.ndarray,
    scale: float,
    *,
    block_elements: int = MASK_BLOCK_ELEMENTS,
) -> torch.Tensor:
    """SDPA per segment on ``[prefix keys ; own keys]`` with a bottom-right causal mask, in bounded memory.

    Memory does not grow with the square of the prompt length. A segment without a prefix whose
    queries are its keys is SDPA's own causal case, and a single query needs no mask; any other
    segment runs in blocks of about ``block_elements / keys`` queries, each with its slice of the
    mask, reading only the keys its last query sees. Inputs are 4-D with grouped heads left to SDPA
    (``enable_gqa``): that is what sends the CPU to its fused kernel, which tiles the scores, rather
    than to the reference path that holds them all.
    """
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)  # contiguous, whatever q's strides
    for q_start, q_len, k_start, k_len, prefix_start, prefix_len in table.tolist():
        if q_len == 0:
            continue
        own_k, own_v = k[k_start : k_start + k_len], v[k_start : k_start + k_len]
        if prefix_len:
            keys = torch.cat([k[prefix_start : prefix_start + prefix_len], own_k])
            values = torch.cat([v[prefix_start : prefix_start + prefix_len], own_v])
        else:
            keys, values = own_k, own_v
        keys = keys.transpose(0, 1).unsqueeze(0)  # [1, Hkv, m, D]
        values = values.transpose(0, 1).unsqueeze(0)
        queries = q[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        if q_len == 1 or keys.shape[2] == q_len:  # no mask, or SDPA's own (top-left) causal one
            o = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=q_len > 1, scale=scale, enable_gqa=True
            )
            out[q_start : q_start + q_len] = o[0].transpose(0, 1)
            continue
        # Query j (0-based within the segment) sees keys [0, first_hidden + j).
        first_hidden = prefix_len + k_len - q_len + 1
        rows = max(1, min(q_len, block_elements // keys.shape[2]))
        for j0 in range(0, q_len, rows):
            n = min(rows, q_len - j0)
            m = first_hidden + j0 + n - 1  # keys the block's last query sees
            # -inf above the diagonal (an additive mask is the CPU fast path).
            mask = torch.full((n, m), float("-inf"), dtype=q.dtype, device=q.device).triu_(m - n + 1)
            o = F.scaled_dot_product_attention(
                queries[:, :, j0 : j0 + n], keys[:, :, :m], values[:, :, :m], attn_mask=mask, scale=scale,
                enable_gqa=True,
            )  # fmt: skip
            out[q_start + j0 : q_start + j0 + n] = o[0].transpose(0, 1)
    return out
