"""Property-based tests: random valid and invalid requests against the protocol and ``rerank``.

Every valid request gets one score per item, in order, each in [0, 1] and equal (1e-5) to an
independent reference computed here from the model's full logits in float64; every invalid one the
documented error naming the offending field. Nothing else may ever be raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer, InvalidRequestError
from tests.helpers.reference_recipe import full_vocab_label_prob, label_softmax_prob, official_qwen3_scores

VOCAB = 151669
MAX_LENGTH = 512
PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

# Every category, lone surrogates (Cs) included, and a boost for the characters that stress tokenizers.
_characters = st.one_of(
    st.characters(codec=None, categories=None),
    st.sampled_from(["\ud800", "\udfff", "\u0301", "\u200d", "👩", "中", " ", "\n", "\x00", "\ufeff"]),
)
texts = st.one_of(
    st.text(alphabet=_characters, max_size=60),
    st.text(alphabet=_characters, max_size=60),
    st.text(alphabet=_characters, min_size=300, max_size=1500),  # over the 512-token prompt
)


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(char) <= 0xDFFF for char in text)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


# -- the protocol ---------------------------------------------------------------------------------------

token_ids = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=40)
bad_token_ids = st.lists(
    st.one_of(st.integers(0, VOCAB - 1), st.booleans(), st.floats(0, 10), st.text(max_size=3)), min_size=1
).filter(lambda ids: any(isinstance(i, (bool, float, str)) for i in ids))
labels = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6, unique=True),  # valid
    st.lists(st.integers(-5, VOCAB + 5), min_size=0, max_size=6),  # maybe empty, repeated, out of range
    bad_token_ids,  # not integers
)
flags = st.one_of(st.booleans(), st.sampled_from(["yes", 2, None, 0.5]))


@st.composite
def protocol_requests(draw: st.DrawFn) -> dict[str, Any]:
    textual = draw(st.booleans())
    item = texts if textual else token_ids
    request: dict[str, Any] = {
        "query": draw(
            st.one_of(texts, token_ids, bad_token_ids, st.integers()) if draw(st.booleans()) else texts
        ),
        "items": draw(st.lists(st.one_of(item, item, texts | token_ids | bad_token_ids), max_size=5)),
        "label_token_ids": draw(labels),
    }
    for flag in ("apply_softmax", "item_first", "add_special_tokens"):
        if draw(st.booleans()):
            request[flag] = draw(flags)
    return request


def _type_problems(request: dict[str, Any]) -> set[str]:
    """Fields that are not of the protocol's types (what pydantic refuses: HTTP 422)."""

    def ids_ok(value: Any) -> bool:
        return isinstance(value, list) and all(type(i) is int for i in value)

    problems = set()
    if not (isinstance(request["query"], str) or ids_ok(request["query"])):
        problems.add("query")
    if not all(isinstance(item, str) or ids_ok(item) for item in request["items"]):
        problems.add("items")
    if not ids_ok(request["label_token_ids"]):
        problems.add("label_token_ids")
    for flag in ("apply_softmax", "item_first", "add_special_tokens"):
        value = request.get(flag, True)
        if not isinstance(value, bool):  # strict JSON booleans, as the protocol's flags are (issue 38)
            problems.add(flag)
    return problems


def _request_problems(request: dict[str, Any]) -> set[str]:
    """Fields the protocol answers with HTTP 400 (given well-typed fields)."""
    problems = set()
    items, label_ids, query = request["items"], request["label_token_ids"], request["query"]
    if not items or len({isinstance(item, str) for item in items}) > 1:
        problems.add("items")
    if not label_ids or len(label_ids) > 128 or len(set(label_ids)) < len(label_ids):
        problems.add("label_token_ids")
    if any(not 0 <= i < VOCAB for i in label_ids):
        problems.add("label_token_ids")
    for item in items:
        if (isinstance(item, str) and _has_surrogate(item)) or (
            isinstance(item, list) and any(not 0 <= i < VOCAB for i in item)
        ):
            problems.add("items")
    if (isinstance(query, str) and _has_surrogate(query)) or (
        isinstance(query, list) and any(not 0 <= i < VOCAB for i in query)
    ):
        problems.add("query")
    return problems


