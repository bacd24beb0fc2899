"""Truncation on token lists that never cuts fixed template text.

Plain tail truncation (``prompt[:max_len]``) drops the answer cue at the end of a reranker prompt and
makes the score meaningless. Here only the substituted document (and, past its share of the budget,
the query) is shortened.
"""

from __future__ import annotations

from collections.abc import Sequence

from genscore_core.errors import PromptTooLongError
from genscore_core.templates import Span


def token_range(offsets: Sequence[tuple[int, int]], span: Span) -> tuple[int, int]:
    """Half-open range of the tokens whose characters overlap ``span`` (empty when none do)."""
    first = last = -1
    for position, (start, end) in enumerate(offsets):
        if start < span.end and end > span.start:
            if first < 0:
                first = position
            last = position
    if first < 0:
        return (0, 0)
    return (first, last + 1)


def query_token_cap(budget: int, query_share: float) -> int:
    """The most tokens the query may keep when a prompt has to be shortened."""
    return max(1, int(budget * query_share))


def drop_tail_of_range(ids: list[int], token_span: tuple[int, int], excess: int) -> list[int]:
    """Remove ``excess`` tokens from the end of ``token_span`` (tokens after the span are kept)."""
    start, end = token_span
    keep = end - start - excess
    if keep < 0:
        raise ValueError("cannot drop more tokens than the range holds")
    return ids[: start + keep] + ids[end:]


def truncate_raw(
    query_ids: list[int], item_ids: list[int], max_length: int, item_first: bool, index: int
) -> tuple[list[int], bool]:
    """Concatenate query and item ids, shortening the item (never the query) to fit ``max_length``."""
    excess = len(query_ids) + len(item_ids) - max_length
    truncated = excess > 0
    if truncated:
        # An item cut away entirely would score the query alone, which is not what was asked.
        if excess >= max(len(item_ids), 1):
            raise PromptTooLongError(
                f"the query is {len(query_ids)} tokens, which leaves no room for item {index} within "
                f"max_length={max_length}; shorten the query or raise max_length",
                param="query",
                index=index,
            )
        item_ids = item_ids[: len(item_ids) - excess]
    prompt = item_ids + query_ids if item_first else query_ids + item_ids
    if not prompt:
        raise PromptTooLongError(
            f"item {index} and the query are both empty: there is nothing to score",
            param="items",
            index=index,
        )
    return prompt, truncated
