"""Packing prompt groups into token-budgeted batches with a shared-prefix KV layout (host side only).

A batch is one flat *stream* of tokens run through the decoder together, without padding. For every
group whose prefix is computed in the batch, the stream holds the prefix tokens once, followed by
the suffix tokens of its prompts. Attention works on *segments*: a query segment (stream tokens) and
a key/value segment (slots of a packed KV buffer), matched causally from the bottom right:

* a prefix segment: its tokens attend to themselves (``q_len == k_len``);
* a prompt segment: its suffix tokens attend to ``[prefix KV ; own KV]``, so the prefix slots of each
  prompt are filled by copying the group's prefix KV (``rep_src -> rep_dst``), never recomputed.

A group too large for one batch has its prefix computed in the first batch it appears in; its KV is
kept (``save``) and loaded into a region at the end of later batches' KV buffers (``load``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from genscore_core.forward import PrefixGroup


@dataclass(frozen=True)
class GroupSlice:
    """The prompts ``[start, stop)`` of group ``group`` that one batch computes."""

    group: int
    start: int
    stop: int
    compute_prefix: bool
    """The prefix is computed in this batch (its first one)."""
    save_prefix: bool
    """The group goes on in a later batch, which will need this prefix KV."""


def plan_batches(groups: Sequence[PrefixGroup], max_batch_tokens: int) -> list[list[GroupSlice]]:
    """Split groups into batches of at most ``max_batch_tokens`` stream tokens, of balanced size.

    A prefix counts once, in the batch that computes it. A single prompt larger than the budget gets
    a batch of its own rather than an error. Batches are made about equal (total / number of batches)
    so that the last one is not a small, inefficient remainder.
    """
    if max_batch_tokens <= 0:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    total = sum(len(g.prefix_ids) + sum(len(s) for s in g.suffix_ids) for g in groups)
    if total == 0:
        return []
    target = math.ceil(total / math.ceil(total / max_batch_tokens))

    batches: list[list[tuple[int, int, int]]] = []  # (group, start, stop)
    current: list[tuple[int, int, int]] = []
    used = 0
    prefix_done: set[int] = set()
    for g, group in enumerate(groups):
        for i, suffix in enumerate(group.suffix_ids):
            cost = len(suffix) + (0 if g in prefix_done else len(group.prefix_ids))
            if current and used + cost > max_batch_tokens:
                batches.append(current)
                current, used = [], 0
            prefix_done.add(g)
            if current and current[-1][0] == g and current[-1][2] == i:
                current[-1] = (g, current[-1][1], i + 1)
            else:
                current.append((g, i, i + 1))
            used += cost
            if used >= target:
                batches.append(current)
                current, used = [], 0
    if current:
        batches.append(current)

    last_batch = {g: b for b, batch in enumerate(batches) for g, _, _ in batch}
    first_batch: dict[int, int] = {}
    for b, batch in enumerate(batches):
        for g, _, _ in batch:
            first_batch.setdefault(g, b)
    return [
        [
            GroupSlice(
                group=g,
                start=start,
                stop=stop,
                compute_prefix=first_batch[g] == b,
                save_prefix=first_batch[g] == b and last_batch[g] > b and len(groups[g].prefix_ids) > 0,
            )
            for g, start, stop in batch
        ]
        for b, batch in enumerate(batches)
    ]


@dataclass
class PackedBatch:
    """Everything one batch's forward needs, as host tensors and ints (moved to the device once)."""

    input_ids: torch.Tensor  # [T] int64, the stream
    positions: torch.Tensor  # [T] int64, position of each stream token in its own prompt
    kv_slot: torch.Tensor  # [T] int64, KV-buffer slot of each stream token
    rep_dst: torch.Tensor  # [R] int64, prefix slots of prompt segments...
    rep_src: torch.Tensor  # [R] int64, ...filled from these slots (a computed prefix or a loaded one)
    cu_seq_q: torch.Tensor  # [S + 1] int32, query segments over the stream
    cu_seq_k: torch.Tensor  # [S + 1] int32, key/value segments over the KV buffer
    max_q: int
    max_k: int
    kv_len: int
    """Slots in the KV buffer: every segment, then the region for loaded prefixes."""
    segment_last: torch.Tensor  # [S] int64, stream index of the last token of each segment
    prompt_segments: torch.Tensor  # [N] int64, index (among segments) of each prompt's segment
    load: list[tuple[int, int]] = field(default_factory=list)
    """(group, first slot) of each prefix loaded from an earlier batch; its slots follow contiguously."""
    save: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(group, slots) of each prefix computed here that a later batch needs."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_segments.numel())

    def last_index(self) -> torch.Tensor:
        """Stream index of each prompt's last token: [N]."""
        return self.segment_last[self.prompt_segments]


