"""A request's own instruction on every rerank and scoring route of a real server on loopback: its
scores are those of a scorer built with that instruction; the server-wide ``--instruction`` is the
default; a template without an instruction slot refuses it with a 400 naming ``instruction``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from genscore_core.templates import QWEN3_RERANKER, PromptTemplate
from tests.helpers.server import TEST_LIMITS, serve_in_thread

QUERY = "What is the capital of France?"
TEXTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]
ASKED = "Judge whether the document names a city"
SERVER_WIDE = "Given a question, find passages about geography"

# Each route's body for (query, texts, extra fields), and how to read {index: score} off its answer.
Route = tuple[str, Callable[[dict[str, Any]], dict[str, Any]], Callable[[Any], dict[int, float]]]
ROUTES: list[Route] = [
    (
        "/v1/rerank",
        lambda extra: {"query": QUERY, "documents": TEXTS, **extra},
        lambda body: {r["index"]: r["relevance_score"] for r in body["results"]},
    ),
    (
        "/rerank",
        lambda extra: {"query": QUERY, "texts": TEXTS, **extra},
        lambda body: {r["index"]: r["score"] for r in body},
    ),
    (
        "/v1/ranking",
        lambda extra: {"query": {"text": QUERY}, "passages": [{"text": t} for t in TEXTS], **extra},
        # NIM answers logits: back to probabilities to compare with the reference.
        lambda body: {r["index"]: 1.0 / (1.0 + math.exp(-r["logit"])) for r in body["rankings"]},
    ),
    (
        "/v1/score",
        lambda extra: {"text_1": QUERY, "text_2": TEXTS, **extra},
        lambda body: {d["index"]: d["score"] for d in body["data"]},
    ),
]


def _built(scorer: GenerativeScorer, **settings: Any) -> GenerativeScorer:
    """A scorer of its own settings on the session scorer's model (loaded once: loading takes seconds)."""
    tokenizer = scorer.front_end.tokenizer
    return GenerativeScorer.from_model(
        scorer.model, tokenizer, model=scorer.config.model, max_length=512, **settings
    )


def _reference(scorer: GenerativeScorer, **settings: Any) -> dict[int, float]:
    return {r.index: r.score for r in _built(scorer, **settings).rerank(QUERY, TEXTS)}


def test_a_request_s_instruction_scores_as_a_scorer_built_with_it(scorer: GenerativeScorer) -> None:
    asked = _reference(scorer, instruction=ASKED)
    server_wide = _reference(scorer, instruction=SERVER_WIDE)
    assert max(abs(asked[i] - server_wide[i]) for i in asked) > 1e-4  # the instruction matters
    instructed = _built(scorer, instruction=SERVER_WIDE)
    with (
        serve_in_thread(create_app(instructed, TEST_LIMITS)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        for path, body, read in ROUTES:
            default = http.post(path, json=body({}))
            assert default.status_code == 200, default.text
            assert read(default.json()) == pytest.approx(server_wide, abs=1e-6), path
            for field in ("instruction", "instruct"):  # SGLang's name too
                own = http.post(path, json=body({field: ASKED}))
                assert own.status_code == 200, own.text
                assert read(own.json()) == pytest.approx(asked, abs=1e-6), (path, field)
            both = http.post(path, json=body({"instruction": ASKED, "instruct": ASKED}))
            assert both.status_code == 400 and both.json()["error"]["param"] == "instruct"


def test_a_template_without_an_instruction_slot_refuses_one(scorer: GenerativeScorer) -> None:
    fields = QWEN3_RERANKER.model_dump()
    fields.update(name="no-slot", body="<Query>: {query}\n<Document>: {document}", default_instruction=None)
    no_slot = PromptTemplate(**fields)
    plain = _built(scorer, template=no_slot)
    with (
        serve_in_thread(create_app(plain, TEST_LIMITS)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        for path, body, _ in ROUTES:
            refused = http.post(path, json=body({"instruction": ASKED}))
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (
                error["param"] == "instruction" and "'no-slot' has no {instruction} slot" in error["message"]
            )
            assert http.post(path, json=body({})).status_code == 200


def test_the_generative_scoring_protocol_refuses_an_instruction(client: httpx.Client) -> None:
    # Its prompts are raw (query and item as sent): scoring them without the instruction asked for
    # would answer other scores than the client meant, without a word.
    body = {"query": QUERY, "items": TEXTS, "label_token_ids": [9454, 2753]}
    assert client.post("/generative_scoring", json=body).status_code == 200
    for field in ("instruction", "instruct"):
        refused = client.post("/generative_scoring", json={**body, field: ASKED})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
