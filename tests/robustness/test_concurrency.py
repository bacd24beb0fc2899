"""One scorer under the ways real callers use it: several threads or tasks at once, calls cancelled
mid-way, failures mid-stream, and documents given as iterators rather than lists."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

from genscore_core import GenerativeScorer, InvalidRequestError
from tests.reference_recipe import official_qwen3_scores

QUERY = "capital of france"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The river flows to the sea.",
    "France borders Spain and Italy.",
    "A mountain of paperwork.",
]


def _reference(scorer: GenerativeScorer, query: str, documents: list[str]) -> list[float]:
    return official_qwen3_scores(
        scorer.model, scorer.tokenizer, [(query, d) for d in documents], scorer.max_length
    )


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda docs: (d for d in docs), id="generator"),
        pytest.param(lambda docs: map(str, docs), id="map"),
        pytest.param(lambda docs: pd.Series(docs), id="series"),
        # Labels in reverse: series[i] is the row labelled i, not the i-th row.
        pytest.param(lambda docs: pd.Series(docs, index=range(len(docs) - 1, -1, -1)), id="series-reversed"),
        pytest.param(lambda docs: pd.Series(docs, index=range(10, 10 + len(docs))), id="series-offset"),
    ],
)
def test_rerank_reads_any_iterable_once_in_order(scorer: GenerativeScorer, make: object) -> None:
    expected = _reference(scorer, QUERY, DOCUMENTS)
    for ranked in (
        scorer.rerank(QUERY, make(DOCUMENTS)),  # type: ignore[operator]
        asyncio.run(scorer.arerank(QUERY, make(DOCUMENTS))),  # type: ignore[operator]
    ):
        assert len(ranked) == len(DOCUMENTS)
        for result in ranked:
            # The text reported is the one scored, and the score is the recipe's for it.
            assert result.document == DOCUMENTS[result.index]
            assert result.score == pytest.approx(expected[result.index], abs=1e-5)


def test_score_pairs_reads_a_generator_or_zip_once(scorer: GenerativeScorer) -> None:
    expected = _reference(scorer, QUERY, DOCUMENTS)
    from_zip = scorer.score_pairs(zip([QUERY] * len(DOCUMENTS), DOCUMENTS))
    from_generator = asyncio.run(scorer.ascore_pairs((QUERY, d) for d in DOCUMENTS))
    assert from_zip == pytest.approx(expected, abs=1e-5)
    assert from_generator == pytest.approx(expected, abs=1e-5)
    assert scorer.score_documents(QUERY, iter(DOCUMENTS)) == pytest.approx(expected, abs=1e-5)


def test_what_is_not_a_collection_of_texts_is_refused_by_name(scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError, match="documents must be an iterable") as raised:
        scorer.rerank(QUERY, 42)  # type: ignore[arg-type]
    assert raised.value.param == "documents"
    with pytest.raises(InvalidRequestError, match="documents must be a list of texts"):
        scorer.rerank(QUERY, "one text")
    with pytest.raises(InvalidRequestError, match="pairs must be"):
        scorer.score_pairs("query, document")  # type: ignore[arg-type]
