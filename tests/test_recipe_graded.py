"""Graded labels: lightblue's lb-reranker (answers 1 to 7, scored by the expected grade) against its
model card, and the ``expected-grade`` score mode through the server and the adapters.

The card's recipe, written here from it: a system message asking for a score of 1 to 7 and the user
message ``"<<<Query>>>\\n{query}\\n\\n<<<Context>>>\\n{context}"`` in the tokenizer's chat template with
the generation prompt; the probabilities of the first generated token being "1" ... "7" (``get_prob``:
exp of its log-probability under the full vocabulary), and the expected value ``sum_i p_i * i``.
genscore's ``expected-grade`` normalises over the seven label tokens and maps grades 1..7 to 0..1:
``(sum_i p_i * i / sum_i p_i - 1) / 6``, which is the card's number wherever the labels hold all the
probability (the card's own sum is lower by the probability left on other tokens). On a tiny random
Qwen3 with the real Qwen3 tokenizer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.scoring import LabelHead
from genscore_core.server import create_app
from genscore_core.templates import LB_RERANKER
from genscore_integrations.langchain import GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread
from tests.helpers.tiny_models import linked_model

SYSTEM = (
    "Given a query and a piece of text, output a score of 1-7 based on how related the query is to the "
    "text. 1 means least related and 7 is most related."
)
QUERY = "How many people live in Berlin?"
CONTEXTS = [
    "Berlin had a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
    "Berlin is well known for its museums.",
    "The Thames flows through London.\n",
    "  x  ",
]


def card_recipe(
    model: Any, tokenizer: Any, query: str, contexts: list[str]
) -> tuple[list[list[int]], list[float], list[float]]:
    """The prompt ids, the card's expected grade ``sum_i p_i * i`` and the labels' total probability."""
    idx_tokens = [tokenizer.encode(str(i))[0] for i in range(1, 8)]
    ids, expected, total = [], [], []
    for context in contexts:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"<<<Query>>>\n{query}\n\n<<<Context>>>\n{context}"},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
        probs = torch.log_softmax(logits, dim=-1)[idx_tokens].exp()
        ids.append(prompt)
        expected.append(float((probs * torch.arange(1, 8, dtype=torch.float64)).sum()))
        total.append(float(probs.sum()))
    return ids, expected, total


@pytest.fixture(scope="module")
def lb_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return linked_model(tiny_model_dir, tmp_path_factory.mktemp("graded") / "lb-reranker-0.5B-tiny")


@pytest.fixture(scope="module")
def lb_scorer(lb_dir: Path) -> GenerativeScorer:
    return GenerativeScorer(str(lb_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def grades(lb_dir: Path) -> list[float]:
    """The reference's expected grades of CONTEXTS, renormalised over the labels, mapped to [0, 1]."""
    model = AutoModelForCausalLM.from_pretrained(str(lb_dir), dtype=torch.float32).eval()
    _, expected, total = card_recipe(model, AutoTokenizer.from_pretrained(str(lb_dir)), QUERY, CONTEXTS)
    return [(e / s - 1.0) / 6.0 for e, s in zip(expected, total)]


def test_lb_reranker_matches_the_model_card(
    lb_dir: Path, lb_scorer: GenerativeScorer, grades: list[float]
) -> None:
    assert lb_scorer.template is LB_RERANKER
    assert lb_scorer.recipe.source == "preset 'lb-reranker' from the model name"
    assert lb_scorer.score_mode == "expected-grade"
    tokenizer = AutoTokenizer.from_pretrained(str(lb_dir))
    assert lb_scorer.label_token_ids == [tokenizer.encode(str(i))[0] for i in range(7, 0, -1)]

    expected_ids, _, _ = card_recipe(lb_scorer.model, tokenizer, QUERY, CONTEXTS)
    assert [p.token_ids for p in lb_scorer.encode(QUERY, CONTEXTS)] == expected_ids
    assert max(grades) - min(grades) > 1e-3, "scores must spread for the comparison to mean something"
    assert lb_scorer.score_pairs([(QUERY, c) for c in CONTEXTS]) == pytest.approx(grades, abs=1e-5)
    ranked = lb_scorer.rerank(QUERY, CONTEXTS)
    assert [r.index for r in ranked] == sorted(range(len(CONTEXTS)), key=lambda i: -grades[i])


