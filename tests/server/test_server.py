"""``genscore serve`` on a real uvicorn socket: the seed's examples and errors, limits, rerank, health."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from genscore_core import GenerativeScorer
from genscore_core.backend import ScoringBackend
from genscore_core.server import create_app
from tests.helpers.server import CAPITAL_DOCUMENTS as DOCUMENTS
from tests.helpers.server import (
    SEED_EMPTY_ITEMS_ERROR,
    SEED_EMPTY_ITEMS_REQUEST,
    SEED_TEXT_REQUEST,
    SEED_TOKEN_REQUEST,
    TEST_LIMITS,
    serve_in_thread,
)

PATHS = ["/generative_score", "/generative_scoring"]


def _assert_error(
    response: httpx.Response, code: int, message_start: str = "", param: str | None = None
) -> dict[str, Any]:
    """The error body's shape, status, message and ``param`` (the offending field, or null)."""
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}
    error = body["error"]
    assert body["detail"] == error["message"]  # where Jina-style clients read the message
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param, error
    assert error["message"].startswith(message_start), error["message"]
    return dict(error)


def _assert_response_shape(body: dict[str, Any], count: int, model: str) -> None:
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"].startswith("generative-score-")
    assert body["object"] == "list" and isinstance(body["created"], int) and body["model"] == model
    assert [entry["index"] for entry in body["data"]] == list(range(count))
    for entry in body["data"]:
        assert set(entry) == {"index", "object", "score"} and entry["object"] == "score"
        assert 0.0 <= entry["score"] <= 1.0
    usage = body["usage"]
    assert set(usage) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens_details"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] > 0


def _scores(body: dict[str, Any]) -> list[float]:
    return [entry["score"] for entry in body["data"]]


# -- the seed's examples ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_seed_text_example(client: httpx.Client, scorer: GenerativeScorer, path: str) -> None:
    _seed_answer(client, scorer, path, SEED_TEXT_REQUEST, 5)


def _seed_answer(
    client: httpx.Client, scorer: GenerativeScorer, path: str, request: dict[str, Any], items: int
) -> dict[str, Any]:
    response = client.post(path, json=request)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    _assert_response_shape(body, items, scorer.config.model)
    # Exactly what the library answers for the same request (a batch of one either way).
    assert _scores(body) == [d.score for d in scorer.score(request).data]
    return body


@pytest.mark.parametrize("path", PATHS)
def test_seed_pretokenized_example(client: httpx.Client, scorer: GenerativeScorer, path: str) -> None:
    body = _seed_answer(client, scorer, path, SEED_TOKEN_REQUEST, 2)
    assert body["usage"]["prompt_tokens"] == 8  # as in the seed: 2 prompts of 2 + 2 tokens


def test_the_served_model_name_is_answered(client: httpx.Client, scorer: GenerativeScorer) -> None:
    named = {**SEED_TOKEN_REQUEST, "model": scorer.config.model}
    assert client.post("/generative_scoring", json=named).json()["model"] == scorer.config.model
    other = client.post("/generative_scoring", json={**SEED_TOKEN_REQUEST, "model": "my-reranker"})
    assert other.status_code == 404  # as vLLM: a model the server does not serve


def test_identical_requests_give_identical_scores(client: httpx.Client) -> None:
    answers = [_scores(client.post("/generative_score", json=SEED_TEXT_REQUEST).json()) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]


def test_options_change_the_scores_as_the_protocol_says(
    client: httpx.Client, scorer: GenerativeScorer
) -> None:
    for options in ({"apply_softmax": False}, {"item_first": True}, {"add_special_tokens": False}):
        request = {**SEED_TEXT_REQUEST, **options}
        body = client.post("/generative_scoring", json=request).json()
        assert _scores(body) == [d.score for d in scorer.score(request).data], options


