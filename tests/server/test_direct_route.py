"""``/v1/rerank`` and ``/v2/rerank`` answered without FastAPI's routing (genscore_core.server.direct_route).

The reference is FastAPI's own answer: ``/rerank`` runs the same endpoint (Cohere's dialect, API
version 1) through FastAPI, so a body answered directly on ``/v1/rerank`` must come back as ``/rerank``
answers it, errors included; a body the direct route does not take must reach FastAPI whole.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.server import CAPITAL_DOCUMENTS, CAPITAL_QUERY, LiveServer


def _answered(live: LiveServer) -> int:
    return int(live.app.state.direct_routes.answered)


def _without_id(answer: httpx.Response) -> Any:
    body = answer.json()
    if isinstance(body, dict):
        body.pop("id", None)  # a fresh id for every answer
    return body


@pytest.mark.parametrize(
    "body",
    [
        {"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS},
        {"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS, "top_n": 2, "return_documents": True},
        {
            "query": CAPITAL_QUERY,
            "documents": [{"text": d} for d in CAPITAL_DOCUMENTS],
            "score_threshold": 0.0,
        },
    ],
    ids=["plain", "top_n-with-documents", "document-objects"],
)
def test_a_direct_answer_is_fastapis_answer(live_server: LiveServer, client: httpx.Client, body: Any) -> None:
    before = _answered(live_server)
    direct = client.post("/v1/rerank", json=body)
    assert _answered(live_server) == before + 1, "not answered by the direct route"
    through_fastapi = client.post("/rerank", json=body)
    assert _answered(live_server) == before + 1, "/rerank is FastAPI's"
    assert direct.status_code == through_fastapi.status_code == 200
    assert direct.headers["content-type"] == through_fastapi.headers["content-type"]
    assert _without_id(direct) == _without_id(through_fastapi)
    assert direct.json()["id"] != through_fastapi.json()["id"]


def test_version_2_says_so(live_server: LiveServer, client: httpx.Client) -> None:
    before = _answered(live_server)
    answer = client.post("/v2/rerank", json={"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS})
    assert _answered(live_server) == before + 1
    assert answer.status_code == 200
    assert answer.json()["meta"]["api_version"]["version"] == "2"
    assert (
        answer.json()["results"][0]["index"]
        == client.post("/rerank", json={"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS}).json()[
            "results"
        ][0]["index"]
    )


@pytest.mark.parametrize(
    "body",
    [
        {"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS, "model": "not-this-server"},
        {"query": CAPITAL_QUERY, "documents": ["x"] * 65},  # over the test limits' 64 items
        {"query": CAPITAL_QUERY, "documents": CAPITAL_DOCUMENTS, "max_tokens_per_doc": 0},
    ],
    ids=["unknown-model", "too-many-documents", "no-tokens-per-document"],
)
def test_an_error_of_the_endpoint_is_answered_by_the_apps_handler(
    live_server: LiveServer, client: httpx.Client, body: Any
) -> None:
    through_fastapi = client.post("/rerank", json=body)
    assert through_fastapi.status_code >= 400
    before = _answered(live_server)
    direct = client.post("/v1/rerank", json=body)
    assert (direct.status_code, direct.json()) == (through_fastapi.status_code, through_fastapi.json())
    if _answered(live_server) == before:  # refused by validation: FastAPI's, as before
        return
    assert _answered(live_server) == before + 1


@pytest.mark.parametrize(
    ("content", "content_type", "named"),
    [
        (b'{"query": "q", "documents": ["a"], "documents": ["b"]}', "application/json", '"documents"'),
        (b'{"query": "q", "documents": [NaN]}', "application/json", "documents.0"),
        (b'{"documents": ["a"]}', "application/json", "query"),
        (b'{"query": "q", "documents": ["a"]', "application/json", "JSON"),
        (b'{"query": "q", "documents": ["a"]}', "text/plain", "Content-Type"),
    ],
    ids=["repeated-key", "nan", "missing-query", "cut-off", "not-json-content-type"],
)
def test_a_body_it_does_not_take_reaches_fastapi_whole(
    live_server: LiveServer, client: httpx.Client, content: bytes, content_type: str, named: str
) -> None:
    before = _answered(live_server)
    refused = client.post("/v1/rerank", content=content, headers={"content-type": content_type})
    assert _answered(live_server) == before
    assert refused.status_code == 422, refused.text
    assert named in refused.json()["error"]["message"]


def test_other_methods_and_paths_are_fastapis(live_server: LiveServer, client: httpx.Client) -> None:
    before = _answered(live_server)
    assert client.get("/v1/rerank").status_code == 405
    assert client.post("/v1/rerank/", json={"query": "q", "documents": ["a"]}).status_code in (307, 404)
    assert _answered(live_server) == before
