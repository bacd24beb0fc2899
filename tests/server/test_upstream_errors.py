"""Known failures reach a server's clients as themselves: a failing upstream (``genscore serve
--server-url``) is a 502 or 504 with its message, a NaN the model produced a 500 naming the prompt."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.helpers.server import TEST_LIMITS, check_against_spec, serve_in_thread

TEXT_REQUEST = {"query": "capital of France", "items": ["Paris", "Berlin"], "label_token_ids": [9693, 2152]}
RERANK_REQUEST = {"query": "capital of France", "documents": ["Paris", "Berlin"]}


class Upstream:
    mode = "ok"
    """``ok``, ``401``, ``nan`` (item 1's score), ``fewer`` (one score short) or ``hang`` (3 s)."""


def upstream_app(upstream: Upstream) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/generative_scoring")
    async def generative(request: Request) -> Response:
        count = len((await request.json())["items"])
        if upstream.mode == "401":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        if upstream.mode == "hang":
            await asyncio.sleep(3.0)
        scores = ["0.5"] * (count - 1 if upstream.mode == "fewer" else count)
        if upstream.mode == "nan":
            scores[1] = "NaN"
        data = ", ".join(f'{{"index": {i}, "score": {score}}}' for i, score in enumerate(scores))
        return Response(f'{{"data": [{data}]}}', media_type="application/json")

    return app


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream()


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, upstream: Upstream) -> Iterator[tuple[str, str]]:
    """A server scoring through a scripted upstream; ``(proxy url, upstream url)``."""
    with serve_in_thread(upstream_app(upstream)) as far:
        remote = GenerativeScorer(
            str(tiny_model_dir),
            server_url=far.url,
            server_max_retries=0,
            server_timeout=1.0,
            max_length=512,
        )
        with serve_in_thread(create_app(remote, TEST_LIMITS)) as near:
            yield near.url, far.url
        remote.close()


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = httpx.post(f"{url}{path}", json=body, timeout=60)
    # The document lists the status, with the body answered as its schema.
    check_against_spec(httpx.get(f"{url}/openapi.json", timeout=60).json(), "post", path, answer)
    return answer.status_code, answer.json()


@pytest.mark.parametrize(
    ("mode", "status", "says"),
    [
        ("401", 502, "answered HTTP 401: invalid api key (check server_api_key)"),
        ("nan", 502, "item 1: score nan is not a probability"),
        ("fewer", 502, "answered 1 scores for 2 items"),
        ("hang", 504, "the 1 s timeout"),
    ],
)
def test_a_failing_upstream_is_a_gateway_error_with_its_message(
    proxy: tuple[str, str], upstream: Upstream, mode: str, status: int, says: str
) -> None:
    near, far = proxy
    upstream.mode = mode
    try:
        for path, body in (("/generative_scoring", TEXT_REQUEST), ("/v1/rerank", RERANK_REQUEST)):
            code, answer = _post(near, path, body)
            assert code == status
            assert answer["error"]["code"] == status and answer["detail"] == answer["error"]["message"]
            assert f"{far}/generative_scoring" in answer["detail"] and says in answer["detail"]
    finally:
        upstream.mode = "ok"
    assert _post(near, "/v1/rerank", RERANK_REQUEST)[0] == 200


@pytest.fixture(scope="module")
def nan_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with the embeddings of token 100 and of " zebra" made NaN: any prompt holding
    either scores NaN."""
    out = tmp_path_factory.mktemp("tiny-nan") / "model"
    shutil.copytree(tiny_model_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    embeddings = weights["model.embed_tokens.weight"].clone()
    embeddings[100] = float("nan")
    embeddings[AutoTokenizer.from_pretrained(str(out)).encode(" zebra", add_special_tokens=False)] = float(
        "nan"
    )
    weights["model.embed_tokens.weight"] = embeddings
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_a_nan_score_is_a_500_naming_the_prompt(nan_model_dir: Path) -> None:
    scorer = GenerativeScorer(str(nan_model_dir), device="cpu", dtype="float32", max_length=512)
    request = {"query": [1, 2, 3], "items": [[5], [100, 7]], "label_token_ids": [9693, 2152]}
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        code, answer = _post(live.url, "/generative_scoring", request)
        assert code == 500
        assert answer["error"]["type"] == "InternalServerError"
        # The engine knows it as prompt 1 of job 0 of its call; the client is told which item.
        assert answer["detail"].startswith("items[1] scored nan"), answer
        assert answer["error"]["param"] == "items.1"
        good = {**request, "items": [[5], [6, 7]]}
        code, answer = _post(live.url, "/generative_scoring", good)
        assert code == 200 and all(0.0 <= entry["score"] <= 1.0 for entry in answer["data"])
        # Text through /v1/rerank: the document, as the library names it.
        rerank = {"query": "which animal", "documents": ["a cat", "a dog", "a zebra", "a cow"]}
        code, answer = _post(live.url, "/v1/rerank", rerank)
        assert code == 500
        assert answer["detail"].startswith("documents[2] scored nan"), answer
        assert answer["error"]["param"] == "documents.2"