def test_expected_grade_and_temperature_in_the_head(scorer: GenerativeScorer) -> None:
    """Against the label logits read off the model's full logits: the grade of each label, and a
    template's temperature in every mode that normalises or squashes logits (never in ``logit``)."""
    head = LabelHead(scorer.model)
    hidden = torch.randn(5, scorer.model.config.hidden_size)
    labels = [16, 17, 18]  # "1", "2", "3", listed best first
    logits = (hidden @ scorer.model.get_output_embeddings().weight.T)[:, labels].double()
    for temperature in (1.0, 5.0):
        p = torch.softmax(logits / temperature, dim=-1)
        expected = p[:, 0] * 1.0 + p[:, 1] * 0.5 + p[:, 2] * 0.0
        got = head.scores(hidden, labels, "expected-grade", temperature)
        assert got.tolist() == pytest.approx(expected.tolist(), abs=1e-6)
        softmax = head.scores(hidden, labels, "label-softmax", temperature)
        assert softmax.tolist() == pytest.approx(p[:, 0].tolist(), abs=1e-6)
        sigmoid = head.scores(hidden, labels, "logit-sigmoid", temperature)
        assert sigmoid.tolist() == pytest.approx(torch.sigmoid(logits[:, 0] / temperature).tolist(), abs=1e-6)
        raw = head.scores(hidden, labels, "logit", temperature)
        assert raw.tolist() == pytest.approx(logits[:, 0].tolist(), abs=1e-4)
    with pytest.raises(ValueError, match="'expected-grade' normalises over the label tokens"):
        GenerativeScorer.from_model(
            scorer.model, scorer.tokenizer, template="bge-reranker-v2-gemma", score_mode="expected-grade"
        )


@pytest.fixture(scope="module")
def lb_server(lb_scorer: GenerativeScorer) -> Iterator[LiveServer]:
    """``genscore serve`` of the graded model: it scores in its template's mode, expected-grade."""
    with serve_in_thread(create_app(lb_scorer, TEST_LIMITS)) as live:
        yield live


def test_expected_grade_through_the_server(lb_dir: Path, lb_server: LiveServer, grades: list[float]) -> None:
    ordered = sorted(range(len(CONTEXTS)), key=lambda i: -grades[i])
    threshold = (grades[ordered[1]] + grades[ordered[2]]) / 2
    answer = httpx.post(
        f"{lb_server.url}/v1/rerank",
        json={"query": QUERY, "documents": CONTEXTS, "score_threshold": threshold},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["score_mode"] == "expected-grade"
    assert [r["index"] for r in body["results"]] == ordered[:2]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [grades[i] for i in ordered[:2]], abs=1e-5
    )
    out_of_range = httpx.post(
        f"{lb_server.url}/v1/rerank", json={"query": QUERY, "documents": CONTEXTS, "score_threshold": 1.5}
    )
    assert out_of_range.status_code == 422, out_of_range.text

    # A client of the text protocol gets the server's grades; one of a token protocol, which returns
    # the first label's probability only, is refused before any request.
    with GenerativeScorer(str(lb_dir), server_url=lb_server.url, server_kind="rerank") as remote:
        assert remote.score_mode == "expected-grade"
        assert remote.score_pairs([(QUERY, c) for c in CONTEXTS]) == pytest.approx(grades, abs=1e-5)
    with GenerativeScorer(str(lb_dir), server_url=lb_server.url) as tokens:
        with pytest.raises(InvalidRequestError, match="returns probabilities only") as caught:
            tokens.rerank(QUERY, CONTEXTS)
        assert caught.value.param == "score_mode"


def test_expected_grade_through_the_adapters(lb_scorer: GenerativeScorer, grades: list[float]) -> None:
    ordered = sorted(range(len(CONTEXTS)), key=lambda i: -grades[i])
    threshold = (grades[ordered[1]] + grades[ordered[2]]) / 2
    reranker = GenerativeReranker(scorer=lb_scorer, top_n=None, score_threshold=threshold)
    out = asyncio.run(reranker.acompress_documents([Document(c) for c in CONTEXTS], QUERY))
    assert [CONTEXTS.index(d.page_content) for d in out] == ordered[:2]
    assert [d.metadata["relevance_score"] for d in out] == pytest.approx(
        [grades[i] for i in ordered[:2]], abs=1e-5
    )

    rerank = GenerativeRerank(scorer=lb_scorer, top_n=None, score_threshold=threshold)
    nodes = [NodeWithScore(node=TextNode(text=c, id_=str(i)), score=None) for i, c in enumerate(CONTEXTS)]
    kept = rerank.postprocess_nodes(nodes, query_str=QUERY)
    assert [int(n.node.node_id) for n in kept] == ordered[:2]
    assert [n.score for n in kept] == pytest.approx([grades[i] for i in ordered[:2]], abs=1e-5)

    # The template's mode is known before loading: a threshold outside [0, 1] fails first.
    for adapter in (GenerativeReranker, GenerativeRerank):
        with pytest.raises(InvalidRequestError, match=r"within \[0, 1\]") as caught:
            adapter("./no-such-model-folder", template="lb-reranker", score_threshold=2.0)
        assert caught.value.param == "score_threshold"
