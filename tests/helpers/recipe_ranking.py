"""What the adapters' rankings should be, taken from the official Qwen3-Reranker recipe.

The adapter tests (LangChain, LlamaIndex) compare each returned score with the recipe in
``tests/helpers/reference_recipe.py``, run on a copy of the tiny model loaded on its own with transformers, so
that no expectation comes from genscore's own output. The expected order is the recipe's scores sorted
best first, ties in input order. Random weights put some scores close together, and genscore's packed
forward differs from the recipe's by float noise, so the order is only asserted between scores that
are more than :data:`NEAR_TIE` apart; exact ties are checked by tests of their own.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.helpers.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    official_qwen3_scores,
)

SCORE_TOLERANCE = 1e-5
"""How far an adapter's score may be from the recipe's (fp32 against the recipe's float64 softmax)."""

NEAR_TIE = 1e-4
"""Scores closer than this may come back in either order."""

SCORING_ENTRY_POINTS = ("rerank", "arerank", "score_pairs", "ascore_pairs", "score_documents", "encode")
"""The scorer methods through which anything is scored (for "nothing was scored" checks)."""

RIVER_QUERY = "Which river flows through Paris?"
RIVER_TEXTS = [
    "The Seine flows through Paris before reaching the English Channel.",
    "Berlin is the capital of Germany and lies on the Spree.",
    "The Loire is the longest river in France.",
    "Paris hosted the Summer Olympics in 1900, 1924 and 2024.",
    "The Thames flows through London.",
]
"""A query and texts that the adapter tests rank: one answers it, the others share its words or topic."""


@functools.lru_cache(maxsize=2)
def _recipe_model(model_dir: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


class RecipeReference:
    """The official recipe on the model in ``model_dir``, loaded once per test session."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model, self.tokenizer = _recipe_model(str(model_dir))

    def pair_scores(
        self, pairs: Sequence[tuple[str, str]], *, max_length: int = 512, instruction: str = QWEN3_INSTRUCTION
    ) -> list[float]:
        return official_qwen3_scores(
            self.model, self.tokenizer, list(pairs), max_length=max_length, instruction=instruction
        )

    def scores(
        self, query: str, texts: Sequence[str], *, max_length: int = 512, instruction: str = QWEN3_INSTRUCTION
    ) -> list[float]:
        return self.pair_scores([(query, t) for t in texts], max_length=max_length, instruction=instruction)

    def is_cut(self, query: str, text: str, *, max_length: int, instruction: str = QWEN3_INSTRUCTION) -> bool:
        """Whether the recipe's prompt for (query, text) is longer than ``max_length`` tokens, so that
        the recipe cuts its tail."""
        body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {text}"
        pieces = (QWEN3_PREFIX, body, QWEN3_SUFFIX)
        return sum(len(self.tokenizer.encode(p, add_special_tokens=False)) for p in pieces) > max_length


def best_first(scores: Sequence[float]) -> list[int]:
    """Input indices by descending score; equal scores keep their input order."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def expected_indices(
    scores: Sequence[float], *, top_n: int | None = None, score_threshold: float | None = None
) -> list[int]:
    """What a reranker with these options returns, as input indices, best first."""
    kept = best_first(scores)
    if score_threshold is not None:
        close = [scores[i] for i in kept if abs(scores[i] - score_threshold) <= NEAR_TIE]
        assert not close, f"threshold {score_threshold} is too close to a reference score {close} to test"
        kept = [i for i in kept if scores[i] >= score_threshold]
    return kept if top_n is None else kept[:top_n]


def threshold_between(scores: Sequence[float], kept: int) -> float:
    """A threshold halfway between the ``kept``-th and the next best reference score, so that exactly
    ``kept`` pass whatever the float noise."""
    ordered = sorted(scores, reverse=True)
    above, below = ordered[kept - 1], ordered[kept]
    assert above - below > 2 * NEAR_TIE, f"scores {above} and {below} are too close to split"
    return (above + below) / 2


def _near_tie_groups(scores: Sequence[float]) -> dict[int, int]:
    """Input index -> group number; neighbours (by score) within NEAR_TIE share a group."""
    group: dict[int, int] = {}
    previous: float | None = None
    number = -1
    for i in best_first(scores):
        if previous is None or previous - scores[i] > NEAR_TIE:
            number += 1
        group[i] = number
        previous = scores[i]
    return group


def assert_order_like_recipe(
    indices: Sequence[int],
    scores: Sequence[float],
    *,
    top_n: int | None = None,
    score_threshold: float | None = None,
) -> None:
    """``indices`` (inputs, best first) are what the recipe's ``scores`` keep with these options, in
    the recipe's order wherever it is clear."""
    want = expected_indices(scores, top_n=top_n, score_threshold=score_threshold)
    indices = list(indices)
    assert len(indices) == len(want), f"got {indices}, the recipe ranks {want}"
    assert len(set(indices)) == len(indices), f"an input came back twice: {indices}"
    group = _near_tie_groups(scores)
    assert [group[i] for i in indices] == [group[i] for i in want], f"got {indices}, the recipe ranks {want}"


def assert_ranked_like_recipe(
    got: Sequence[tuple[int, float | None]],
    scores: Sequence[float],
    *,
    top_n: int | None = None,
    score_threshold: float | None = None,
) -> None:
    """:func:`assert_order_like_recipe` for ``got`` (input index, score) best first, and each score
    within SCORE_TOLERANCE of the recipe's."""
    assert_order_like_recipe([i for i, _ in got], scores, top_n=top_n, score_threshold=score_threshold)
    assert [score for _, score in got] == pytest.approx([scores[i] for i, _ in got], abs=SCORE_TOLERANCE)


@contextlib.contextmanager
def spied(target: Any, *names: str) -> Iterator[dict[str, mock.MagicMock]]:
    """Record the calls to ``target``'s methods ``names``; each still runs as before (no stub)."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(mock.patch.object(target, name, wraps=getattr(target, name)))
            for name in names
        }
