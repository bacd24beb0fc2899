"""ctxl-rerank-v2 (ContextualAI) against its model card's transformers recipe.

The card's code, written here from it: one string per document, ``"Check whether a given document
contains information helpful to answer the query.\\n<Document> {doc}\\n<Query> {query}{instruction}
??"`` with the instruction (when given) behind a space, tokenized in one left-padded batch; the score
is the logit of vocabulary id 0 at the last position, which the card rounds to bfloat16. On a tiny
random Qwen3 with the real Qwen3 tokenizer (the 1B and 2B models are Qwen3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.templates import CTXL_RERANK_V2
from tests.helpers.tiny_models import linked_model

QUERY = "What are the health benefits of exercise?"
DOCUMENTS = [
    "Regular exercise reduces risk of heart disease and improves mental health.",
    "A 2024 study shows exercise enhances cognitive function in older adults.",
    "Ancient Greeks valued physical fitness for military preparedness.",
    " leading space and a trailing newline\n",
    "{braces} and ?? marks",
]


def card_recipe(
    model: Any, tokenizer: Any, query: str, instruction: str, documents: list[str]
) -> tuple[list[list[int]], list[float], list[float]]:
    """The prompt ids, the unrounded id-0 logits and the card's bfloat16-rounded scores."""
    if instruction:
        instruction = f" {instruction}"
    prompts = [
        "Check whether a given document contains information helpful to answer the query.\n"
        f"<Document> {doc}\n<Query> {query}{instruction} ??"
        for doc in documents
    ]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True)
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    next_logits = out.logits[:, -1, :]
    ids = [row[mask.bool()].tolist() for row, mask in zip(enc["input_ids"], enc["attention_mask"])]
    return ids, next_logits[:, 0].tolist(), next_logits[:, 0].to(torch.bfloat16).float().tolist()


@pytest.fixture(scope="module")
def ctxl_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return linked_model(tiny_model_dir, tmp_path_factory.mktemp("ctxl") / "ctxl-rerank-v2-tiny")


@pytest.fixture(scope="module")
def ctxl_model(ctxl_dir: Path) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(ctxl_dir))
    return AutoModelForCausalLM.from_pretrained(str(ctxl_dir), dtype=torch.float32).eval(), tokenizer


def test_ctxl_is_picked_from_its_name(ctxl_dir: Path) -> None:
    scorer = GenerativeScorer(str(ctxl_dir), device="cpu", dtype="float32")
    assert scorer.template is CTXL_RERANK_V2
    assert scorer.recipe.source == "preset 'ctxl-rerank-v2' from the model name"
    assert scorer.label_token_ids == [0]
    assert scorer.score_mode == "logit"  # the card's score is the raw logit


@pytest.mark.parametrize("instruction", ["", "Prioritize recent medical research"])
def test_ctxl_matches_the_model_card(ctxl_dir: Path, ctxl_model: tuple[Any, Any], instruction: str) -> None:
    model, tokenizer = ctxl_model
    scorer = GenerativeScorer.from_model(
        model, tokenizer, model=str(ctxl_dir), instruction=instruction or None
    )
    assert scorer.template is CTXL_RERANK_V2
    expected_ids, logits, card_scores = card_recipe(model, tokenizer, QUERY, instruction, DOCUMENTS)
    assert [p.token_ids for p in scorer.encode(QUERY, DOCUMENTS)] == expected_ids
    assert max(logits) - min(logits) > 0.1, "scores must spread for the comparison to mean something"

    got = scorer.score_pairs([(QUERY, d) for d in DOCUMENTS])
    assert got == pytest.approx(logits, abs=1e-5, rel=1e-5)
    # The card's numbers are the same logits rounded to bfloat16 (8 significant bits).
    assert got == pytest.approx(card_scores, rel=2**-8)
    ranked = scorer.rerank(QUERY, DOCUMENTS)
    assert [r.index for r in ranked] == sorted(range(len(DOCUMENTS)), key=lambda i: -logits[i])
