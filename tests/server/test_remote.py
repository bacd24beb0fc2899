"""Scoring through a server: the remote scorer and adapters against a live ``genscore serve``, and the
HTTP client's retries, timeouts and errors against scripted transports."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from genscore_core import (
    GenerativeScorer,
    InvalidRequestError,
    RemoteConfigurationError,
    RemoteScoringError,
    ScoringJob,
)
from genscore_core.remote.client import REQUEST_TOKEN_BUDGET, request_spans
from genscore_core.remote.generative import GenerativeScoringClient
from genscore_core.remote.transport import IDLE_CONNECTION_EXPIRY_S, HttpTransport
from genscore_core.server import ServerLimits, create_app
from tests.helpers.server import (
    SEED_TEXT_REQUEST,
    SEED_TOKEN_REQUEST,
    TEST_LIMITS,
    LiveServer,
    free_port,
    serve_in_thread,
)

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is in Paris. " * 60,  # longer than max_length: truncated on the client
    "Lyon is known for its cuisine.",
    "France borders Spain, Italy and Germany.",
]


@pytest.fixture(scope="module", params=["genscore", "vllm"])
def remote(
    request: pytest.FixtureRequest, tiny_model_dir: Path, live_server: LiveServer
) -> Iterator[GenerativeScorer]:
    """A scorer on the tiny model's tokenizer that scores through the live server."""
    scorer = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, server_kind=request.param, max_length=512
    )
    yield scorer
    scorer.close()


def _ranked(results: object) -> list[tuple[int, float, bool, int]]:
    return [(r.index, r.score, r.truncated, r.prompt_tokens) for r in results]  # type: ignore[attr-defined]


# -- remote equals local ----------------------------------------------------------------------------


def test_remote_rerank_and_score_equal_local(remote: GenerativeScorer, scorer: GenerativeScorer) -> None:
    assert _ranked(remote.rerank(QUERY, DOCUMENTS)) == _ranked(scorer.rerank(QUERY, DOCUMENTS))
    assert any(r.truncated for r in remote.rerank(QUERY, DOCUMENTS))
    top = remote.rerank(QUERY, DOCUMENTS, top_n=2, score_threshold=0.01)
    assert _ranked(top) == _ranked(scorer.rerank(QUERY, DOCUMENTS, top_n=2, score_threshold=0.01))
    for request in (
        SEED_TEXT_REQUEST,
        SEED_TOKEN_REQUEST,
        {**SEED_TEXT_REQUEST, "apply_softmax": False},
        {**SEED_TEXT_REQUEST, "item_first": True},
        {**SEED_TEXT_REQUEST, "label_token_ids": [9454, 2753, 9693]},
    ):
        got, want = remote.score(request), scorer.score(request)
        assert [d.score for d in got.data] == [d.score for d in want.data], request
        assert got.usage == want.usage and got.model == want.model


def test_remote_pairs_with_several_queries(remote: GenerativeScorer, scorer: GenerativeScorer) -> None:
    pairs = [(QUERY, DOCUMENTS[0]), ("German capital", DOCUMENTS[1]), (QUERY, DOCUMENTS[3])]
    # Two queries make two jobs, sent in parallel; the server may batch them together (float32 rounding).
    assert remote.score_pairs(pairs) == pytest.approx(scorer.score_pairs(pairs), abs=1e-5)
    assert remote.score_pairs([]) == [] and remote.rerank(QUERY, []).results == []


async def test_remote_async_equals_local(remote: GenerativeScorer, scorer: GenerativeScorer) -> None:
    assert _ranked(await remote.arerank(QUERY, DOCUMENTS, top_n=3)) == _ranked(
        scorer.rerank(QUERY, DOCUMENTS, top_n=3)
    )
    got = await remote.ascore(SEED_TOKEN_REQUEST)
    assert [d.score for d in got.data] == [d.score for d in scorer.score(SEED_TOKEN_REQUEST).data]
    pairs = [(QUERY, d) for d in DOCUMENTS]
    assert await remote.ascore_pairs(pairs) == pytest.approx(scorer.score_pairs(pairs), abs=1e-5)


def test_big_jobs_are_split_into_several_requests(
    tiny_model_dir: Path, live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    with_small_requests = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, server_batch_size=2
    )
    ranked = with_small_requests.rerank(QUERY, DOCUMENTS)
    expected = {r.index: r.score for r in scorer.rerank(QUERY, DOCUMENTS)}
    assert {r.index: r.score for r in ranked} == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["genscore", "rerank"])