# -- the seed's errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_empty_items_is_the_seeds_400(client: httpx.Client, path: str) -> None:
    response = client.post(path, json=SEED_EMPTY_ITEMS_REQUEST)
    assert response.status_code == 400
    # The seed's body, plus the message again as "detail" for Jina-style clients.
    assert response.json() == {**SEED_EMPTY_ITEMS_ERROR, "detail": SEED_EMPTY_ITEMS_ERROR["error"]["message"]}


def test_out_of_vocabulary_label_is_400(client: httpx.Client, scorer: GenerativeScorer) -> None:
    response = client.post("/generative_score", json={**SEED_TEXT_REQUEST, "label_token_ids": [9454, 10**6]})
    error = _assert_error(
        response,
        400,
        f"label_token_id 1000000 is out of vocabulary range [0, {scorer.vocab_size}).",
        param="label_token_ids.1",
    )
    assert error["type"] == "BadRequestError"


def test_empty_label_ids_is_400(client: httpx.Client) -> None:
    response = client.post("/generative_score", json={**SEED_TEXT_REQUEST, "label_token_ids": []})
    error = _assert_error(
        response, 400, "label_token_ids must contain at least one token ID.", param="label_token_ids"
    )
    assert error["type"] == "BadRequestError"


def test_missing_label_ids_is_422(client: httpx.Client) -> None:
    request = {key: value for key, value in SEED_TEXT_REQUEST.items() if key != "label_token_ids"}
    error = _assert_error(client.post("/generative_score", json=request), 422, param="label_token_ids")
    assert "label_token_ids" in error["message"]


@pytest.mark.parametrize(
    ("content", "param", "message"),
    [
        (b"{not json", None, "the request body is not valid JSON"),
        (b'"a JSON string"', None, "Input should be a valid dictionary"),
        (b"[1, 2]", None, "Input should be a valid dictionary"),
        (
            json.dumps({**SEED_TEXT_REQUEST, "items": 5}).encode(),
            "items",
            "items: Input should be a valid list",
        ),
    ],
    ids=["invalid-json", "a-string", "not-an-object", "wrong-type"],
)
def test_malformed_bodies_are_422(
    client: httpx.Client, content: bytes, param: str | None, message: str
) -> None:
    response = client.post(
        "/generative_scoring", content=content, headers={"content-type": "application/json"}
    )
    _assert_error(response, 422, message, param=param)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_under_another_content_type_is_a_422_saying_so(
    client: httpx.Client, content_type: str | None
) -> None:
    # curl -d sends application/x-www-form-urlencoded unless told otherwise; pydantic's own message
    # was "Input should be a valid dictionary or object to extract fields from".
    headers = {"content-type": content_type} if content_type else {}
    response = client.post(
        "/v1/rerank", content=json.dumps({"query": "q", "documents": ["a"]}), headers=headers
    )
    error = _assert_error(
        response, 422, f"the request body was sent with Content-Type: {content_type or 'none'}"
    )
    assert "Content-Type: application/json" in error["message"]


def test_a_body_that_is_not_utf8_or_nests_too_deeply_is_a_422_saying_so(client: httpx.Client) -> None:
    # Both were a 400 "There was an error parsing the body", naming neither the problem nor the fix.
    headers = {"content-type": "application/json"}
    latin1 = '{"query": "café", "documents": ["a"]}'.encode("latin-1")
    _assert_error(
        client.post("/v1/rerank", content=latin1, headers=headers),
        422,
        "the request body is not valid utf-8 text: byte 0xe9 at position 14",
    )
    deep = b'{"query": "q", "documents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = client.post("/v1/rerank", content=deep, headers=headers)
    _assert_error(response, 422, "the request body nests JSON arrays or objects too deeply")


