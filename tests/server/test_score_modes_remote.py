"""Score modes through ``genscore serve`` and the remote clients: the token protocols return
probabilities, so the logit modes are refused before any request; ``/v1/rerank`` answers in the
server's own mode, thresholds included, and a client is held to the range of its own mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM

from genscore_core import (
    ConfigurationError,
    GenerativeScorer,
    InvalidRequestError,
    PromptTemplate,
    RemoteScoringError,
)
from genscore_core.server import create_app
from genscore_core.templates import TEMPLATES
from tests.helpers.reference_recipe import reference_yes_logits
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread

QUERY = "capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Thames flows through London.",
    "x",
]


def test_servers_are_not_asked_for_logits(tiny_model_dir: Path, live_server: LiveServer) -> None:
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, score_mode="logit"
    )
    with pytest.raises(InvalidRequestError, match="returns probabilities only") as caught:
        remote.rerank("q", ["d"])
    assert caught.value.param == "score_mode"
    remote.close()


def test_a_single_label_model_is_pointed_at_what_serves_it(
    tiny_model_dir: Path, live_server: LiveServer
) -> None:
    """A one-label template (bge-reranker-v2-gemma's) scores logit-sigmoid by default; label-softmax
    is refused for it, so the refusal must not send its user there."""
    one_label = PromptTemplate(
        **{**TEMPLATES["qwen3-reranker"].model_dump(), "label_words": ("yes",), "score_mode": "logit-sigmoid"}
    )
    with GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, template=one_label
    ) as remote:
        assert remote.score_mode == "logit-sigmoid"
        with pytest.raises(InvalidRequestError) as caught:
            remote.rerank("q", ["d"])
    message = str(caught.value)
    assert "'label-softmax'" not in message and "'vocab-softmax'" in message
    assert "server_kind='rerank'" in message


@pytest.fixture(scope="module")
def logit_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    """``genscore serve --score-mode logit`` on the session's tiny model."""
    logit = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, score_mode="logit")
    with serve_in_thread(create_app(logit, TEST_LIMITS)) as live:
        yield live


@pytest.fixture(scope="module")
def expected_logits(scorer: GenerativeScorer, tiny_model_dir: Path) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return reference_yes_logits(model, scorer.tokenizer, QUERY, DOCUMENTS)


def _rerank(url: str, **options: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, **options}, timeout=60
    )


def test_a_logit_server_filters_by_logits(logit_server: LiveServer, expected_logits: list[float]) -> None:
    """A logit threshold below 0 or above 1 is a logit-mode server's to apply, not a 422."""
    assert min(expected_logits) < 0.0
    ordered = sorted(range(len(DOCUMENTS)), key=lambda i: -expected_logits[i])
    threshold = (expected_logits[ordered[1]] + expected_logits[ordered[2]]) / 2
    answer = _rerank(logit_server.url, score_threshold=threshold)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == ordered[:2]
    assert [r["relevance_score"] for r in results] == pytest.approx(
        [expected_logits[i] for i in ordered[:2]], abs=1e-5
    )
    above = _rerank(logit_server.url, score_threshold=max(expected_logits) + 2.0)
    assert above.status_code == 200 and above.json()["results"] == []
    below = _rerank(logit_server.url, score_threshold=min(expected_logits) - 40.0, top_n=3)
    assert [r["index"] for r in below.json()["results"]] == ordered[:3]


