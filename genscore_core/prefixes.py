"""Prefix grouping of token-id prompts: what a job's prompts share, and which of them repeat.

Pure Python, no torch: the local engine groups a job's prompts to compute their shared prefix once,
and the HTTP clients of :mod:`genscore_core.remote` group them to send a server one prefix and
its suffixes, without loading the model's stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixGroup:
    """Prompts that start with the same tokens: the shared prefix, then each prompt's own rest."""

    prefix_ids: list[int]
    suffix_ids: list[list[int]]
    """One entry per prompt; each non-empty."""

    def prompts(self) -> list[list[int]]:
        return [self.prefix_ids + suffix for suffix in self.suffix_ids]


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix, leaving at least one token of every prompt unshared."""
    if not prompts:
        return 0
    first = list(prompts[0])
    length = max(min(len(p) for p in prompts) - 1, 0)
    for prompt in prompts:
        # Slices compare in C; only a mismatch is searched token by token, up to the shorter length.
        if list(prompt[:length]) != first[:length]:
            length = next(i for i in range(length) if prompt[i] != first[i])
    return length


def group_prompts(prompts: Sequence[list[int]]) -> PrefixGroup:
    """``prompts`` as their shared prefix (:func:`shared_prefix_length`) and each one's rest."""
    shared = shared_prefix_length(prompts)
    return PrefixGroup(list(prompts[0][:shared]) if prompts else [], [p[shared:] for p in prompts])


def distinct_prompts(prompts: Sequence[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in first-seen order, and for each input prompt the index of its copy."""
    distinct: list[list[int]] = []
    where: list[int] = []
    # A cheap key (length and three sampled tokens) tells most prompts apart; a whole prompt is
    # hashed only when its cheap key was seen before (a 256-document request is then ~10x faster).
    by_sample: dict[tuple[int, ...], int | None] = {}
    by_tokens: dict[tuple[int, ...], int] = {}
    for prompt in prompts:
        n = len(prompt)
        sample = (n, prompt[n // 3], prompt[n // 2], prompt[2 * n // 3]) if n else (0,)
        if sample not in by_sample:
            by_sample[sample] = len(distinct)
            where.append(len(distinct))
            distinct.append(prompt)
            continue
        earlier = by_sample[sample]
        if earlier is not None:  # the first collision on this sample: index the earlier prompt fully
            by_tokens[tuple(distinct[earlier])] = earlier
            by_sample[sample] = None
        key = tuple(prompt)
        if key not in by_tokens:
            by_tokens[key] = len(distinct)
            distinct.append(prompt)
        where.append(by_tokens[key])
    return distinct, where


MIN_TEMPLATE_TOKENS = 8
"""Fewest leading tokens jobs of distinct queries must share to be scored under one template prefix."""


def share_template(groups: Sequence[PrefixGroup]) -> tuple[list[PrefixGroup], list[int] | None]:
    """Jobs of one or two prompts each (``score_pairs`` over distinct queries), regrouped so that the
    template's head, which they all start with, is computed once rather than once a job.

    A job's group of ``n`` prompts sharing ``p`` tokens joins a head of ``t`` tokens when that costs
    fewer tokens (``n * (p - t) < p``): its query then goes into each prompt's own tokens. Returns the
    groups to run (those left as they were, then the one of the head), and, when any were joined,
    where each input prompt's row is among the run's rows (input order: group by group); else None.
    """
    candidates = [g for g, group in enumerate(groups) if 0 < len(group.suffix_ids) <= 2]
    if len(candidates) < 2:
        return list(groups), None
    firsts = [groups[g].prefix_ids + groups[g].suffix_ids[0] for g in candidates]
    head, shared = _common_head(firsts)
    if head < MIN_TEMPLATE_TOKENS:
        return list(groups), None
    joined = []
    for g in candidates:
        group = groups[g]
        n, p = len(group.suffix_ids), len(group.prefix_ids)
        starts = all(len(prompt) > head and prompt[:head] == shared for prompt in group.prompts())
        if starts and (n == 1 or n * (p - head) < p):
            joined.append(g)
    if len(joined) < 2:
        return list(groups), None
    members = set(joined)
    kept = [g for g in range(len(groups)) if g not in members]
    run = [groups[g] for g in kept]
    template = PrefixGroup(list(shared), [prompt[head:] for g in joined for prompt in groups[g].prompts()])
    starts_at: dict[int, int] = {}
    row = 0
    for g in kept + joined:
        starts_at[g] = row
        row += len(groups[g].suffix_ids)
    rows = [starts_at[g] + i for g, group in enumerate(groups) for i in range(len(group.suffix_ids))]
    return [*run, template], rows


def _common_head(prompts: list[list[int]]) -> tuple[int, list[int]]:
    """The head most of ``prompts`` start with: against each of the first three, the median of the
    other prompts' shared lengths (one prompt of another template must not cut it to nothing); the
    longest of those three."""
    best: tuple[int, list[int]] = (0, [])
    for reference in prompts[:3]:
        shared = sorted(
            (shared_prefix_length([reference, other]) for other in prompts if other is not reference),
            reverse=True,
        )
        head = shared[len(shared) // 2] if shared else 0
        if head > best[0]:
            best = (head, reference[:head])
    return best
