"""Both adapters in logit mode: score_threshold is a logit there (any finite number), and a score of
[0, 1] in the other modes; checked before a model is loaded where the settings tell the mode, and
against the scorer's own mode once it is built. Scores against the recipe's full logits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer, InvalidRequestError, ModelNotFoundError
from genscore_core.templates import TEMPLATES
from genscore_integrations.langchain import GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank
from tests.helpers.reference_recipe import reference_yes_logits

QUERY = "capital of France?"
TEXTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Thames flows through London.",
    "x",
]
MISSING = "./no-such-model-folder"


@pytest.fixture(scope="module")
def logit_scorer(scorer: GenerativeScorer) -> GenerativeScorer:
    return GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, score_mode="logit")


@pytest.fixture(scope="module")
def expected(scorer: GenerativeScorer, tiny_model_dir: Path) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return reference_yes_logits(model, scorer.tokenizer, QUERY, TEXTS)


def _kept(expected: list[float]) -> tuple[float, list[int]]:
    """A threshold between the second and third best logits, and the documents it keeps."""
    ordered = sorted(range(len(expected)), key=lambda i: -expected[i])
    return (expected[ordered[1]] + expected[ordered[2]]) / 2, ordered[:2]


def test_langchain_thresholds_logits_in_logit_mode(
    logit_scorer: GenerativeScorer, expected: list[float]
) -> None:
    threshold, kept = _kept(expected)
    assert threshold < 0.0 or threshold > 1.0  # outside [0, 1], where the check used to stop it
    reranker = GenerativeReranker(scorer=logit_scorer, top_n=None, score_threshold=threshold)
    documents = [Document(text) for text in TEXTS]
    for out in (
        reranker.compress_documents(documents, QUERY),
        asyncio.run(reranker.acompress_documents(documents, QUERY)),
    ):
        assert [TEXTS.index(d.page_content) for d in out] == kept
        assert [d.metadata["relevance_score"] for d in out] == pytest.approx(
            [expected[i] for i in kept], abs=1e-5
        )
    again = GenerativeReranker(**reranker.model_dump(), scorer=logit_scorer)
    assert again.score_threshold == threshold


def test_llama_index_thresholds_logits_in_logit_mode(
    logit_scorer: GenerativeScorer, expected: list[float]
) -> None:
    threshold, kept = _kept(expected)
    rerank = GenerativeRerank(scorer=logit_scorer, top_n=None, score_threshold=threshold)
    nodes = [NodeWithScore(node=TextNode(text=text, id_=str(i)), score=None) for i, text in enumerate(TEXTS)]
    for out in (
        rerank.postprocess_nodes(nodes, query_str=QUERY),
        asyncio.run(rerank.apostprocess_nodes(nodes, query_str=QUERY)),
    ):
        assert [int(n.node.node_id) for n in out] == kept
        assert [n.score for n in out] == pytest.approx([expected[i] for i in kept], abs=1e-5)
    again = GenerativeRerank.from_dict(rerank.to_dict(), scorer=logit_scorer)
    assert again.score_threshold == threshold


@pytest.mark.parametrize("adapter", [GenerativeReranker, GenerativeRerank])
def test_thresholds_are_checked_against_the_mode_before_loading(adapter: type) -> None:
    """The settings tell the mode, so a threshold out of its range fails before the (missing) model is
    looked for, and one in range gets as far as the model."""
    logit_template = TEMPLATES["qwen3-reranker"].model_copy(update={"score_mode": "logit"})
    for settings in ({}, {"score_mode": "logit-sigmoid"}, {"template": "bge-reranker-v2-gemma"}):
        with pytest.raises(InvalidRequestError, match=r"within \[0, 1\]") as caught:
            adapter(MISSING, score_threshold=2.0, **settings)
        assert caught.value.param == "score_threshold"
    for settings in ({"score_mode": "logit"}, {"template": logit_template}):
        with pytest.raises(ModelNotFoundError):
            adapter(MISSING, score_threshold=-1.5, **settings)
        with pytest.raises(InvalidRequestError, match="finite") as caught:
            adapter(MISSING, score_threshold=float("inf"), **settings)
        assert caught.value.param == "score_threshold"


@pytest.mark.parametrize("adapter", [GenerativeReranker, GenerativeRerank])
def test_a_ready_scorer_s_mode_decides(
    adapter: type, scorer: GenerativeScorer, logit_scorer: GenerativeScorer
) -> None:
    assert adapter(scorer=logit_scorer, score_threshold=-3.0).score_threshold == -3.0
    with pytest.raises(InvalidRequestError, match="'label-softmax'") as caught:
        adapter(scorer=scorer, score_threshold=-3.0)
    assert caught.value.param == "score_threshold"
