"""mxbai-rerank-v2 token for token: against mixedbread's recipe and the ``rerankers`` port of it."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from genscore_core import MXBAI_RERANK_V2, GenerativeScorer
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import (
    last_logits_left_padded,
    mxbai_fixed_tokens,
    mxbai_reference_ids,
    only_second,
)
from tests.helpers.tiny_models import tiny_sizes

WORDS = "what why capital France Paris river Seine museum tower token model search engine index".split()


@pytest.fixture(scope="module")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2ForCausalLM (mxbai-rerank-v2's architecture) with the real Qwen tokenizer."""
    out = tmp_path_factory.mktemp("tiny-qwen2") / "mxbai-rerank-tiny-v2"
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    config = Qwen2Config(
        **tiny_sizes(), max_position_embeddings=4096, initializer_range=0.1, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(11)
    Qwen2ForCausalLM(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def _pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        # Endings a separator would merge with when the body is tokenized whole: "?\n", ".\n", " \n".
        return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice(["?", ".", "!", " ", "\n", ""])

    return [(text(rng.randint(1, 12)), text(rng.choice([1, 3, 8, 30, 200, 900]))) for _ in range(count)]


def test_template_states_piecewise_tokenization() -> None:
    assert MXBAI_RERANK_V2.tokenization == "pieces"
    assert MXBAI_RERANK_V2.body_pieces == ("{instruction}query: {query}", "\n", "document: {document}")


@pytest.mark.slow
@pytest.mark.parametrize("instruction", [None, "Find the passage that answers the question?"])
def test_token_ids_and_scores_match_mixedbreads_recipe(tiny_qwen2_dir: Path, instruction: str | None) -> None:
    scorer = GenerativeScorer(
        str(tiny_qwen2_dir), device="cpu", dtype="float32", max_length=400, instruction=instruction
    )
    assert scorer.template is MXBAI_RERANK_V2  # picked from the folder's name
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen2_dir))
    pairs = _pairs(40, seed=5)
    expected = mxbai_reference_ids(
        tokenizer,
        pairs,
        max_length=400 - mxbai_fixed_tokens(tokenizer),
        model_max_length=4096,
        instruction=instruction,
    )
    got = [p.token_ids for q, d in pairs for p in scorer.encode(q, [d])]
    assert got == expected
    # The pairs are ones where tokenizing the body whole gives other ids, and some are truncated.
    whole = MXBAI_RERANK_V2.model_copy(
        update={"tokenization": "whole", "body_pieces": (), "suffix_pieces": ()}
    )
    whole_scorer = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, template=whole, max_length=400)
    differing = sum(whole_scorer.encode(q, [d])[0].token_ids != ids for (q, d), ids in zip(pairs, expected))
    assert differing >= len(pairs) // 2
    assert any(len(ids) == 400 for ids in expected)

    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen2_dir), dtype=torch.float32).eval()
    logits = last_logits_left_padded(model, expected, tokenizer.pad_token_id)
    one, zero = tokenizer.convert_tokens_to_ids("1"), tokenizer.convert_tokens_to_ids("0")
    reference = [1 / (1 + math.exp(-(row[one] - row[zero]).item())) for row in logits]
    scores = scorer.score_pairs(pairs)
    worst = max(abs(a - b) for a, b in zip(scores, reference, strict=True))
    assert worst <= 1e-5, worst


class _Transformers4Tokenizer:
    """The tokenizer, plus the ``prepare_for_model`` that transformers 5 removed from fast tokenizers
    and the ``rerankers`` port still calls (only its ``only_second`` truncation is used there)."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> object:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._tokenizer(*args, **kwargs)  # type: ignore[operator]

    def prepare_for_model(
        self, first: list[int], second: list[int], **kwargs: object
    ) -> dict[str, list[int]]:
        assert kwargs["truncation"] == "only_second" and not kwargs["add_special_tokens"]
        return {"input_ids": only_second(first, second, int(kwargs["max_length"]))}  # type: ignore[call-overload]


@pytest.mark.slow
def test_rerankers_mxbai_v2_ranker_offline(tiny_qwen2_dir: Path) -> None:
    """The ``rerankers`` package's port, run offline on the local folder."""
    from rerankers.models.mxbai_v2 import MxBaiV2Ranker

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen2_dir))
    max_length = 400
    ranker = MxBaiV2Ranker(
        str(tiny_qwen2_dir), device="cpu", dtype=torch.float32, verbose=0, max_length=max_length
    )
    ranker.tokenizer = _Transformers4Tokenizer(ranker.tokenizer)
    scorer = GenerativeScorer(str(tiny_qwen2_dir), device="cpu", dtype="float32", max_length=max_length)
    # The port caps documents at a quarter of its budget (mixedbread's code does not), so compare
    # on pairs short enough that no cap applies.
    pairs = [(q, d) for q, d in _pairs(40, seed=9) if len(tokenizer.encode(d)) < 60]
    assert len(pairs) >= 10
    budget = max_length - mxbai_fixed_tokens(tokenizer)
    ranker.max_length = budget
    batch = ranker._prepare_batch([q for q, _ in pairs], [d for _, d in pairs])
    port_ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert port_ids == [scorer.encode(q, [d])[0].token_ids for q, d in pairs]
    logit_differences = ranker._predict([q for q, _ in pairs], [d for _, d in pairs]).tolist()
    scores = scorer.score_pairs(pairs)
    for score, difference in zip(scores, logit_differences, strict=True):
        assert score == pytest.approx(1 / (1 + math.exp(-difference)), abs=1e-5)
