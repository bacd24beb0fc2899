"""What crosses the public API's edges: inputs that would be misread, and scores a backend hands back."""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
import pytest

from genscore_core import GenerativeScorer, InvalidRequestError

QUERY = "capital of france"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is the capital of Germany.", "A river."]


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda s, frame: s.rerank(QUERY, frame), "documents"),
        (lambda s, frame: asyncio.run(s.arerank(QUERY, frame)), "documents"),
        (lambda s, frame: s.score_documents(QUERY, frame), "documents"),
        (lambda s, frame: s.encode(QUERY, frame), "documents"),
        (lambda s, frame: s.score_pairs(frame), "pairs"),
        (lambda s, frame: asyncio.run(s.ascore_pairs(frame)), "pairs"),
    ],
)
def test_a_data_frame_is_refused_not_read_as_its_column_names(
    scorer: GenerativeScorer, call: Any, param: str
) -> None:
    # Iterating a DataFrame gives its column labels: "text" would have been ranked as the one document.
    frame = pd.DataFrame({"query": [QUERY] * len(DOCUMENTS), "text": DOCUMENTS})
    with pytest.raises(
        InvalidRequestError, match="got a DataFrame, which iterates its column names"
    ) as caught:
        call(scorer, frame)
    assert caught.value.param == param
    # One column is a Series, read as its rows.
    assert len(scorer.rerank(QUERY, frame["text"])) == len(DOCUMENTS)
