"""The protocol's request validation: each error names the problem and the offending value."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from genscore_core import GenerativeScorer, GenerativeScoringRequest, InvalidRequestError
from genscore_core.protocol import MAX_LABEL_TOKENS, check_request

VOCAB = 151669


def _request(**overrides: Any) -> GenerativeScoringRequest:
    fields: dict[str, Any] = {"query": "q", "items": ["a", "b"], "label_token_ids": [9454, 2753]}
    fields.update(overrides)
    return GenerativeScoringRequest(**fields)


def test_defaults_follow_the_protocol() -> None:
    request = _request()
    assert request.apply_softmax is True
    assert request.item_first is False
    assert request.add_special_tokens is True
    assert request.model is None


def test_missing_label_ids_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="label_token_ids"):
        GenerativeScoringRequest(query="q", items=["a"])  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("overrides", "message", "param", "index"),
    [
        ({"items": []}, "items must contain at least one item.", "items", None),
        (
            {"label_token_ids": []},
            "label_token_ids must contain at least one token ID.",
            "label_token_ids",
            None,
        ),
        (
            {"label_token_ids": [5, VOCAB]},
            f"label_token_id {VOCAB} is out of vocabulary range [0, {VOCAB})",
            "label_token_ids",
            1,
        ),
        ({"label_token_ids": [-1]}, "label_token_id -1 is out of vocabulary range", "label_token_ids", 0),
        ({"label_token_ids": list(range(MAX_LABEL_TOKENS + 1))}, "at most 128", "label_token_ids", None),
        ({"label_token_ids": [7, 8, 7]}, "contains 7 twice (entries 0 and 2)", "label_token_ids", 2),
        ({"items": ["a", [1, 2]]}, "item 0 is text but item 1 is token ids", "items", 1),
        ({"items": [[1], "b"]}, "item 0 is token ids but item 1 is text", "items", 1),
        ({"items": [[1], [2, VOCAB + 5]]}, f"item 1 contains token id {VOCAB + 5}", "items", 1),
        ({"query": [1, -3]}, "query contains token id -3", "query", None),
    ],
)
def test_bad_requests_name_the_problem(
    overrides: dict[str, Any], message: str, param: str, index: int | None
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_request(_request(**overrides), VOCAB)
    assert message in str(caught.value)
    assert caught.value.param == param
    assert caught.value.index == index


def test_128_distinct_labels_are_accepted() -> None:
    check_request(_request(label_token_ids=list(range(MAX_LABEL_TOKENS))), VOCAB)


def test_scorer_checks_against_the_model_vocabulary(scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError, match=r"out of vocabulary range \[0, 151669\)"):
        scorer.score({"query": "q", "items": ["a"], "label_token_ids": [200000, 2]})
    with pytest.raises(InvalidRequestError, match=r"items must contain at least one item\."):
        scorer.score({"query": "q", "items": [], "label_token_ids": [1, 2]})


def test_usage_counts_real_prompt_tokens(scorer: GenerativeScorer) -> None:
    tokenizer = scorer.tokenizer
    request = {
        "query": "Is this city the capital of France?",
        "items": ["Paris", "New York"],
        "label_token_ids": [9454, 2753],
    }
    response = scorer.score(request)
    query = len(tokenizer.encode(request["query"]))
    items = [len(tokenizer.encode(item, add_special_tokens=False)) for item in request["items"]]
    assert response.usage.prompt_tokens == sum(query + n for n in items)
    assert response.usage.total_tokens == response.usage.prompt_tokens
    assert response.usage.completion_tokens == 0
    assert response.usage.prompt_tokens_details is None
    pre = scorer.score(
        {"query": [100, 200], "items": [[300, 400], [500, 600, 700]], "label_token_ids": [9454, 2753]}
    )
    assert pre.usage.prompt_tokens == 4 + 5


def test_response_shape(scorer: GenerativeScorer) -> None:
    response = scorer.score({"model": "tiny", "query": "q", "items": ["a"], "label_token_ids": [9454, 2753]})
    body = response.model_dump()
    assert body["id"].startswith("generative-score-")
    assert body["object"] == "list"
    assert body["model"] == "tiny"
    assert isinstance(body["created"], int)
    assert body["data"] == [{"index": 0, "object": "score", "score": response.data[0].score}]


def test_repeated_calls_are_identical(scorer: GenerativeScorer) -> None:
    request = {"query": "capital", "items": ["Paris", "Lyon", "Rome"], "label_token_ids": [9454, 2753]}
    first = [d.score for d in scorer.score(request).data]
    for _ in range(3):
        assert [d.score for d in scorer.score(request).data] == first
