"""Scores read out of a server's answer, trusting nothing in it: each a score of the client's mode (a
probability, a rounding step past 0 or 1 allowed; in ``logit`` mode any finite number), one per item
sent, by index, none missing or repeated; errors name the item.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# Servers compute in float32 or bf16; a probability a rounding step past 0 or 1 is still one.
PROBABILITY_ROUNDING = 1e-6


def _finite(value: Any, wanted: str) -> float:
    """``value`` as a finite float, or a ValueError quoting it and saying it is not ``wanted``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"score {value!r} is not a number")
    try:
        score = float(value)
    except OverflowError:  # an integer beyond float's range (JSON allows any number of digits)
        raise ValueError(f"score {_short(value)} is not {wanted}") from None
    if not math.isfinite(score):
        raise ValueError(f"score {value!r} is not {wanted}")
    return score


def as_probability(value: Any) -> float:
    """A score from a server's answer: a finite number within [0, 1] (up to rounding, then clamped).

    Raises:
        ValueError: ``value`` is not such a number (the message quotes it).
    """
    score = _finite(value, "a probability in [0, 1]")
    if not -PROBABILITY_ROUNDING <= score <= 1.0 + PROBABILITY_ROUNDING:
        raise ValueError(f"score {value!r} is not a probability in [0, 1]")
    return min(max(score, 0.0), 1.0)


def as_logit(value: Any) -> float:
    """A score of ``logit`` mode from a server's answer: any finite number.

    Raises:
        ValueError: ``value`` is not such a number (the message quotes it).
    """
    return _finite(value, "a finite number")


def as_score(value: Any, mode: str) -> float:
    """A score of ``mode`` from a server's answer (:func:`as_logit` or :func:`as_probability`)."""
    return as_logit(value) if mode == "logit" else as_probability(value)


def scores_by_index(
    entries: list[Any],
    count: int,
    score_of: Callable[[Any], Any],
    offset: int = 0,
    mode: str = "label-softmax",
) -> list[float]:
    """The scores of ``count`` items from answer entries that each carry an ``index``, in item order.

    ``score_of`` reads an entry's score; ``offset`` is the place of the request's first item in its
    job (a job split into several requests), used to name the item a bad score belongs to. Each score
    must be one of score mode ``mode`` (:func:`as_score`).

    Raises:
        ValueError: An entry is malformed, or an index is bad or repeated (the message names the
            entry, or the item once its index is known).
    """
    scores: list[float | None] = [None] * count
    for position, entry in enumerate(entries):
        try:
            index = as_index(entry["index"], count)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"entry {position}: {_describe(error)}") from None
        if scores[index] is not None:
            raise ValueError(f"index {index} appears twice")
        try:
            scores[index] = as_score(score_of(entry), mode)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{item_name(index, count, offset)}: {_describe(error)}") from None
    missing = [index for index, score in enumerate(scores) if score is None]
    if missing:
        raise ValueError(f"no score for index {missing[0]}")
    return [score for score in scores if score is not None]


def item_name(index: int, count: int, offset: int) -> str:
    """Names item ``index`` of a request of ``count`` items starting at item ``offset`` of its job."""
    if offset == 0:
        return f"item {index}"
    return f"item {offset + index} (index {index} of the request for items {offset} to {offset + count - 1})"


def _describe(error: Exception) -> str:
    # A KeyError's text is the bare key, which says nothing on its own.
    return f"no {error.args[0]!r} field" if isinstance(error, KeyError) else str(error)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def as_index(value: Any, count: int) -> int:
    """An item index from a server's answer: an exact integer in ``[0, count)`` (``true`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"index {value!r} is not an integer")
    if not 0 <= value < count:
        raise ValueError(f"index {_short(value)} is outside [0, {count})")
    return value
