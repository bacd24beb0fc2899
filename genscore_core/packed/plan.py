"""Packing prompt groups into token-budgeted batches with a shared-prefix KV layout (host side only).

A batch is one flat *stream* of tokens run through the decoder together, without padding. For every
group whose prefix is computed in the batch, the stream holds the prefix tokens once, followed by
the suffix tokens of its prompts. Attention works on *segments* (``attention.py``):

* a prefix segment: its tokens attend causally to themselves;
* a prompt segment: its suffix tokens attend to the group's prefix keys, read where they lie, then
  causally to their own. The prefix is neither recomputed nor copied per prompt.

A group too large for one batch has its prefix computed in the first batch it appears in; its KV is
kept (``save``) and loaded into a region after the stream's rows in later batches (``load``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from genscore_core.forward import PrefixGroup


def rung_segments(tokens: int) -> int:
    """Segment rows of a CUDA graph of ``tokens`` stream tokens (:mod:`genscore_core.packed.graphs`):
    room for prompts of 32 tokens on average, a multiple of 16, at least 64. Each spare segment
    launches attention blocks that find nothing to do: room for 8-token prompts (8,192 segments at
    64k tokens) made W1 16% slower on an H200 (docs/benchmarks.md, "CUDA-graph ladder"). The
    planner closes a batch when its segments fill a rung (:func:`plan_batches`)."""
    return max(64, math.ceil(tokens / 32 / 16) * 16)


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


def plan_batches(
    groups: Sequence[PrefixGroup],
    max_batch_tokens: int,
    *,
    ranges: Sequence[tuple[int, int, int]] | None = None,
    prefix_ready: Collection[int] = (),
    rungs: Sequence[int] = (),
) -> list[list[GroupSlice]]:
    """Split groups into batches of at most ``max_batch_tokens`` stream tokens, of balanced size.

    A prefix counts once, in the batch that computes it. A single prompt larger than the budget gets
    a batch of its own rather than an error. Batches are made about equal (total / number of batches)
    so that the last one is not a small, inefficient remainder. With ``rungs`` (the token sizes of
    the CUDA graphs, ascending), that size is raised to the smallest rung within the budget that
    holds it, and batches are filled up to it: all but the last then pad to that rung by less than
    one prompt.

    ``ranges`` limits the plan to the prompts ``[start, stop)`` of each listed ``(group, start, stop)``,
    in that order (the rest of a call, planned again after an out-of-memory error); groups in
    ``prefix_ready`` have their prefix computed already, so it costs nothing.
    """
    if max_batch_tokens <= 0:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    if ranges is None:
        ranges = [(g, 0, len(group.suffix_ids)) for g, group in enumerate(groups)]
    ready = set(prefix_ready)
    total = sum(
        (0 if g in ready else len(groups[g].prefix_ids))
        + sum(len(s) for s in groups[g].suffix_ids[start:stop])
        for g, start, stop in ranges
    )
    if total == 0:
        return []
    target = math.ceil(total / math.ceil(total / max_batch_tokens))
    limit, max_segments = max_batch_tokens, math.inf
    rung = next((r for r in rungs if target <= r <= max_batch_tokens), None)
    if rung is not None:
        # Two of a rung's segments are spare (its padding's, an empty one).
        target, limit, max_segments = rung, rung, rung_segments(rung) - 2

    batches: list[list[tuple[int, int, int]]] = []  # (group, start, stop)
    current: list[tuple[int, int, int]] = []
    used = segments = 0
    prefix_done: set[int] = set(ready)
    for g, start, stop in ranges:
        group = groups[g]
        for i in range(start, stop):
            suffix = group.suffix_ids[i]
            new_prefix = g not in prefix_done and len(group.prefix_ids) > 0
            cost = len(suffix) + (len(group.prefix_ids) if new_prefix else 0)
            if current and (used + cost > limit or segments + 1 + new_prefix > max_segments):
                batches.append(current)
                current, used, segments = [], 0, 0
            segments += 1 + new_prefix
            prefix_done.add(g)
            if current and current[-1][0] == g and current[-1][2] == i:
                current[-1] = (g, current[-1][1], i + 1)
            else:
                current.append((g, i, i + 1))
            used += cost
            if used >= target:
                batches.append(current)
                current, used, segments = [], 0, 0
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
                compute_prefix=first_batch[g] == b and g not in ready,
                save_prefix=first_batch[g] == b
                and g not in ready
                and last_batch[g] > b
                and len(groups[g].prefix_ids) > 0,
            )
            for g, start, stop in batch
        ]
        for b, batch in enumerate(batches)
    ]


@dataclass
class PackedBatch:
    """Everything one batch's forward needs, as host tensors and ints (moved to the device once).

    Key/value rows ``[0, T)`` hold the stream's own tokens (row ``t`` is stream token ``t``); rows
    ``[T, kv_len)`` hold prefixes loaded from earlier batches.
    """

    input_ids: torch.Tensor  # [T] int64, the stream
    positions: torch.Tensor  # [T] int64, position of each stream token in its own prompt
    segments: np.ndarray  # [S, 6] int64, see genscore_core.kernels.attention.SEGMENT_FIELDS
    kv_len: int
    segment_last: torch.Tensor  # [S] int64, stream index of the last token of each segment
    prompt_segments: torch.Tensor  # [N] int64, index (among segments) of each prompt's segment
    load: list[tuple[int, int]] = field(default_factory=list)
    """(group, first key/value row) of each prefix loaded from an earlier batch; its rows follow."""
    save: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(group, stream rows) of each prefix computed here that a later batch needs."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_segments.numel())


def build_batch(
    groups: Sequence[PrefixGroup] | Mapping[int, PrefixGroup], slices: Sequence[GroupSlice]
) -> PackedBatch:
    """Lay out one batch: stream tokens, their positions, and the attention segments.

    A computed prefix is a segment of its own; each prompt is a segment of its suffix tokens that
    also reads its group's prefix where it lies (in this batch's stream, or in the loaded region).
    Per-segment numbers are gathered in Python (a few hundred segments); per-token arrays are built
    with vectorised numpy, so a batch of 100k tokens takes a few milliseconds on the host.

    Token ids may be lists or ``int32`` numpy arrays (the streamed path's, :mod:`genscore_core.streaming`);
    the stream is their concatenation, one ``int32`` copy per prompt in C rather than a Python
    iteration over every token.
    """
    token_lists: list[list[int]] = []
    q_len: list[int] = []  # per segment
    first_position: list[int] = []
    prefix_len: list[int] = []
    prefix_group: list[int] = []  # whose prefix a segment reads (-1: none)
    prompt_segments: list[int] = []
    prefix_row: dict[int, int] = {}
    save: list[tuple[int, torch.Tensor]] = []
    stream = 0
    for part in slices:
        group = groups[part.group]
        plen = len(group.prefix_ids)
        if part.compute_prefix and plen:
            prefix_row[part.group] = stream
            token_lists.append(group.prefix_ids)
            q_len.append(plen)
            first_position.append(0)
            prefix_len.append(0)
            prefix_group.append(-1)
            if part.save_prefix:
                save.append((part.group, torch.arange(stream, stream + plen)))
            stream += plen
        for suffix in group.suffix_ids[part.start : part.stop]:
            if not len(suffix):
                raise ValueError("every prompt needs at least one token after the shared prefix")
            token_lists.append(suffix)
            prompt_segments.append(len(q_len))
            q_len.append(len(suffix))
            first_position.append(plen)
            prefix_len.append(plen)
            prefix_group.append(part.group if plen else -1)
            stream += len(suffix)
    load: list[tuple[int, int]] = []
    kv_len = stream
    for part in slices:
        plen = len(groups[part.group].prefix_ids)
        if not part.compute_prefix and plen and part.group not in prefix_row:
            prefix_row[part.group] = kv_len
            load.append((part.group, kv_len))
            kv_len += plen

    q = np.asarray(q_len, dtype=np.int64)
    q_start = np.cumsum(q) - q
    seg_of_token = np.repeat(np.arange(len(q_len)), q)
    within = np.arange(stream) - q_start[seg_of_token]
    positions = np.asarray(first_position, dtype=np.int64)[seg_of_token] + within
    prefix_start = np.asarray([prefix_row.get(g, 0) for g in prefix_group], dtype=np.int64)
    segments = np.stack(
        [q_start, q, q_start, q, prefix_start, np.asarray(prefix_len, dtype=np.int64)], axis=1
    )
    if all(isinstance(t, list) for t in token_lists):
        # Python lists (a whole call's prompts): one pass in C over all of them, straight to int64,
        # rather than an array per prompt and a concatenation (W4: 21 lists, ~0.2 ms less).
        input_ids = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=stream)
    else:
        input_ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
    return PackedBatch(
        # The decoder's index tensors are int64 and travel in one pinned copy (DeviceBatch).
        input_ids=torch.from_numpy(input_ids),
        positions=torch.from_numpy(positions),
        segments=segments.reshape(-1, 6),
        kv_len=kv_len,
        segment_last=torch.from_numpy(q_start + q - 1),
        prompt_segments=torch.tensor(prompt_segments, dtype=torch.int64),
        load=load,
        save=save,
    )