def test_a_body_with_a_key_twice_is_a_422_naming_the_key(client: httpx.Client) -> None:
    # JSON parsers disagree on which copy of a repeated key counts; Python's kept the last one, and
    # documents ["a", "b"] followed by ["c"] were scored as ["c"] alone, with a 200.
    headers = {"content-type": "application/json"}
    cases = [
        ("/v1/rerank", b'{"query": "q", "documents": ["a", "b"], "documents": ["c"]}', '"documents"'),
        ("/v1/rerank", b'{"query": "q", "documents": [{"text": "a", "text": "b"}]}', '"text"'),
        ("/v2/rerank", b'{"query": "q", "query": "r", "documents": ["a"]}', '"query"'),
        (
            "/generative_scoring",
            b'{"query": "q", "items": ["a", "b"], "label_token_ids": [9454, 2753], "items": ["c"]}',
            '"items"',
        ),
    ]
    for path, content, key in cases:
        error = _assert_error(
            client.post(path, content=content, headers=headers), 422, "the request body has"
        )
        assert f"the key {key} twice in one object" in error["message"], error["message"]
    # Equal keys in different objects are no repetition.
    fine = b'{"query": "q", "documents": [{"text": "a"}, {"text": "b"}]}'
    assert client.post("/v1/rerank", content=fine, headers=headers).status_code == 200


def test_a_large_body_is_parsed_off_the_event_loop(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A body of many small objects parses at a few MB/s: on the event loop, seconds in which no
    # other request was answered. Small bodies stay on the loop (a thread hop costs more there).
    from genscore_core import strict_json
    from genscore_core.server import app

    threshold = 64 * 1024  # the test server's body limit is under the shipped 1 MiB
    monkeypatch.setattr(app, "PARSED_OFF_THE_LOOP_BYTES", threshold)
    real = strict_json.loads
    parsed: list[tuple[int, int]] = []

    def loads(text: str | bytes, **options: Any) -> Any:
        parsed.append((len(text), threading.get_ident()))
        return real(text, **options)

    monkeypatch.setattr(strict_json, "loads", loads)
    small = {"query": "q", "documents": ["a", "b"]}
    large = {"query": "q", "documents": ["a", "b"], "padding": [{"k": 1}] * (threshold // 8)}
    answers = [client.post("/v1/rerank", json=body) for body in (small, large, small)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert [r["index"] for r in answers[1].json()["results"]] == [
        r["index"] for r in answers[0].json()["results"]
    ]
    (_, loop), (size, worker), (_, loop_again) = parsed
    assert size >= threshold
    assert loop == loop_again and worker != loop


def test_a_number_too_long_to_read_and_an_empty_body_are_422_saying_so(client: httpx.Client) -> None:
    # Both were bare: a 400 "There was an error parsing the body" and a 422 "Field required".
    headers = {"content-type": "application/json"}
    huge = b'{"query": "q", "documents": ["a"], "top_n": ' + b"9" * 5000 + b"}"
    error = _assert_error(client.post("/v1/rerank", content=huge, headers=headers), 422)
    assert "a number of more than 4300 digits" in error["message"], error["message"]
    huge_label = b'{"query": "q", "items": ["a"], "label_token_ids": [9454, ' + b"1" * 4301 + b"]}"
    error = _assert_error(client.post("/generative_scoring", content=huge_label, headers=headers), 422)
    assert "a number of more than 4300 digits" in error["message"], error["message"]
    for path in ("/v1/rerank", "/generative_scoring"):
        _assert_error(client.post(path, content=b"", headers=headers), 422, "the request body is empty")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("top_n", True),
        ("top_n", "2"),
        ("top_n", 2.0),
        ("score_threshold", True),
        ("score_threshold", "0.5"),
        ("max_tokens_per_doc", True),
        ("max_tokens_per_doc", "3"),
        ("return_documents", "yes"),
        ("return_documents", 1),
    ],
)
def test_rerank_options_of_the_wrong_type_are_422_naming_the_option(
    client: httpx.Client, option: str, value: object
) -> None:
    """Lax parsing read ``true`` as 1 (top_n: one result of four; max_tokens_per_doc: every document
    cut to one token) or 1.0 (score_threshold: no results), all with a 200; the library refuses a bool
    top_n (check_rank_options)."""
    response = client.post("/v1/rerank", json={"query": "q", "documents": DOCUMENTS, option: value})
    error = _assert_error(response, 422, f"{option}: Input should be a valid", param=option)
    assert error["type"] == "UnprocessableEntityError"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("apply_softmax", "true"),
        ("apply_softmax", "false"),
        ("apply_softmax", "no"),
        ("apply_softmax", 0),
        ("apply_softmax", 1.0),
        ("item_first", "true"),
        ("item_first", "yes"),
        ("item_first", "1"),
        ("item_first", 1),
        ("add_special_tokens", "off"),
        ("label_token_ids", [9454, "2753"]),
        ("label_token_ids", [9454, 2753.0]),
    ],
)
def test_protocol_options_of_the_wrong_type_are_422_naming_the_option(
    client: httpx.Client, option: str, value: object
) -> None:
    """Lax parsing read ``"false"``, ``"no"`` and ``0`` as False and ``"true"``, ``"yes"``, ``"1"`` and
    ``1`` as True: a string-typed client config changed the scores asked for (full vocabulary instead
    of the labels, the item before the query) with a 200. Booleans and token ids are JSON's own."""
    response = client.post("/generative_scoring", json={**SEED_TEXT_REQUEST, option: value})
    # A list's bad entry is named by its position: label_token_ids.1.
    where = f"{option}.1" if isinstance(value, list) else option
    error = _assert_error(response, 422, f"{where}: Input should be a valid", param=where)
    assert error["type"] == "UnprocessableEntityError"