def build_batch(groups: Sequence[PrefixGroup], slices: Sequence[GroupSlice]) -> PackedBatch:
    """Lay out one batch: stream tokens, their positions and KV slots, segments, prefix copies.

    Per-segment numbers are gathered in Python (a few hundred segments); every per-token array is then
    built with vectorised numpy, so a batch of 100k tokens takes a few milliseconds on the host.
    """
    token_lists: list[list[int]] = []
    q_len: list[int] = []  # per segment
    k_len: list[int] = []
    rep_len: list[int] = []  # prefix slots filled by copying (prompt segments of groups with a prefix)
    rep_group: list[int] = []  # whose prefix they copy
    prompt_segments: list[int] = []
    prefix_slot: dict[int, int] = {}
    save: list[tuple[int, torch.Tensor]] = []
    slot = 0
    for part in slices:
        group = groups[part.group]
        plen = len(group.prefix_ids)
        if part.compute_prefix and plen:
            prefix_slot[part.group] = slot
            token_lists.append(group.prefix_ids)
            q_len.append(plen)
            k_len.append(plen)
            rep_len.append(0)
            rep_group.append(part.group)
            if part.save_prefix:
                save.append((part.group, torch.arange(slot, slot + plen)))
            slot += plen
        for suffix in group.suffix_ids[part.start : part.stop]:
            if not suffix:
                raise ValueError("every prompt needs at least one token after the shared prefix")
            token_lists.append(suffix)
            prompt_segments.append(len(q_len))
            q_len.append(len(suffix))
            k_len.append(plen + len(suffix))
            rep_len.append(plen)
            rep_group.append(part.group)
            slot += plen + len(suffix)
    load: list[tuple[int, int]] = []
    for part in slices:
        plen = len(groups[part.group].prefix_ids)
        if not part.compute_prefix and plen and part.group not in prefix_slot:
            prefix_slot[part.group] = slot
            load.append((part.group, slot))
            slot += plen

    q = np.asarray(q_len, dtype=np.int64)
    k = np.asarray(k_len, dtype=np.int64)
    reps = np.asarray(rep_len, dtype=np.int64)
    kv_base = np.cumsum(k) - k  # first KV slot of each segment
    q_base = np.cumsum(q) - q
    segments = np.arange(len(q_len))
    total = int(q.sum())
    seg_of_token = np.repeat(segments, q)
    within = np.arange(total) - q_base[seg_of_token]
    offset = (k - q)[seg_of_token]  # the prefix before a prompt's own tokens
    positions = offset + within
    kv_slot = kv_base[seg_of_token] + offset + within
    seg_of_rep = np.repeat(segments, reps)
    within_rep = np.arange(int(reps.sum())) - (np.cumsum(reps) - reps)[seg_of_rep]
    src_base = np.asarray([prefix_slot.get(g, 0) for g in rep_group], dtype=np.int64)
    rep_dst = kv_base[seg_of_rep] + within_rep
    rep_src = src_base[seg_of_rep] + within_rep
    input_ids = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=total)

    def cumulative(lengths: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        positions=torch.from_numpy(positions),
        kv_slot=torch.from_numpy(kv_slot),
        rep_dst=torch.from_numpy(rep_dst),
        rep_src=torch.from_numpy(rep_src),
        cu_seq_q=cumulative(q),
        cu_seq_k=cumulative(k),
        max_q=int(q.max()),
        max_k=int(k.max()),
        kv_len=slot,
        segment_last=torch.from_numpy(q_base + q - 1),
        prompt_segments=torch.tensor(prompt_segments, dtype=torch.int64),
        load=load,
        save=save,
    )
