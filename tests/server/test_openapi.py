"""The OpenAPI document against what the server really answers, on real uvicorn servers on loopback.

Every error case is sent to every endpoint that can meet it; the status must be one the document
lists for that endpoint, the body must validate against the schema it lists for that status, and
each listed error status must be one the server was seen to answer.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from genscore_core.server.app import OPEN_PATHS
from tests.helpers.server import (
    SEED_TEXT_REQUEST,
    TEST_LIMITS,
    LiveServer,
    check_against_spec,
    serve_in_thread,
)

SCORING_PATHS = ["/generative_scoring", "/generative_score"]
RERANK_PATHS = ["/v1/rerank", "/v2/rerank", "/rerank"]
# The other servers' dialects (test_dialects.py): NIM's ranking and vLLM's score.
DIALECT_PATHS = ["/v1/ranking", "/score", "/v1/score"]
RERANK_REQUEST: dict[str, Any] = {"query": "capital of France", "documents": ["Paris is in France.", "Rome."]}
TOO_MANY = TEST_LIMITS.max_items_per_request + 1
# Per path: a good body, and one over --max-items (or, for the protocol, its own 400).
BODIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{path: (SEED_TEXT_REQUEST, {**SEED_TEXT_REQUEST, "items": []}) for path in SCORING_PATHS},
    **{path: (RERANK_REQUEST, {**RERANK_REQUEST, "documents": ["d"] * TOO_MANY}) for path in RERANK_PATHS},
    "/v1/ranking": (
        {"query": {"text": "capital of France"}, "passages": [{"text": "Paris."}, {"text": "Rome."}]},
        {"query": {"text": "capital of France"}, "passages": [{"text": "d"}] * TOO_MANY},
    ),
    **{
        path: (
            {"text_1": "capital of France", "text_2": ["Paris.", "Rome."]},
            {"text_1": "capital of France", "text_2": ["d"] * TOO_MANY},
        )
        for path in ("/score", "/v1/score")
    },
}


def _request(path: str) -> dict[str, Any]:
    return dict(BODIES[path][0])


def error_cases(path: str) -> dict[int, dict[str, Any]]:
    """One request per error status a POST endpoint can meet (keyword arguments of ``httpx.post``)."""
    good = _request(path)
    bad = BODIES[path][1]
    oversized = json.dumps({**good, "query": "x" * (TEST_LIMITS.max_body_bytes + 10)})
    return {
        400: {"json": bad},
        404: {"json": {**good, "model": "no-such-model"}},
        413: {"content": oversized, "headers": {"content-type": "application/json"}},
        422: {"content": b"{not json", "headers": {"content-type": "application/json"}},
    }


@pytest.fixture(scope="module")
def spec(live_server: LiveServer) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(f"{live_server.url}/openapi.json", timeout=30).json()
    return document


@pytest.mark.parametrize("path", SCORING_PATHS + RERANK_PATHS + DIALECT_PATHS)
def test_every_error_the_endpoint_answers_is_listed_with_its_real_body(
    spec: dict[str, Any], client: httpx.Client, path: str
) -> None:
    seen = set()
    for code, request in error_cases(path).items():
        response = client.post(path, **request)
        assert response.status_code == code, response.text
        check_against_spec(spec, "post", path, response)
        body = response.json()
        assert body["detail"] == body["error"]["message"] and body["error"]["code"] == code
        seen.add(code)
    ok = client.post(path, json=_request(path))
    assert ok.status_code == 200, ok.text
    check_against_spec(spec, "post", path, ok)
    listed = {int(code) for code in spec["paths"][path]["post"]["responses"]}
    # 503 and 500 are checked on servers of their own below, 408 in tests/robustness/test_server_resources.py;
    # nothing else may be listed (502 and 504 only by a server scoring through another, test_upstream_errors.py).
    assert listed == seen | {200, 408, 500, 503}


def test_a_full_queue_is_the_listed_503(scorer: GenerativeScorer) -> None:
    app = create_app(scorer, TEST_LIMITS)
    with serve_in_thread(app) as live, httpx.Client(base_url=live.url, timeout=60.0) as http:
        spec = http.get("/openapi.json").json()
        app.state.batcher.max_queued = 0
        for path in (SCORING_PATHS[0], RERANK_PATHS[0]):
            busy = http.post(path, json=_request(path))
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            check_against_spec(spec, "post", path, busy)
            assert "Retry-After" in spec["paths"][path]["post"]["responses"]["503"]["headers"]


def test_get_endpoints_answer_what_they_list(spec: dict[str, Any], client: httpx.Client) -> None:
    for path in ("/health", "/v1/models", "/stats"):
        response = client.get(path)
        assert response.status_code == 200
        check_against_spec(spec, "get", path, response)
    assert set(spec["paths"]["/health"]["get"]["responses"]) == {"200", "503"}
    # The validation error schema FastAPI would list by default is not what the server sends.
    assert "HTTPValidationError" not in spec["components"]["schemas"]


@pytest.mark.parametrize("path", SCORING_PATHS + RERANK_PATHS)
def test_an_unknown_model_is_404_with_error_and_detail(
    client: httpx.Client, scorer: GenerativeScorer, path: str
) -> None:
    response = client.post(path, json={**_request(path), "model": "no-such-model"})
    assert response.status_code == 404
    body = response.json()
    assert set(body) == {"error", "detail"}
    assert body["error"]["type"] == "NotFoundError" and body["error"]["code"] == 404
    assert body["error"]["message"].startswith("The model `no-such-model` does not exist")
    assert scorer.config.model in body["error"]["message"]  # names what is served
    assert body["detail"] == body["error"]["message"]
    # The served name, or no name, is answered.
    for named in ({"model": scorer.config.model}, {}):
        answer = client.post(path, json={**_request(path), **named})
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == scorer.config.model


def test_a_served_model_name_replaces_the_folder_name(scorer: GenerativeScorer) -> None:
    app = create_app(scorer, TEST_LIMITS, served_model_name="my-reranker")
    with serve_in_thread(app) as live, httpx.Client(base_url=live.url, timeout=60.0) as http:
        named = http.post("/v1/rerank", json={**RERANK_REQUEST, "model": "my-reranker"})
        assert named.status_code == 200 and named.json()["model"] == "my-reranker"
        folder = http.post("/v1/rerank", json={**RERANK_REQUEST, "model": scorer.config.model})
        assert folder.status_code == 404 and "`my-reranker`" in folder.json()["detail"]


def test_tei_bodies_on_rerank_answer_what_rerank_lists(spec: dict[str, Any], client: httpx.Client) -> None:
    good = {"query": "capital of France", "texts": ["Paris is in France.", "Rome."]}
    cases = {
        200: good,
        400: {**good, "truncation_direction": "Left"},
        422: {**good, "raw_scores": "yes"},
    }
    for code, body in cases.items():
        response = client.post("/rerank", json=body)
        assert response.status_code == code, response.text
        check_against_spec(spec, "post", "/rerank", response)


def test_every_route_lists_its_statuses(scorer: GenerativeScorer) -> None:
    """Walk the app's routes: each is in the document, each scoring route lists the errors every
    scoring route can answer, and on a server with an API key every route but the open ones lists 401."""
    app = create_app(scorer, TEST_LIMITS, api_key="secret-key")
    with serve_in_thread(app) as live:
        spec = httpx.get(f"{live.url}/openapi.json", timeout=30).json()
    routes = [route for route in app.routes if isinstance(route, APIRoute) and route.include_in_schema]
    assert {route.path for route in routes} == set(spec["paths"])
    posted = set()
    for route in routes:
        for method in route.methods:
            listed = {int(code) for code in spec["paths"][route.path][method.lower()]["responses"]}
            assert (401 in listed) == (route.path not in OPEN_PATHS), (method, route.path)
            if method == "POST":
                posted.add(route.path)
                assert listed == {200, 400, 401, 404, 408, 413, 422, 500, 503}, route.path
    assert posted == set(SCORING_PATHS + RERANK_PATHS + DIALECT_PATHS)