def test_protocol_booleans_given_as_json_booleans_still_apply(client: httpx.Client) -> None:
    plain = _scores(client.post("/generative_scoring", json=SEED_TEXT_REQUEST).json())
    for option in ("apply_softmax", "item_first"):
        flipped = {**SEED_TEXT_REQUEST, option: not SEED_TEXT_REQUEST.get(option, option == "apply_softmax")}
        response = client.post("/generative_scoring", json=flipped)
        assert response.status_code == 200, response.text
        assert _scores(response.json()) != plain, option


def test_rerank_options_of_the_right_type_still_apply(client: httpx.Client) -> None:
    request: dict[str, Any] = {"query": "q", "documents": DOCUMENTS}
    everything = client.post("/v1/rerank", json={**request, "score_threshold": 0}).json()["results"]
    assert sorted(result["index"] for result in everything) == list(range(len(DOCUMENTS)))
    assert client.post("/v1/rerank", json={**request, "score_threshold": 1}).json()["results"] == [
        result for result in everything if result["relevance_score"] >= 1.0
    ]
    best = client.post("/v1/rerank", json={**request, "top_n": 2, "return_documents": True}).json()
    assert [result["index"] for result in best["results"]] == [result["index"] for result in everything[:2]]
    assert [result["document"]["text"] for result in best["results"]] == [
        DOCUMENTS[result["index"]] for result in everything[:2]
    ]


def test_mixed_item_kinds_are_400(client: httpx.Client) -> None:
    response = client.post("/generative_scoring", json={**SEED_TEXT_REQUEST, "items": ["Paris", [1, 2]]})
    _assert_error(response, 400, "items must be all text or all token-id lists", param="items.1")


def test_unknown_path_uses_the_error_body(client: httpx.Client) -> None:
    error = _assert_error(client.post("/v1/nothing", json={}), 404)
    assert error["type"] == "NotFoundError"