def test_a_job_over_the_servers_default_token_limit_is_split(
    tiny_model_dir: Path, scorer: GenerativeScorer, kind: str
) -> None:
    # Both sides at their defaults but the item cap (the server's 1,024): 600 documents cut to
    # 512-token prompts make 307,200 prompt tokens, past the 262,144 the server takes in one request.
    limits = ServerLimits()
    assert limits.max_prompt_tokens_per_request == REQUEST_TOKEN_BUDGET
    documents = [f"{i} " + "word " * 460 for i in range(600)]
    with serve_in_thread(create_app(scorer, limits)) as live:
        remote = GenerativeScorer(
            str(tiny_model_dir),
            server_url=live.url,
            server_kind=kind,
            max_length=512,
            server_batch_size=limits.max_items_per_request,
        )
        with remote:
            got = remote.score_pairs([(QUERY, d) for d in documents])
    assert got == pytest.approx(scorer.score_pairs([(QUERY, d) for d in documents]), abs=1e-5)


def test_request_spans_keep_order_and_both_caps() -> None:
    lengths = [5, 5, 5, 20, 1, 1, 1, 1]
    assert request_spans(lengths, max_items=3, max_tokens=12) == [(0, 2), (2, 3), (3, 4), (4, 7), (7, 8)]
    assert request_spans([], max_items=3, max_tokens=12) == []


def test_rerank_kind_sends_text(
    tiny_model_dir: Path, live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, server_kind="rerank", max_length=512
    )
    # The server applies the same template and max_length as the local scorer: the same scores.
    assert _ranked(remote.rerank(QUERY, DOCUMENTS)) == _ranked(scorer.rerank(QUERY, DOCUMENTS))
    assert remote.score_pairs([(QUERY, DOCUMENTS[0])]) == scorer.score_pairs([(QUERY, DOCUMENTS[0])])
    with pytest.raises(InvalidRequestError, match="server_kind='rerank'"):
        remote.score(SEED_TEXT_REQUEST)


async def test_rerank_kind_async(
    tiny_model_dir: Path, live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, server_kind="rerank", max_length=512
    )
    assert _ranked(await remote.arerank(QUERY, DOCUMENTS)) == _ranked(scorer.rerank(QUERY, DOCUMENTS))


def test_remote_scorer_describes_itself(remote: GenerativeScorer, live_server: LiveServer) -> None:
    assert live_server.url in repr(remote) and not hasattr(remote, "model")
    with pytest.raises(AttributeError, match="weights stay on the server"):
        _ = remote.model
    with pytest.raises(AttributeError, match="not a local engine"):
        _ = remote.engine


# -- errors from the server and the network ---------------------------------------------------------


def test_server_4xx_raises_invalid_request_with_its_message(
    tiny_model_dir: Path, live_server: LiveServer
) -> None:
    too_big = TEST_LIMITS.max_items_per_request + 1
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, server_batch_size=500
    )
    with pytest.raises(InvalidRequestError, match=f"HTTP 400: items has {too_big} entries"):
        remote.rerank(QUERY, ["document"] * too_big)


