"""The rerank dialects of other servers, spoken by ``genscore serve`` on a real server on loopback:
TEI's ``/rerank`` and NVIDIA NIM's ``/v1/ranking`` through their real LlamaIndex clients, vLLM's
``/score`` as vLLM defines its pairs, and the usage each dialect reports.

Scores are checked against ``GenerativeScorer.rerank`` of the same scorer; logits against
``log(p / (1 - p))`` of its probability, computed here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
import torch
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.postprocessor.nvidia_rerank import NVIDIARerank
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.helpers.server import CAPITAL_DOCUMENTS as TEXTS
from tests.helpers.server import CAPITAL_QUERY as QUERY
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread

LONG_TEXT = "word " * 2000  # over the session scorer's max_length of 512


def _expected(scorer: GenerativeScorer, query: str, texts: list[str]) -> dict[int, float]:
    return {result.index: result.score for result in scorer.rerank(query, texts)}


def _log_odds(p: float) -> float:
    return math.log(p / (1.0 - p))


def _nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=text, id_=f"node-{i}"), score=0.0) for i, text in enumerate(TEXTS)
    ]


# -- TEI ----------------------------------------------------------------------------------------------


def test_llama_index_tei_client_gets_the_scorer_s_scores(
    live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    client = TextEmbeddingInference(base_url=live_server.url, top_n=len(TEXTS))
    ranked = client.postprocess_nodes(_nodes(), QueryBundle(QUERY))
    want = _expected(scorer, QUERY, TEXTS)
    assert len(ranked) == len(TEXTS)
    for node in ranked:
        assert node.score == pytest.approx(want[TEXTS.index(node.node.get_content())], abs=1e-6)
    assert [n.score for n in ranked] == sorted((n.score or 0.0 for n in ranked), reverse=True)


def test_tei_body_options(client: httpx.Client, scorer: GenerativeScorer) -> None:
    want = _expected(scorer, QUERY, TEXTS)
    plain = client.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert isinstance(body, list) and [set(rank) for rank in body] == [{"index", "score"}] * len(TEXTS)
    assert [rank["score"] for rank in body] == sorted((rank["score"] for rank in body), reverse=True)
    assert {rank["index"]: rank["score"] for rank in body} == pytest.approx(want, abs=1e-6)

    raw = client.post(
        "/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True, "return_text": True}
    )
    assert raw.status_code == 200, raw.text
    for rank in raw.json():
        assert rank["score"] == pytest.approx(_log_odds(want[rank["index"]]), abs=1e-6)
        assert rank["text"] == TEXTS[rank["index"]]

    # truncate=true cuts a long text as the scorer does; false refuses it, naming it.
    texts = [TEXTS[0], LONG_TEXT]
    cut = client.post("/rerank", json={"query": QUERY, "texts": texts, "truncate": True})
    assert {r["index"]: r["score"] for r in cut.json()} == pytest.approx(
        _expected(scorer, QUERY, texts), abs=1e-6
    )
    refused = client.post("/rerank", json={"query": QUERY, "texts": texts, "truncate": False})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "texts.1" and "texts.1" in refused.json()["detail"]
    left = client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "truncation_direction": "Left"})
    assert left.status_code == 400 and left.json()["error"]["param"] == "truncation_direction"
    # An error about a text names it by TEI's field.
    empty = client.post("/rerank", json={"query": QUERY, "texts": ["x"] * 65})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "texts"


def test_rerank_path_tells_the_bodies_apart(client: httpx.Client, scorer: GenerativeScorer) -> None:
    # documents (with or without texts) is Cohere's body, answered as before.
    both = client.post("/rerank", json={"query": QUERY, "documents": TEXTS, "texts": ["ignored"]})
    assert both.status_code == 200 and len(both.json()["results"]) == len(TEXTS)
    missing = client.post("/rerank", json={"query": QUERY})
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "documents"
    bad_tei = client.post("/rerank", json={"query": QUERY, "texts": [1]})
    assert bad_tei.status_code == 422 and bad_tei.json()["error"]["param"] == "texts.0"


# -- NIM ----------------------------------------------------------------------------------------------


def test_llama_index_nvidia_client_gets_logits(live_server: LiveServer, scorer: GenerativeScorer) -> None:
    want = _expected(scorer, QUERY, TEXTS)
    # Named, the model is checked against /v1/models; unnamed, the client takes it from there.
    for model in (scorer.config.model, None):
        with pytest.warns(UserWarning) if model is None else _no_warning():
            client = NVIDIARerank(base_url=f"{live_server.url}/v1", model=model, top_n=len(TEXTS))
        assert client.model == scorer.config.model
        ranked = client.postprocess_nodes(_nodes(), QueryBundle(QUERY))
        assert len(ranked) == len(TEXTS)
        for node in ranked:
            expected = _log_odds(want[TEXTS.index(node.node.get_content())])
            assert node.score == pytest.approx(expected, abs=1e-6)


class _no_warning:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def test_nim_body_options(client: httpx.Client, scorer: GenerativeScorer) -> None:
    texts = [TEXTS[0], LONG_TEXT]
    body: dict[str, Any] = {"query": {"text": QUERY}, "passages": [{"text": t} for t in texts]}
    cut = client.post("/v1/ranking", json={**body, "truncate": "END"})
    assert cut.status_code == 200, cut.text
    rankings = cut.json()["rankings"]
    assert [r["logit"] for r in rankings] == sorted((r["logit"] for r in rankings), reverse=True)
    want = {i: _log_odds(p) for i, p in _expected(scorer, QUERY, texts).items()}
    assert {r["index"]: r["logit"] for r in rankings} == pytest.approx(want, abs=1e-6)
    refused = client.post("/v1/ranking", json={**body, "truncate": "NONE"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "passages.1"
    unknown = client.post("/v1/ranking", json={**body, "model": "nvidia/other"})
    assert unknown.status_code == 404


def test_the_logit_is_the_model_s_own(client: httpx.Client, scorer: GenerativeScorer) -> None:
    """Under Qwen3-Reranker's two labels, NIM's logit is z_yes - z_no of the model's own forward."""
    yes, no = scorer.label_token_ids
    body = {"query": {"text": QUERY}, "passages": [{"text": t} for t in TEXTS]}
    logits = {r["index"]: r["logit"] for r in client.post("/v1/ranking", json=body).json()["rankings"]}
    for index, prompt in enumerate(scorer.encode(QUERY, TEXTS)):
        with torch.no_grad():
            last = scorer.model(torch.tensor([prompt.token_ids])).logits[0, -1].double()
        assert logits[index] == pytest.approx(float(last[yes] - last[no]), abs=1e-4)


