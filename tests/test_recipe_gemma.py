"""bge-reranker-v2-gemma's recipe, and Gemma / Gemma 2 / Gemma 3 architectures, against the model card.

No Gemma tokenizer is available offline, so the tiny Gemma-architecture models here carry the real
Qwen3 tokenizer (with ``<|endoftext|>`` as its BOS token). The recipe's logic (pieces, BOS, the 3/4
query cap, the "Yes" logit) and the architectures' code paths (embedding scaling, soft-capping, sliding
windows) are what is checked; token ids of a real Gemma vocabulary are not.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.templates import BGE_RERANKER_V2_GEMMA
from genscore_core.testing.tiny_model import QWEN3_VOCAB_SIZE, qwen3_tokenizer_dir
from tests.helpers.reference_recipe import BGE_PROMPT, bge_reference_ids, last_logits_left_padded

WORDS = "panda bear China bamboo forest what is the giant species endemic hi capital river".split()
MAX_LENGTH = 200


def _config(architecture: str) -> Any:
    from transformers import Gemma2Config, Gemma3TextConfig, GemmaConfig

    common: dict[str, Any] = {
        "vocab_size": QWEN3_VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "initializer_range": 0.1,
        "pad_token_id": 151643,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }
    if architecture == "gemma":
        return GemmaConfig(**common)
    if architecture == "gemma2":
        # Soft-capped logits (30) and attention (50), as Gemma 2 ships; a short sliding window so that
        # prompts here run past it.
        return Gemma2Config(**common, sliding_window=24, query_pre_attn_scalar=16)
    return Gemma3TextConfig(
        **common,
        sliding_window=24,
        query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=30.0,
    )


@pytest.fixture(scope="module", params=["gemma", "gemma2", "gemma3"])
def gemma_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM

    architecture = request.param
    out = tmp_path_factory.mktemp(architecture) / f"bge-reranker-v2-gemma-tiny-{architecture}"
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    tokenizer.bos_token = "<|endoftext|>"
    torch.manual_seed(21)
    model_class = {"gemma": GemmaForCausalLM, "gemma2": Gemma2ForCausalLM, "gemma3": Gemma3ForCausalLM}
    model_class[architecture](_config(architecture)).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def _pairs(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice(["?", ".", "", "\n"])

    pairs = [(text(rng.randint(1, 10)), text(rng.choice([1, 4, 12, 40, 300]))) for _ in range(24)]
    return [*pairs, (text(200), text(20))]  # a query past its 3/4 share


@pytest.mark.slow
def test_bge_gemma_matches_the_model_card_recipe(gemma_dir: Path) -> None:
    scorer = GenerativeScorer(str(gemma_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    assert scorer.template is BGE_RERANKER_V2_GEMMA
    assert "bge-reranker-v2-gemma" in scorer.recipe.source
    assert scorer.score_mode == "logit-sigmoid"
    # Gemma's code (embedding scaling, soft-capping, sliding windows) runs in the padded forward.
    assert type(scorer.engine.forward).__name__ == "PaddedForward"

    tokenizer = AutoTokenizer.from_pretrained(str(gemma_dir))
    pairs = _pairs(seed=4)
    suffix = len(tokenizer("\n" + BGE_PROMPT, add_special_tokens=False)["input_ids"])
    # The card's max_length covers BOS + query + "\n" + passage; the separator and prompt come after.
    expected = bge_reference_ids(tokenizer, pairs, max_length=MAX_LENGTH - suffix)
    got = [p.token_ids for q, d in pairs for p in scorer.encode(q, [d])]
    assert got == expected
    assert any(len(ids) == MAX_LENGTH for ids in expected), "some pairs must be truncated"

    model = AutoModelForCausalLM.from_pretrained(str(gemma_dir), dtype=torch.float32).eval()
    logits = last_logits_left_padded(model, expected, tokenizer.pad_token_id)
    yes = tokenizer.convert_tokens_to_ids("Yes")
    raw = logits[:, yes].tolist()
    assert max(raw) - min(raw) > 0.1, "scores must spread for the comparison to mean something"

    sigmoid = scorer.score_pairs(pairs)
    assert sigmoid == pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-5)
    logit = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(gemma_dir), max_length=MAX_LENGTH, score_mode="logit"
    )
    assert logit.score_pairs(pairs) == pytest.approx(raw, abs=1e-5)

    # The full-vocabulary probability normalises over every (capped) logit.
    vocab = GenerativeScorer.from_model(
        scorer.model,
        scorer.tokenizer,
        model=str(gemma_dir),
        max_length=MAX_LENGTH,
        score_mode="vocab-softmax",
    )
    expected_probability = torch.log_softmax(logits, dim=-1)[:, yes].exp().tolist()
    assert vocab.score_pairs(pairs) == pytest.approx(expected_probability, abs=1e-7, rel=1e-4)


def test_gemma2_softcap_is_applied(gemma_dir: Path) -> None:
    """Capping changes the scores: without it the label head would not match the model's logits."""
    model = AutoModelForCausalLM.from_pretrained(str(gemma_dir), dtype=torch.float32).eval()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is None:
        assert model.config.model_type == "gemma"  # Gemma 1 does not cap; the others here do
        return
    from genscore_core.scoring import LabelHead

    head = LabelHead(model)
    assert head.softcap == cap
    hidden = torch.randn(3, model.config.hidden_size) * 50  # large enough that tanh bends
    uncapped = hidden @ model.get_output_embeddings().weight[[0, 1]].T
    assert torch.allclose(head.label_logits(hidden, [0, 1]), cap * torch.tanh(uncapped / cap), atol=1e-5)
    assert not torch.allclose(head.label_logits(hidden, [0, 1]), uncapped, atol=1e-2)
