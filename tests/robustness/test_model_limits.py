"""Settings a loaded model cannot honour are refused when the scorer is built, not at the first long
prompt: ``max_length`` past a learned position table. And a ``torch`` dtype is a valid ``dtype``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from genscore_core import ConfigurationError, GenerativeScorer, ScorerConfig
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import official_qwen3_scores


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 (learned positions, 128 of them) with the real Qwen3 tokenizer."""
    out = tmp_path_factory.mktemp("gpt2-positions")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=151669, n_positions=128, n_embd=32, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir())).save_pretrained(out)
    return out


def test_max_length_past_a_learned_position_table_is_refused(gpt2_folder: Path) -> None:
    # Before: built fine, then a long document hit "IndexError: index out of range in self" in the
    # forward (on CUDA a device-side assert, after which every call in the process fails).
    with pytest.raises(
        ConfigurationError, match=r"max_length=512 .*GPT2LMHeadModel.* \(128 positions\)"
    ) as info:
        GenerativeScorer(
            str(gpt2_folder), device="cpu", dtype="float32", template="qwen3-reranker", max_length=512
        )
    assert info.value.setting == "max_length"


def test_the_position_table_is_the_default_limit_and_long_documents_fit_it(gpt2_folder: Path) -> None:
    scorer = GenerativeScorer(str(gpt2_folder), device="cpu", dtype="float32", template="qwen3-reranker")
    assert scorer.max_length == 128
    [prompt] = scorer.encode("which word?", ["word " * 400])
    assert prompt.num_tokens <= 128 and prompt.truncated
    [score] = scorer.score_pairs([("which word?", "word " * 400)])
    assert 0.0 <= score <= 1.0


def test_rotary_models_may_run_past_max_position_embeddings(tiny_model_dir: Path) -> None:
    """Qwen3 computes its positions: a longer max_length is the user's call, not an out-of-range index."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=10_000)
    assert scorer.max_length == 10_000
    assert scorer.model.config.max_position_embeddings < 10_000


def test_a_torch_dtype_is_a_dtype_setting(tiny_model_dir: Path) -> None:
    # Before: pydantic refused torch.bfloat16 ("Input should be a valid string") although the loader
    # takes a torch dtype, as transformers' from_pretrained does.
    assert ScorerConfig(dtype=torch.bfloat16).run.dtype == "bfloat16"
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype=torch.float32, max_length=512)
    assert scorer.model.dtype == torch.float32
    pairs = [("what do cats eat?", "Cats eat fish."), ("what do cats eat?", "The sky is blue.")]
    expected = official_qwen3_scores(scorer.model, scorer.tokenizer, pairs, max_length=512)
    assert scorer.score_pairs(pairs) == pytest.approx(expected, abs=1e-5)
