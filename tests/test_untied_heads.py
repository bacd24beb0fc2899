"""Untied heads (``tie_word_embeddings: false``, as Qwen3-Reranker-4B and -8B ship) through every path:
the packed and padded forwards, the full-vocabulary mode and the server, against the official
recipes, for a Qwen3 and a Gemma whose head is drawn apart from its embeddings. The kernels' side
is in tests/kernels/test_untied_head_kernels.py."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.helpers.reference_recipe import (
    bge_reference_ids,
    last_logits_left_padded,
    official_qwen3_ids,
    official_qwen3_scores,
)
from tests.helpers.server import TEST_LIMITS, serve_in_thread
from tests.helpers.tiny_models import make_untied_model

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "The Thames flows through London.",
    "Berlin",
    "",
    "A photon carries energy proportional to its frequency. " * 5,
]
PAIRS = [(QUERY, d) for d in DOCUMENTS]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("untied")
    return {
        "qwen3": make_untied_model(root / "qwen3-reranker-untied", "qwen3"),
        "gemma": make_untied_model(root / "bge-reranker-v2-gemma-untied", "gemma"),
    }


def _check_untied(scorer: GenerativeScorer) -> None:
    """The loaded head is its own tensor, far from the embeddings, and the label head reads it."""
    model = scorer.model
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert not model.config.tie_word_embeddings
    assert head.data_ptr() != embed.data_ptr()
    assert float((head - embed).detach().abs().mean()) > 0.1
    assert scorer.engine.head.weight.data_ptr() == head.data_ptr()


def _rerank_through_a_server(scorer: GenerativeScorer) -> list[float]:
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        answer = httpx.post(
            f"{live.url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=60
        )
    assert answer.status_code == 200, answer.text
    by_index = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
    return [by_index[i] for i in range(len(DOCUMENTS))]


@pytest.mark.slow
def test_untied_qwen3_every_path(folders: dict[str, Path]) -> None:
    scorer = GenerativeScorer(str(folders["qwen3"]), device="cpu", dtype="float32", max_length=512)
    _check_untied(scorer)
    tokenizer = AutoTokenizer.from_pretrained(str(folders["qwen3"]))
    reference = AutoModelForCausalLM.from_pretrained(str(folders["qwen3"]), dtype=torch.float32).eval()
    expected = official_qwen3_scores(reference, tokenizer, PAIRS, max_length=512)
    assert max(expected) - min(expected) > 0.05, "scores must spread for the comparison to mean something"

    # Read through the embeddings instead, the same hidden states give other scores.
    yes, no = (tokenizer.convert_tokens_to_ids(w) for w in ("yes", "no"))
    prompts = [official_qwen3_ids(tokenizer, q, d) for q, d in PAIRS]
    with torch.no_grad():
        hidden = torch.stack(
            [reference.model(input_ids=torch.tensor([p])).last_hidden_state[0, -1] for p in prompts]
        )
        logits = torch.stack([reference(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts]).double()
    embed = reference.get_input_embeddings().weight
    wrong = torch.sigmoid(hidden @ (embed[yes] - embed[no]).detach()).tolist()
    assert max(abs(a - b) for a, b in zip(wrong, expected)) > 0.05

    full_vocabulary = torch.log_softmax(logits, dim=-1)[:, yes].exp().tolist()
    for forward in ("packed", "padded"):
        other = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, forward=forward)
        assert (
            type(other.engine.forward).__name__
            == {"packed": "PackedForward", "padded": "PaddedForward"}[forward]
        )
        assert other.score_pairs(PAIRS) == pytest.approx(expected, abs=1e-5), forward
        vocab = GenerativeScorer.from_model(
            scorer.model, scorer.tokenizer, max_length=512, forward=forward, score_mode="vocab-softmax"
        )
        assert vocab.score_pairs(PAIRS) == pytest.approx(full_vocabulary, rel=1e-5, abs=1e-12), forward
    assert _rerank_through_a_server(scorer) == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_untied_gemma_every_path(folders: dict[str, Path]) -> None:
    scorer = GenerativeScorer(str(folders["gemma"]), device="cpu", dtype="float32", max_length=200)
    assert scorer.template.name == "bge-reranker-v2-gemma"
    _check_untied(scorer)
    tokenizer = AutoTokenizer.from_pretrained(str(folders["gemma"]))
    reference = AutoModelForCausalLM.from_pretrained(str(folders["gemma"]), dtype=torch.float32).eval()
    prompts = bge_reference_ids(tokenizer, PAIRS, max_length=200)  # the card's recipe (no pair is cut)
    assert [p.token_ids for q, d in PAIRS for p in scorer.encode(q, [d])] == prompts
    logits = last_logits_left_padded(reference, prompts, tokenizer.pad_token_id)
    yes = tokenizer.convert_tokens_to_ids("Yes")
    raw = logits[:, yes].tolist()
    assert max(raw) - min(raw) > 0.1, "scores must spread for the comparison to mean something"

    for forward in ("packed", "padded"):  # Gemma runs in the padded forward whatever is asked
        logit = GenerativeScorer.from_model(
            scorer.model, scorer.tokenizer, max_length=200, forward=forward, score_mode="logit"
        )
        assert type(logit.engine.forward).__name__ == "PaddedForward"
        assert logit.score_pairs(PAIRS) == pytest.approx(raw, abs=1e-5)
        vocab = GenerativeScorer.from_model(
            scorer.model, scorer.tokenizer, max_length=200, forward=forward, score_mode="vocab-softmax"
        )
        expected_vocab = torch.log_softmax(logits, dim=-1)[:, yes].exp().tolist()
        assert vocab.score_pairs(PAIRS) == pytest.approx(expected_vocab, rel=1e-5, abs=1e-12)
    sigmoid = [1 / (1 + math.exp(-x)) for x in raw]
    assert scorer.score_pairs(PAIRS) == pytest.approx(sigmoid, abs=1e-5)
    assert _rerank_through_a_server(scorer) == pytest.approx(sigmoid, abs=1e-5)