def test_unreachable_server_fails_after_bounded_retries(tiny_model_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    remote = GenerativeScorer(str(tiny_model_dir), server_url=dead, max_length=512, server_max_retries=1)
    with pytest.raises(RemoteScoringError, match="failed after 2 attempts: ConnectError") as raised:
        remote.rerank(QUERY, DOCUMENTS[:1])
    assert raised.value.status is None


Handler = Callable[[httpx.Request], httpx.Response]


def scripted(*steps: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    """A transport handler answering with ``steps`` in turn (the last one repeats)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        step = steps[min(len(seen), len(steps) - 1)]
        seen.append(request)
        if isinstance(step, Exception):
            raise step
        return step

    return handle, seen


def _ok(count: int) -> httpx.Response:
    data = [{"index": i, "object": "score", "score": 0.25 * i} for i in range(count)]
    return httpx.Response(200, json={"object": "list", "data": data})


JOB = ScoringJob([[1, 2, 3], [1, 2, 4]], [9693, 2152])


def _client(handle: Handler, **options: object) -> GenerativeScoringClient:
    http = HttpTransport(
        "http://scoring.test",
        backoff=0.001,
        transport=httpx.MockTransport(handle),
        async_transport=httpx.MockTransport(handle),
        **options,  # type: ignore[arg-type]
    )
    return GenerativeScoringClient(http)


def test_retries_connection_errors_timeouts_and_5xx_then_succeeds() -> None:
    handle, seen = scripted(
        httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.Response(503, json={}), _ok(2)
    )
    client = _client(handle, max_retries=3, api_key="secret")
    assert client.score_jobs([JOB]) == [[0.0, 0.25]]
    assert len(seen) == 4
    sent = seen[-1]
    assert sent.url.path == "/generative_scoring" and sent.headers["authorization"] == "Bearer secret"
    assert json.loads(sent.content) == {
        "query": [1, 2], "items": [[3], [4]], "label_token_ids": [9693, 2152], "apply_softmax": True,
    }  # fmt: skip


async def test_async_retries_then_succeeds() -> None:
    handle, seen = scripted(httpx.ConnectError("refused"), httpx.Response(502, text="bad gateway"), _ok(2))
    assert await _client(handle, max_retries=2).ascore_jobs([JOB]) == [[0.0, 0.25]]
    assert len(seen) == 3


def test_gives_up_after_max_retries_with_the_last_status() -> None:
    handle, seen = scripted(httpx.Response(500, json={"error": {"message": "engine died"}}))
    with pytest.raises(RemoteScoringError, match="failed after 3 attempts: HTTP 500: engine died") as raised:
        _client(handle, max_retries=2).score_jobs([JOB])
    assert raised.value.status == 500 and len(seen) == 3


def test_4xx_is_not_retried() -> None:
    body = {"error": {"message": "items must contain at least one item.", "type": "BadRequestError"}}
    handle, seen = scripted(httpx.Response(400, json=body))
    with pytest.raises(InvalidRequestError, match=r"items must contain at least one item\."):
        _client(handle, max_retries=3).score_jobs([JOB])
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("status", "hint"), [(401, "server_api_key"), (403, "server_api_key"), (404, "server_url")]
)
def test_auth_and_not_found_are_configuration_errors_naming_the_url(status: int, hint: str) -> None:
    handle, seen = scripted(httpx.Response(status, json={"error": {"message": "nope"}}))
    with pytest.raises(RemoteConfigurationError, match=hint) as raised:
        _client(handle, max_retries=3).score_jobs([JOB])
    error = raised.value
    assert not isinstance(error, InvalidRequestError) and len(seen) == 1
    assert error.url == "http://scoring.test/generative_scoring" and error.status == status
    assert f"http://scoring.test/generative_scoring answered HTTP {status}: nope" in str(error)


def test_a_server_without_the_endpoint_is_a_configuration_error(
    tiny_model_dir: Path, live_server: LiveServer
) -> None:
    # genscore serve has no /v1/score: pointing server_kind="sglang" at it is a setting to fix.
    wrong_kind = GenerativeScorer.from_server(
        live_server.url, str(tiny_model_dir), server_kind="sglang", max_length=512
    )
    with pytest.raises(
        RemoteConfigurationError, match=f"{live_server.url}/v1/score answered HTTP 404"
    ) as raised:
        wrong_kind.rerank(QUERY, DOCUMENTS[:1])
    assert raised.value.url == f"{live_server.url}/v1/score"


def test_malformed_answers_raise() -> None:
    handle, _ = scripted(_ok(1))  # one score for two items
    with pytest.raises(RemoteScoringError, match="1 scores for 2 items"):
        _client(handle).score_jobs([JOB])
    handle, _ = scripted(httpx.Response(200, text="<html>"))
    with pytest.raises(RemoteScoringError, match="not JSON"):
        _client(handle).score_jobs([JOB])


def test_timeout_setting_reaches_the_client(tiny_model_dir: Path, live_server: LiveServer) -> None:
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, server_timeout=3.5
    )
    assert remote.backend.http._client.timeout.read == 3.5  # type: ignore[attr-defined]


def test_idle_connections_are_dropped_before_the_servers_keep_alive_ends() -> None:
    """The client, not the server, closes an idle connection: reused while fresh, a new one after
    the client's idle expiry, which is under the 5 s keep-alive vLLM and SGLang keep from uvicorn."""
    app = FastAPI()
    app.get("/health")(lambda: {})

    @app.api_route("/port", methods=["GET", "POST"])
    def port(request: Request) -> dict[str, int]:
        assert request.client is not None
        return {"port": request.client.port}  # one per connection

    async def ports(http: HttpTransport) -> list[int]:
        first = (await http.apost_json("/port", {}))["port"]
        again = (await http.apost_json("/port", {}))["port"]
        await asyncio.sleep(0.6)
        return [first, again, (await http.apost_json("/port", {}))["port"]]

    assert IDLE_CONNECTION_EXPIRY_S < uvicorn.Config(app).timeout_keep_alive
    with serve_in_thread(app) as live:  # uvicorn's default keep-alive, as vLLM's and SGLang's
        http = HttpTransport(live.url, idle_expiry=0.3)
        first = http.get_json("/port")["port"]
        assert http.get_json("/port")["port"] == first
        time.sleep(0.6)
        assert http.get_json("/port")["port"] != first
        first, again, later = asyncio.run(ports(http))
        assert again == first and later != first


def test_server_url_must_be_http(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="server_url must start with http"):
        GenerativeScorer(str(tiny_model_dir), server_url="127.0.0.1:8000")
