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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def _arange(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def build_batch(groups: Sequence[PrefixGroup], slices: Sequence[GroupSlice]) -> PackedBatch:
    """Lay out one batch: stream tokens, their positions and KV slots, segments, prefix copies."""
    ids: list[int] = []
    positions: list[int] = []
    kv_slot: list[int] = []
    rep_dst: list[int] = []
    rep_src_of: list[tuple[int, int]] = []  # (group, offset in its prefix), resolved below
    q_lens: list[int] = []
    k_lens: list[int] = []
    segment_last: list[int] = []
    prompt_segments: list[int] = []
    prefix_slot: dict[int, int] = {}
    save: list[tuple[int, torch.Tensor]] = []
    slot = 0
    for part in slices:
        group = groups[part.group]
        plen = len(group.prefix_ids)
        if part.compute_prefix and plen:
            prefix_slot[part.group] = slot
            ids += group.prefix_ids
            positions += _arange(0, plen)
            kv_slot += _arange(slot, plen)
            q_lens.append(plen)
            k_lens.append(plen)
            segment_last.append(len(ids) - 1)
            if part.save_prefix:
                save.append((part.group, torch.arange(slot, slot + plen)))
            slot += plen
        for suffix in group.suffix_ids[part.start : part.stop]:
            n = len(suffix)
            if n == 0:
                raise ValueError("every prompt needs at least one token after the shared prefix")
            rep_dst += _arange(slot, plen)
            rep_src_of += [(part.group, j) for j in range(plen)]
            ids += suffix
            positions += _arange(plen, n)
            kv_slot += _arange(slot + plen, n)
            prompt_segments.append(len(q_lens))
            q_lens.append(n)
            k_lens.append(plen + n)
            segment_last.append(len(ids) - 1)
            slot += plen + n
    load: list[tuple[int, int]] = []
    for part in slices:
        plen = len(groups[part.group].prefix_ids)
        if not part.compute_prefix and plen and part.group not in prefix_slot:
            prefix_slot[part.group] = slot
            load.append((part.group, slot))
            slot += plen
    rep_src = [prefix_slot[g] + j for g, j in rep_src_of]

    def cumulative(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)

    return PackedBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        kv_slot=torch.tensor(kv_slot, dtype=torch.int64),
        rep_dst=torch.tensor(rep_dst, dtype=torch.int64),
        rep_src=torch.tensor(rep_src, dtype=torch.int64),
        cu_seq_q=cumulative(q_lens),
        cu_seq_k=cumulative(k_lens),
        max_q=max(q_lens),
        max_k=max(k_lens),
        kv_len=slot,
        segment_last=torch.tensor(segment_last, dtype=torch.int64),
        prompt_segments=torch.tensor(prompt_segments, dtype=torch.int64),
        load=load,
        save=save,
    )