def test_error_param_names_the_offending_field_and_entry(client: httpx.Client) -> None:
    # OpenAI-style bodies name the field at fault, so a client can point at its own data.
    lone_surrogate = '{"query": "q", "documents": ["a", "b", "c", "bad \\ud800 text"]}'
    response = client.post("/v1/rerank", content=lone_surrogate, headers={"content-type": "application/json"})
    _assert_error(response, 400, "documents[3] is not valid text", param="documents.3")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"documents": ["a"]}, "query"),
        ({"query": 5, "documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a", {"txt": "b"}]}, "documents.1.text"),
        ({"query": "q", "documents": ["a", "b", 7]}, "documents.2"),
        ({"query": "q", "documents": "not a list"}, "documents"),
        ({"query": "q", "documents": ["a"], "score_threshold": 2}, "score_threshold"),
    ]
    for body, param in cases:
        _assert_error(client.post("/v1/rerank", json=body), 422, param=param)
    mixed = {**SEED_TEXT_REQUEST, "items": [[1], [2], "three"]}
    _assert_error(client.post("/generative_scoring", json=mixed), 400, param="items.2")
    not_an_id = {**SEED_TEXT_REQUEST, "items": [[1], [2, "x"]]}
    _assert_error(client.post("/generative_scoring", json=not_an_id), 422, param="items.1.1")
    duplicate = {**SEED_TEXT_REQUEST, "label_token_ids": [9454, 2753, 9454]}
    _assert_error(client.post("/generative_scoring", json=duplicate), 400, param="label_token_ids.2")
    unknown = client.post("/v1/rerank", json={"model": "other", "query": "q", "documents": ["a"]})
    _assert_error(unknown, 404, "The model `other` does not exist", param="model")


# -- limits -----------------------------------------------------------------------------------------


def test_too_many_items_is_a_clear_400(client: httpx.Client) -> None:
    count = TEST_LIMITS.max_items_per_request + 1
    request = {"query": [1, 2], "items": [[3]] * count, "label_token_ids": [9454, 2753]}
    response = client.post("/generative_scoring", json=request)
    _assert_error(response, 400, f"items has {count} entries", param="items")
    rerank = {"query": "q", "documents": ["d"] * count}
    response = client.post("/v1/rerank", json=rerank)
    _assert_error(response, 400, f"documents has {count} entries", param="documents")


def test_too_many_prompt_tokens_is_a_clear_400(client: httpx.Client) -> None:
    # 50 prompts of 401 tokens: under the item limit, over the 20,000-token limit.
    request = {"query": [7] * 400, "items": [[8]] * 50, "label_token_ids": [9454, 2753]}
    error = _assert_error(
        client.post("/generative_scoring", json=request), 400, "the request's prompts total"
    )
    assert "at most 20000" in error["message"]


def test_oversized_body_is_413_declared_or_streamed(client: httpx.Client) -> None:
    big = json.dumps({**SEED_TEXT_REQUEST, "query": "x" * (TEST_LIMITS.max_body_bytes + 10)}).encode()
    declared = client.post("/generative_scoring", content=big, headers={"content-type": "application/json"})
    _assert_error(declared, 413, "request body is")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for start in range(0, len(big), 16384):
            yield big[start : start + 16384]

    streamed = client.post(
        "/generative_scoring", content=chunks(), headers={"content-type": "application/json"}
    )
    _assert_error(streamed, 413, "request body is more")
    assert client.get("/health").status_code == 200  # and the server carries on


# -- rerank, health, models -------------------------------------------------------------------------


def test_rerank_endpoint_matches_the_library(client: httpx.Client, scorer: GenerativeScorer) -> None:
    query = "What is the capital of France?"
    response = client.post(
        "/v1/rerank", json={"query": query, "documents": DOCUMENTS, "top_n": 2, "return_documents": True}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("rerank-") and body["model"] == scorer.config.model
    expected = scorer.rerank(query, DOCUMENTS, top_n=2)
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [
        (r.index, r.score) for r in expected
    ]
    assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[r.index]} for r in expected]
    assert body["usage"]["total_tokens"] == sum(p.prompt_tokens for p in scorer.rerank(query, DOCUMENTS))


