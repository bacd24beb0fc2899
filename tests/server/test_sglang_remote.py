"""The SGLang flavour, against a small in-test server that implements SGLang's documented ``/v1/score``.

SGLang cannot run here. The stand-in follows SGLang's request (``query``, ``items`` as text or token
ids, ``label_token_ids``, ``apply_softmax`` defaulting to false, ``item_first``, ``model``) and response
(``{"scores": [[p(label) for each label], ...], "model", "usage", "object": "scoring"}``), and computes
the probabilities its own way: full-vocabulary logits of the transformers model at the last position,
as SGLang's tests do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from genscore_core import GenerativeScorer, InvalidRequestError, RemoteScoringError
from genscore_core.backend import ScoringJob
from tests.helpers.server import SEED_TEXT_REQUEST, SEED_TOKEN_REQUEST, LiveServer, serve_in_thread

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is in Paris. " * 60,
    "Lyon is known for its cuisine.",
]


class SGLangScoringRequest(BaseModel):
    """SGLang's ``ScoringRequest`` (every field optional, as there)."""

    query: str | list[int] | None = None
    items: str | list[str] | list[list[int]] | None = None
    label_token_ids: list[int] | None = None
    apply_softmax: bool = False
    item_first: bool = False
    model: str = "default"


def sglang_app(
    model: Any, tokenizer: Any, received: list[dict[str, Any]], *, honours_apply_softmax: bool = True
) -> FastAPI:
    """SGLang's ``/v1/score`` over ``model``; with ``honours_apply_softmax=False``, a server that
    ignores the switch and always answers whole-vocabulary probabilities."""
    app = FastAPI()

    def ids(value: str | list[int]) -> list[int]:
        return tokenizer.encode(value, add_special_tokens=False) if isinstance(value, str) else list(value)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {}

    @app.post("/v1/score", response_model=None)
    def score(request: SGLangScoringRequest) -> dict[str, Any] | JSONResponse:
        received.append(request.model_dump(exclude_unset=True))
        if not request.label_token_ids or request.query is None or request.items is None:
            message = "query, items and label_token_ids are required"
            body = {
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return JSONResponse(body, status_code=400)
        items = [request.items] if isinstance(request.items, str) else request.items
        query = ids(request.query)
        rows, prompt_tokens = [], 0
        for item in items:
            prompt = ids(item) + query if request.item_first else query + ids(item)
            prompt_tokens += len(prompt)
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
            labels = torch.tensor(request.label_token_ids)
            if request.apply_softmax and honours_apply_softmax:
                probs = torch.softmax(logits[labels], dim=-1)
            else:
                probs = torch.softmax(logits, dim=-1)[labels]
            rows.append(probs.tolist())
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0}
        return {"scores": rows, "model": request.model, "usage": usage, "object": "scoring"}

    return app


@pytest.fixture(scope="module")
def sglang(scorer: GenerativeScorer) -> Iterator[tuple[LiveServer, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    with serve_in_thread(sglang_app(scorer.model, scorer.tokenizer, received)) as live:
        yield live, received


@pytest.fixture(scope="module")
def remote(tiny_model_dir: Path, sglang: tuple[LiveServer, list[dict[str, Any]]]) -> GenerativeScorer:
    return GenerativeScorer(
        str(tiny_model_dir), server_url=sglang[0].url, server_kind="sglang", max_length=512
    )


def test_rerank_through_sglang_equals_local(
    remote: GenerativeScorer, scorer: GenerativeScorer, sglang: tuple[LiveServer, list[dict[str, Any]]]
) -> None:
    got, want = remote.rerank(QUERY, DOCUMENTS), scorer.rerank(QUERY, DOCUMENTS)
    assert [r.index for r in got] == [r.index for r in want]
    assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=1e-5)
    assert [(r.truncated, r.prompt_tokens) for r in got] == [(r.truncated, r.prompt_tokens) for r in want]
    sent = sglang[1][-1]
    # Token ids, the shared prefix as the query, and apply_softmax always explicit (SGLang's default is false).
    assert set(sent) == {"query", "items", "label_token_ids", "apply_softmax", "item_first"}
    assert sent["apply_softmax"] is True and sent["item_first"] is False
    assert sent["label_token_ids"] == scorer.label_token_ids and len(sent["items"]) == len(DOCUMENTS)
    assert all(isinstance(token, int) for token in sent["query"])


def test_protocol_requests_through_sglang_equal_local(
    remote: GenerativeScorer, scorer: GenerativeScorer
) -> None:
    for request in (
        SEED_TEXT_REQUEST,
        SEED_TOKEN_REQUEST,
        {**SEED_TEXT_REQUEST, "apply_softmax": False},  # the true full-vocabulary probability
        {**SEED_TEXT_REQUEST, "item_first": True},
        {**SEED_TEXT_REQUEST, "label_token_ids": [9454, 2753, 9693]},
    ):
        got = [d.score for d in remote.score(request).data]
        assert got == pytest.approx([d.score for d in scorer.score(request).data], abs=1e-5), request


async def test_async_through_sglang(remote: GenerativeScorer, scorer: GenerativeScorer) -> None:
    got = await remote.arerank(QUERY, DOCUMENTS, top_n=2)
    want = scorer.rerank(QUERY, DOCUMENTS, top_n=2)
    assert [r.index for r in got] == [r.index for r in want]
    assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=1e-5)


def test_sglang_errors_raise_invalid_request(remote: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError, match="HTTP 400: query, items and label_token_ids are required"):
        remote.backend.score_jobs([ScoringJob([[1, 2, 3]], [])])


def test_a_server_that_ignores_apply_softmax_is_refused(
    tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    # Its label probabilities are over the whole vocabulary, so the scores would be silently lower
    # than the normalised ones asked for: the rows not summing to 1 give it away.
    app = sglang_app(scorer.model, scorer.tokenizer, [], honours_apply_softmax=False)
    with serve_in_thread(app) as live:
        remote = GenerativeScorer(
            str(tiny_model_dir), server_url=live.url, server_kind="sglang", max_length=512
        )
        with remote:
            with pytest.raises(RemoteScoringError) as caught:
                remote.rerank(QUERY, DOCUMENTS)
            message = str(caught.value)
            assert f"{live.url}/v1/score answered a malformed score row (item 0: score row [" in message
            assert "not 1, though apply_softmax was asked" in message
            # Whole-vocabulary probabilities asked for are what it answers: those pass.
            request = {**SEED_TEXT_REQUEST, "apply_softmax": False}
            got = [d.score for d in remote.score(request).data]
        assert got == pytest.approx([d.score for d in scorer.score(request).data], abs=1e-5)