def test_the_openapi_schema_gives_the_servers_threshold_range(
    logit_server: LiveServer, live_server: LiveServer
) -> None:
    def threshold_schema(url: str) -> dict[str, Any]:
        spec = httpx.get(f"{url}/openapi.json", timeout=60).json()
        request = spec["paths"]["/v1/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        name = request["$ref"].rsplit("/", 1)[1]
        [number] = [
            kind
            for kind in spec["components"]["schemas"][name]["properties"]["score_threshold"]["anyOf"]
            if kind.get("type") == "number"
        ]
        return dict(number)

    bounded = threshold_schema(live_server.url)
    assert (bounded["minimum"], bounded["maximum"]) == (0.0, 1.0)
    unbounded = threshold_schema(logit_server.url)
    assert "minimum" not in unbounded and "maximum" not in unbounded


def test_a_threshold_outside_the_servers_mode_is_refused_naming_it(
    logit_server: LiveServer, live_server: LiveServer
) -> None:
    nan = httpx.post(
        f"{logit_server.url}/v1/rerank",
        content=b'{"query": "q", "documents": ["a"], "score_threshold": NaN}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert nan.status_code in (400, 422), nan.text
    assert nan.json()["error"]["param"] == "score_threshold"
    bounded = _rerank(live_server.url, score_threshold=-1.5)
    assert bounded.status_code == 422, bounded.text
    assert bounded.json()["error"]["param"] == "score_threshold"


def test_a_rerank_client_in_logit_mode_takes_a_logit_servers_scores(
    logit_server: LiveServer, expected_logits: list[float], tiny_model_dir: Path
) -> None:
    """server_kind="rerank" sends text: the server's mode makes the scores, and a client in the same
    mode takes them unbounded, as a local logit-mode scorer gives them."""
    ordered = sorted(range(len(DOCUMENTS)), key=lambda i: -expected_logits[i])
    threshold = (expected_logits[ordered[2]] + expected_logits[ordered[3]]) / 2
    with GenerativeScorer(
        str(tiny_model_dir),
        server_url=logit_server.url,
        server_kind="rerank",
        max_length=512,
        score_mode="logit",
    ) as remote:
        ranked = remote.rerank(QUERY, DOCUMENTS, score_threshold=threshold)
        assert [r.index for r in ranked] == ordered[:3]
        assert [r.score for r in ranked] == pytest.approx([expected_logits[i] for i in ordered[:3]], abs=1e-5)
        assert remote.score_pairs([(QUERY, d) for d in DOCUMENTS]) == pytest.approx(expected_logits, abs=1e-5)


@pytest.mark.parametrize(("client_mode", "server"), [("label-softmax", "logit"), ("logit", "label-softmax")])
def test_a_rerank_client_refuses_a_server_of_another_mode(
    client_mode: str,
    server: str,
    logit_server: LiveServer,
    live_server: LiveServer,
    tiny_model_dir: Path,
) -> None:
    """Probabilities read as logits, or logits that happen to lie in [0, 1] read as probabilities,
    would rank and threshold silently wrong: genscore serve names its mode and the client checks it."""
    url = logit_server.url if server == "logit" else live_server.url
    with GenerativeScorer(
        str(tiny_model_dir), server_url=url, server_kind="rerank", max_length=512, score_mode=client_mode
    ) as remote:
        with pytest.raises(ConfigurationError, match=f"score mode '{server}'") as caught:
            remote.rerank(QUERY, DOCUMENTS)
    assert caught.value.setting == "score_mode"
    assert repr(client_mode) in str(caught.value)


def _stand_in(scores: list[float]) -> Starlette:
    """A /v1/rerank server that does not name its mode (Cohere's shape), answering ``scores``."""

    async def rerank(request: Request) -> JSONResponse:
        body = await request.json()
        results = [{"index": i, "relevance_score": scores[i]} for i in range(len(body["documents"]))]
        return JSONResponse({"results": results})

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/rerank", rerank, methods=["POST"]), Route("/health", health)])


def test_a_rerank_client_holds_unnamed_scores_to_its_own_mode(tiny_model_dir: Path) -> None:
    scores = [3.5, -40.0, 0.25, 1e300]
    with serve_in_thread(_stand_in(scores)) as live:
        with GenerativeScorer(
            str(tiny_model_dir), server_url=live.url, server_kind="rerank", max_length=512, score_mode="logit"
        ) as logit:
            ranked = logit.rerank(QUERY, DOCUMENTS, score_threshold=0.0)
            assert [(r.index, r.score) for r in ranked] == [(3, 1e300), (0, 3.5), (2, 0.25)]
        with GenerativeScorer(
            str(tiny_model_dir), server_url=live.url, server_kind="rerank", max_length=512
        ) as probability:
            with pytest.raises(
                RemoteScoringError, match=r"item 0: score 3.5 is not a probability in \[0, 1\]"
            ):
                probability.rerank(QUERY, DOCUMENTS)