def test_a_logit_mode_server_answers_its_logits(scorer: GenerativeScorer) -> None:
    """Under --score-mode logit the score is already a logit: TEI's score with or without raw_scores,
    and NIM's logit, are the scorer's own."""
    logit_scorer = GenerativeScorer.from_model(
        scorer.model,
        scorer.front_end.tokenizer,
        model=scorer.config.model,
        max_length=512,
        score_mode="logit",
    )
    want = _expected(logit_scorer, QUERY, TEXTS)
    assert min(want.values()) < 0.0 or max(want.values()) > 1.0  # logits, not probabilities
    with (
        serve_in_thread(create_app(logit_scorer, TEST_LIMITS)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        for raw in (False, True):
            tei = http.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": raw}).json()
            assert {r["index"]: r["score"] for r in tei} == pytest.approx(want, abs=1e-6)
        body = {"query": {"text": QUERY}, "passages": [{"text": t} for t in TEXTS]}
        nim = http.post("/v1/ranking", json=body).json()["rankings"]
        assert {r["index"]: r["logit"] for r in nim} == pytest.approx(want, abs=1e-6)


# -- usage ------------------------------------------------------------------------------------------


def test_cohere_meta_and_vllm_usage(client: httpx.Client, scorer: GenerativeScorer) -> None:
    tokens = scorer.rerank(QUERY, TEXTS).prompt_tokens
    for path, version in (("/v2/rerank", "2"), ("/v1/rerank", "1"), ("/rerank", "1")):
        body = client.post(path, json={"query": QUERY, "documents": TEXTS}).json()
        assert body["meta"] == {
            "api_version": {"version": version, "is_experimental": False},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        }
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


# -- vLLM /score ------------------------------------------------------------------------------------

VLLM_CASES: list[tuple[str | list[str], str | list[str]]] = [
    # The shapes vLLM's own score tests send: 1:1 strings, 1:N, a one-entry list against N, N:N.
    (QUERY, TEXTS[0]),
    (QUERY, TEXTS),
    ([QUERY], TEXTS),
    ([QUERY, "Where is Berlin?", QUERY], [TEXTS[0], TEXTS[1], TEXTS[3]]),
]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
@pytest.mark.parametrize("text_1, text_2", VLLM_CASES)
def test_vllm_score_pairs_as_vllm_defines_them(
    client: httpx.Client,
    scorer: GenerativeScorer,
    path: str,
    text_1: str | list[str],
    text_2: str | list[str],
) -> None:
    queries = [text_1] if isinstance(text_1, str) else text_1
    documents = [text_2] if isinstance(text_2, str) else text_2
    pairs = [(queries[0], d) for d in documents] if len(queries) == 1 else list(zip(queries, documents))
    answer = client.post(path, json={"text_1": text_1, "text_2": text_2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["object"] == "list" and body["model"] == scorer.config.model
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "score") for i in range(len(pairs))]
    want = scorer.score_pairs(pairs)
    assert [d["score"] for d in body["data"]] == pytest.approx(want, abs=1e-6)
    tokens = sum(scorer.rerank(q, [d]).prompt_tokens for q, d in pairs)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == tokens


def test_vllm_score_refusals(client: httpx.Client, scorer: GenerativeScorer) -> None:
    def refused(body: dict[str, Any]) -> str:
        # As JSON text with ASCII escapes: a lone surrogate travels as its \u escape.
        answer = client.post(
            "/v1/score", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, answer.text
        param: str = answer.json()["error"]["param"]
        return param

    assert refused({"text_1": [QUERY, QUERY], "text_2": TEXTS}) == "text_1"  # 2:4 is none of 1:1, 1:N, N:N
    assert refused({"text_1": [], "text_2": TEXTS}) == "text_1"
    assert refused({"text_1": QUERY, "text_2": []}) == "text_2"
    assert (
        refused({"text_1": QUERY, "text_2": TEXTS, "truncate_prompt_tokens": 513}) == "truncate_prompt_tokens"
    )
    assert (
        refused({"text_1": QUERY, "text_2": TEXTS, "truncate_prompt_tokens": 10}) == "truncate_prompt_tokens"
    )
    # N:N errors name the pair by its place in text_2.
    assert refused({"text_1": [QUERY, "q"], "text_2": ["fine", "bad \ud800"]}) == "text_2.1"
    # SGLang's scoring request, which SGLang takes at /v1/score, is not vLLM's: a 404 saying where it goes.
    sglang = client.post("/v1/score", json={"query": QUERY, "items": TEXTS, "label_token_ids": [9454, 2753]})
    assert sglang.status_code == 404 and "/generative_scoring" in sglang.json()["detail"]
    ok = client.post("/v1/score", json={"text_1": QUERY, "text_2": TEXTS, "truncate_prompt_tokens": 512})
    assert ok.status_code == 200