def _reference_scores(model: Any, tokenizer: Any, request: dict[str, Any]) -> list[float] | str:
    """Independent scores of a valid request, or the field an empty/overlong prompt is blamed on."""
    query = request["query"]
    special = bool(request.get("add_special_tokens", True))
    query_ids = tokenizer.encode(query, add_special_tokens=special) if isinstance(query, str) else query
    scores = []
    for item in request["items"]:
        item_ids = tokenizer(item, add_special_tokens=False)["input_ids"] if isinstance(item, str) else item
        room = MAX_LENGTH - len(query_ids)
        if len(query_ids) + len(item_ids) > MAX_LENGTH:
            if room <= 0:
                return "query"
            item_ids = item_ids[:room]
        prompt = item_ids + query_ids if request.get("item_first", False) else query_ids + item_ids
        if not prompt:
            return "items"
        if request.get("apply_softmax", True):
            scores.append(label_softmax_prob(model, prompt, request["label_token_ids"]))
        else:
            scores.append(full_vocab_label_prob(model, prompt, request["label_token_ids"][0]))
    return scores


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(request=protocol_requests())
def test_protocol_scores_or_names_the_field(
    scorer: GenerativeScorer, reference: tuple[Any, Any], request: dict[str, Any]
) -> None:
    type_problems = _type_problems(request)
    if type_problems:
        with pytest.raises(ValidationError) as refused:
            scorer.score(request)
        assert {error["loc"][0] for error in refused.value.errors()} <= type_problems
        return
    problems = _request_problems(request)
    expected = _reference_scores(*reference, request) if not problems else None
    if isinstance(expected, str):
        problems.add(expected)
    if problems:
        with pytest.raises(InvalidRequestError) as caught:
            scorer.score(request)
        assert caught.value.param in problems, (caught.value.param, problems, caught.value.message)
        return
    assert expected is not None and not isinstance(expected, str)
    answer = scorer.score(request)
    assert [entry.index for entry in answer.data] == list(range(len(request["items"])))
    got = [entry.score for entry in answer.data]
    assert all(0.0 <= score <= 1.0 for score in got)
    assert got == pytest.approx(expected, abs=1e-5)


# -- rerank ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@settings(PROPERTY_SETTINGS, max_examples=25)
@given(
    query=st.text(alphabet=_characters, max_size=40),
    documents=st.lists(texts, max_size=5),
    top_n=st.none() | st.integers(1, 6),
    threshold=st.none() | st.floats(0.0, 1.0),
)
def test_rerank_ranks_reference_scores_or_names_the_text(
    scorer: GenerativeScorer,
    reference: tuple[Any, Any],
    query: str,
    documents: list[str],
    top_n: int | None,
    threshold: float | None,
) -> None:
    bad = [i for i, document in enumerate(documents) if _has_surrogate(document)]
    if _has_surrogate(query) or bad:
        with pytest.raises(InvalidRequestError) as caught:
            scorer.rerank(query, documents, top_n=top_n, score_threshold=threshold)
        if _has_surrogate(query):
            assert (caught.value.param, caught.value.index) == ("query", None)
        else:
            assert (caught.value.param, caught.value.index) == ("documents", bad[0])
        return
    ranked = scorer.rerank(query, documents, top_n=top_n, score_threshold=threshold)
    expected = official_qwen3_scores(*reference, [(query, d) for d in documents], max_length=MAX_LENGTH)
    kept = [i for i in range(len(documents)) if threshold is None or expected[i] >= threshold - 1e-5]
    results = list(ranked)
    assert len({r.index for r in results}) == len(results)
    for result in results:
        assert 0.0 <= result.score <= 1.0
        assert result.score == pytest.approx(expected[result.index], abs=1e-5)
        assert result.document == documents[result.index]
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    limit = len(kept) if top_n is None else min(top_n, len(kept))
    assert abs(len(results) - limit) <= sum(
        1 for i in range(len(documents)) if threshold is not None and abs(expected[i] - threshold) <= 1e-5
    )
    # One score per document, in input order, from the pairs API as well.
    assert scorer.score_pairs([(query, d) for d in documents]) == pytest.approx(expected, abs=1e-5)
