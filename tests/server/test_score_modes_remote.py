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
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.server import create_app
from tests.test_score_modes import reference_yes_logits

from ._support import TEST_LIMITS, LiveServer, serve_in_thread

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
