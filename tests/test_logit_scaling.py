"""Heads that scale their logits by a constant (Granite divides by ``logits_scaling``, Cohere
multiplies by ``logit_scale``): scores equal the official Qwen3-Reranker recipe run on the model's own
full logits, whatever the constant, in both score modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from genscore_core import GenerativeScorer
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir, write_model_folder
from tests.helpers.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    full_vocab_label_prob,
    official_qwen3_scores,
)
from tests.helpers.tiny_models import special_ids, tiny_sizes

QUERY = "Which rivers flow through Paris?"
DOCS = [
    "The Seine flows through Paris before it reaches the sea.",
    "Pancakes need flour, eggs and milk.",
    "Lyon lies where the Rhone meets the Saone.",
    "A river is a natural stream of water.",
]


def _scaled_model(kind: str, out: Path) -> Path:
    from transformers import AutoTokenizer, CohereConfig, CohereForCausalLM, GraniteConfig, GraniteForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    common: dict[str, Any] = dict(
        **tiny_sizes(), **special_ids(tokenizer, "pad", "bos", "eos"), max_position_embeddings=2048,
        initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    if kind == "granite":
        # A scaling far from 1 (the real models use 6-16): scores without it differ by a lot.
        model: Any = GraniteForCausalLM(GraniteConfig(**common, logits_scaling=0.25)).eval()
    else:
        model = CohereForCausalLM(CohereConfig(**common, logit_scale=0.5)).eval()
    write_model_folder(out, model, tokenizer, title=f"tiny {kind}", notice="random weights",
                       notice_file="NOTICE.txt", settings={"kind": kind})  # fmt: skip
    return out


@pytest.fixture(scope="module", params=["granite", "cohere"])
def scaled_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scaled_model(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


def test_label_softmax_matches_the_recipe_on_full_logits(scaled_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scorer = GenerativeScorer(str(scaled_dir), template="qwen3-reranker", device="cpu", dtype="float32",
                              max_length=512)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(scaled_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(scaled_dir))
    want = official_qwen3_scores(model, tokenizer, [(QUERY, d) for d in DOCS], max_length=512)
    got = scorer.score_pairs([(QUERY, d) for d in DOCS])
    assert got == pytest.approx(want, abs=1e-5)
    assert max(want) - min(want) > 0.01  # the scaling moves scores: a test that can fail


def test_true_probability_matches_the_full_vocabulary_softmax(scaled_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scorer = GenerativeScorer(str(scaled_dir), template="qwen3-reranker", device="cpu", dtype="float32",
                              max_length=512, score_mode="vocab-softmax")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(scaled_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(scaled_dir))
    yes = tokenizer.convert_tokens_to_ids("yes")
    want = []
    prefix, suffix = (
        tokenizer.encode(text, add_special_tokens=False) for text in (QWEN3_PREFIX, QWEN3_SUFFIX)
    )
    for doc in DOCS:
        # The recipe's prompt: its three parts tokenized apart and joined.
        body = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {doc}"
        ids = prefix + tokenizer.encode(body, add_special_tokens=False) + suffix
        want.append(full_vocab_label_prob(model, ids, yes))
    assert scorer.score_pairs([(QUERY, d) for d in DOCS]) == pytest.approx(want, rel=1e-4, abs=1e-9)