def test_rerank_endpoint_defaults_and_variants(client: httpx.Client) -> None:
    query = "capital of France"
    every = client.post("/rerank", json={"query": query, "documents": DOCUMENTS}).json()["results"]
    assert sorted(r["index"] for r in every) == list(range(len(DOCUMENTS)))
    assert all("document" not in r for r in every)  # only when asked for
    assert [r["relevance_score"] for r in every] == sorted(
        (r["relevance_score"] for r in every), reverse=True
    )
    objects = [{"text": doc} for doc in DOCUMENTS]
    as_objects = client.post("/v1/rerank", json={"query": query, "documents": objects, "top_n": 0}).json()
    assert as_objects["results"] == every  # top_n 0 keeps all, as vLLM reads it
    assert client.post("/v1/rerank", json={"query": query, "documents": []}).json()["results"] == []
    negative = client.post("/v1/rerank", json={"query": query, "documents": DOCUMENTS, "top_n": -1})
    _assert_error(negative, 422, "top_n: ", param="top_n")


def test_unknown_rerank_fields_are_ignored_but_logged(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    # A misspelt top_n changed the answer (every document came back) without a word anywhere.
    body = {"query": "q", "documents": DOCUMENTS, "top_k": 1, "return_document": True}
    with caplog.at_level(logging.WARNING, logger="genscore_core.protocol"):
        response = client.post("/v1/rerank", json=body)
    assert response.status_code == 200 and len(response.json()["results"]) == len(DOCUMENTS)
    warnings = [record.getMessage() for record in caplog.records if record.name == "genscore_core.protocol"]
    assert warnings == ["rerank request: ignored unknown field(s) return_document, top_k"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="genscore_core.protocol"):
        known = {"model": None, "query": "q", "documents": ["a"], "top_n": 1, "return_documents": True}
        assert client.post("/v1/rerank", json=known).status_code == 200
    assert not caplog.records


def test_unknown_generative_scoring_fields_are_ignored_but_logged(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    # A misspelt apply_softmax scored over the label tokens, not the vocabulary asked for, silently.
    misspelt = {**SEED_TEXT_REQUEST, "apply_sofmax": False}
    with caplog.at_level(logging.WARNING, logger="genscore_core.protocol"):
        response = client.post("/generative_scoring", json=misspelt)
    assert response.status_code == 200
    assert (
        response.json()["data"] == client.post("/generative_scoring", json=SEED_TEXT_REQUEST).json()["data"]
    )
    warnings = [record.getMessage() for record in caplog.records if record.name == "genscore_core.protocol"]
    assert warnings == ["generative scoring request: ignored unknown field(s) apply_sofmax"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="genscore_core.protocol"):
        assert client.post("/generative_scoring", json=SEED_TEXT_REQUEST).status_code == 200
    assert not caplog.records


def test_health_and_models(client: httpx.Client, scorer: GenerativeScorer) -> None:
    health = client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    head = client.head("/health")  # was 405
    assert head.status_code == 200 and head.content == b""
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == scorer.config.model and card["object"] == "model"
    assert card["max_model_len"] == scorer.max_length == 512
    stats = client.get("/stats").json()
    assert stats["requests"] >= 1 and stats["queued"] == 0


# -- failures inside the server ---------------------------------------------------------------------


class _BrokenBackend(ScoringBackend):
    def score_jobs(self, jobs: object, on_progress: object = None) -> list[list[float]]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_engine_failure_is_a_500_and_a_full_queue_a_503(scorer: GenerativeScorer) -> None:
    app = create_app(scorer, TEST_LIMITS)
    app.state.batcher.backend = _BrokenBackend()
    with serve_in_thread(app) as live, httpx.Client(base_url=live.url, timeout=60.0) as http:
        error = _assert_error(http.post("/generative_scoring", json=SEED_TOKEN_REQUEST), 500)
        assert error["type"] == "InternalServerError" and "CUDA" not in error["message"]
        assert http.get("/health").status_code == 200  # the server carries on
        app.state.batcher.max_queued = 0
        busy = http.post("/generative_scoring", json=SEED_TOKEN_REQUEST)
        assert _assert_error(busy, 503)["type"] == "ServiceUnavailableError"
        assert busy.headers["retry-after"] == "1"


class _OutOfMemoryBackend(ScoringBackend):
    def score_jobs(self, jobs: object, on_progress: object = None) -> list[list[float]]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB on /secret/path")


def test_an_unexpected_failure_names_its_kind_and_an_id_found_in_the_server_log(
    scorer: GenerativeScorer, caplog: pytest.LogCaptureFixture
) -> None:
    # The body said "internal server error; see the server log": nothing a client could act on or
    # an operator could find among other failures.
    app = create_app(scorer, TEST_LIMITS)
    app.state.batcher.backend = _OutOfMemoryBackend()
    with (
        caplog.at_level(logging.ERROR, logger="genscore_core.server.app"),
        serve_in_thread(app) as live,
        httpx.Client(base_url=live.url, timeout=60.0) as http,
    ):
        response = http.post("/v1/rerank", json={"query": "q", "documents": DOCUMENTS})
        error = _assert_error(response, 500, "internal server error: OutOfMemoryError (error id ")
        assert http.post("/v1/rerank", json={"query": "q", "documents": DOCUMENTS}).status_code == 500
    assert error["type"] == "InternalServerError"
    assert "secret" not in response.text and "Traceback" not in response.text
    error_id = error["message"].split("error id ")[1].split(";")[0]
    assert len(error_id) == 12
    logged = [record for record in caplog.records if error_id in record.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # its traceback, in the log only
    assert "POST /v1/rerank" in logged[0].getMessage()


# -- a client that leaves ---------------------------------------------------------------------------


def test_a_request_dropped_because_its_client_left_is_not_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tokenizer refuses a request whose client has gone (RequestAbandoned); that ordinary end used
    to be logged as "unexpected error" with a traceback, and a 500 was sent to nobody."""
    from genscore_core.request_life import AbandonStats, TokenizerLock
    from genscore_core.server.app import InternalErrorMiddleware
    from genscore_core.server.connections import AbandonedRequestMiddleware

    tokenizer = TokenizerLock()

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        # The client leaves, and the request reaches the tokenizer before its handler is cancelled.
        assert (await receive())["type"] == "http.disconnect"
        with tokenizer:
            raise AssertionError("an abandoned request was tokenized")

    stats = AbandonStats()
    app = AbandonedRequestMiddleware(InternalErrorMiddleware(handler), stats=stats)
    messages = iter([{"type": "http.request", "body": b"{}", "more_body": False}])
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/rerank", "headers": []}
    with caplog.at_level(logging.ERROR):
        asyncio.run(app(scope, receive, send))
    assert sent == []  # nobody to answer
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
    assert (stats.abandoned, stats.skipped, stats.in_flight) == (1, 1, 0)


def test_a_client_leaving_as_its_body_arrives_cancels_the_request_before_the_tokenizer(
    scorer: GenerativeScorer,
) -> None:
    """The watcher notices the disconnect and cancels the handler after the body's last bytes were
    received but before the handler resumed with them. asyncio.wait_for (the body deadline) swallowed
    that cancellation on Python < 3.12: the handler went on with the body as if nobody had cancelled it,
    and the tokenizer refused it with RequestAbandoned. Here the order is the event loop's own, not
    timing: the fake connection answers at once, so the watcher (waiting for the body since the first
    step) runs between the body arriving and the handler resuming, every time."""
    app = create_app(scorer, TEST_LIMITS)
    body = json.dumps({"query": "q", "documents": ["a", "b"]}).encode()
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})  # the client leaves after its body

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/rerank",
        "raw_path": b"/v1/rerank",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(app(scope, receive, send))
    stats = app.state.abandon_stats
    assert sent == []  # nobody to answer
    # Cancelled where it was, reading its body: it never reached the tokenizer to be refused there.
    assert (stats.abandoned, stats.skipped, stats.tokenized, stats.in_flight) == (1, 0, 0, 0)
