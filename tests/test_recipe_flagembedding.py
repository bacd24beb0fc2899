"""bge-reranker-v2-gemma against FlagEmbedding's own ``FlagLLMReranker``, run offline on a tiny Gemma.

tests/test_recipe_gemma.py checks the recipe against a reimplementation of the model card's
``get_inputs``; here the peer's library class itself builds the prompts and scores them. The ids it
feeds the model are read at the model's forward, so what is compared is exactly what it scores.

Like tests/test_recipe_gemma.py, the model carries the real Qwen3 tokenizer (no Gemma tokenizer is
available offline), with ``<|endoftext|>`` as BOS. Its pad token is a different one, ``<|fim_pad|>``,
as in the real model (``<bos>`` 2, ``<pad>`` 0): ``FlagLLMReranker`` leaves BOS out when the two are the
same token (the last test shows it).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import random
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM

from genscore_core import GenerativeScorer
from genscore_core.templates import BGE_RERANKER_V2_GEMMA
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import BGE_PROMPT
from tests.helpers.tiny_models import special_ids, tiny_sizes

WORDS = "panda bear China bamboo forest what is the giant species endemic hi capital river".split()
FLAG_MAX_LENGTH = 120  # FlagLLMReranker's max_length, which the model card calls max_length too


def _flag_llm_reranker() -> Any:
    """FlagEmbedding's ``FlagLLMReranker`` class (``decoder_only/base.py``'s ``BaseLLMReranker``).

    ``import FlagEmbedding`` (1.4.2) fails with transformers 5.24: the package's __init__ files import
    every model eagerly, and the layer-wise MiniCPM reranker imports
    ``transformers.modeling_attn_mask_utils``, which that release no longer has. FlagLLMReranker
    does not use that model, so the four package __init__ files on the way to it are replaced by empty
    packages pointing at the same folders; every module FlagLLMReranker imports (its own file,
    AbsReranker, the tokenizer compatibility helpers) is FlagEmbedding's, unchanged.
    """
    spec = importlib.util.find_spec("FlagEmbedding")
    assert spec is not None and spec.origin is not None, "FlagEmbedding is in the test extra"
    root = Path(spec.origin).parent
    for name in (
        "FlagEmbedding",
        "FlagEmbedding.inference",
        "FlagEmbedding.inference.reranker",
        "FlagEmbedding.inference.reranker.decoder_only",
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    return importlib.import_module("FlagEmbedding.inference.reranker.decoder_only.base").BaseLLMReranker


@pytest.fixture(scope="module")
def flag_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flag") / "bge-reranker-v2-gemma-tiny"
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    tokenizer.bos_token = "<|endoftext|>"
    tokenizer.pad_token = "<|fim_pad|>"
    assert tokenizer.bos_token_id != tokenizer.pad_token_id
    config = GemmaConfig(
        **tiny_sizes(), head_dim=16, max_position_embeddings=2048, initializer_range=0.1,
        **special_ids(tokenizer, "pad", "bos"), eos_token_id=151645,
    )  # fmt: skip
    torch.manual_seed(23)
    GemmaForCausalLM(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def flag_class() -> Any:
    return _flag_llm_reranker()


@pytest.fixture(scope="module")
def flag(flag_class: Any, flag_dir: Path) -> Any:
    return flag_class(str(flag_dir), devices="cpu", max_length=FLAG_MAX_LENGTH)


def _suffix_length(tokenizer: Any) -> int:
    return sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in ("\n", BGE_PROMPT))


def _fed_ids(flag: Any, pair: tuple[str, str]) -> list[int]:
    """The ids FlagLLMReranker gives the model for one pair, read at the model's forward."""
    fed: list[list[int]] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        (row,), (mask,) = kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()
        fed.append([token for token, keep in zip(row, mask) if keep])

    hook = flag.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        flag.compute_score([pair], batch_size=1)
    finally:
        hook.remove()
    # Its first forward sizes the batch (OOM probing), the second scores; both get the same prompt.
    assert len(fed) == 2 and fed[0] == fed[1]
    return fed[1]


def _pairs_that_fit(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        # "?\n" and ".\n" would be one token if the pieces were tokenized together.
        return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice(["?", ".", "", "\n"])

    return [(text(rng.randint(1, 10)), text(rng.choice([1, 4, 12, 40]))) for _ in range(16)]


@pytest.mark.slow
def test_ids_and_scores_equal_flag_llm_reranker(flag_dir: Path, flag: Any) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(flag_dir))
    # genscore's max_length is the whole prompt; the card's (and FlagLLMReranker's) leaves out the
    # separator and prompt that follow the passage.
    max_length = FLAG_MAX_LENGTH + _suffix_length(tokenizer)
    scorer = GenerativeScorer(str(flag_dir), device="cpu", dtype="float32", max_length=max_length)
    assert scorer.template is BGE_RERANKER_V2_GEMMA
    pairs = _pairs_that_fit(seed=7)

    got = [p.token_ids for q, d in pairs for p in scorer.encode(q, [d])]
    assert all(len(ids) < max_length for ids in got), "these pairs must fit, untruncated"
    assert all(ids[0] == tokenizer.bos_token_id for ids in got)
    assert got == [_fed_ids(flag, pair) for pair in pairs]

    # Batched, so FlagLLMReranker's length sort, right padding to a multiple of 8 and its own
    # last-position pooling are in play. Both run the same float32 weights on CPU; they differ in
    # batch composition and in genscore multiplying only the "Yes" row of the LM head, so the logits
    # agree to float32 rounding (under 1e-6 here), far inside 1e-5 and far below the spread asserted.
    raw = flag.compute_score(pairs, batch_size=8)
    assert max(raw) - min(raw) > 0.1, "scores must spread for the comparison to mean something"
    logit = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(flag_dir), max_length=max_length, score_mode="logit"
    )
    assert logit.score_pairs(pairs) == pytest.approx(raw, abs=1e-5)
    normalized = flag.compute_score(pairs, batch_size=8, normalize=True)
    assert normalized == pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-12)
    assert scorer.score_mode == "logit-sigmoid"
    assert scorer.score_pairs(pairs) == pytest.approx(normalized, abs=1e-5)


@pytest.mark.slow
def test_over_long_passage_flag_llm_reranker_keeps_more_than_the_card(flag_dir: Path, flag: Any) -> None:
    """docs/models.md: FlagLLMReranker's max_length caps the passage alone, and the card's caps
    BOS + query + separator + passage; genscore follows the card."""
    tokenizer = AutoTokenizer.from_pretrained(str(flag_dir))
    suffix = _suffix_length(tokenizer)
    max_length = FLAG_MAX_LENGTH + suffix
    pair = ("what is the giant panda?", " ".join(["bamboo forest China"] * 200))
    query_ids = tokenizer(f"A: {pair[0]}", add_special_tokens=False)["input_ids"]
    sep = tokenizer("\n", add_special_tokens=False)["input_ids"]

    flag_ids = _fed_ids(flag, pair)
    # BOS, the query, "\n", FLAG_MAX_LENGTH tokens of "B: {passage}", then "\n" and the prompt.
    assert len(flag_ids) == 1 + len(query_ids) + len(sep) + FLAG_MAX_LENGTH + suffix
    assert len(flag_ids) > max_length

    scorer = GenerativeScorer(str(flag_dir), device="cpu", dtype="float32", max_length=max_length)
    (card,) = scorer.encode(pair[0], [pair[1]])
    assert len(card.token_ids) == max_length  # the card's cap: the whole prompt
    # Same start (BOS, query, separator, the passage's first tokens) and same end; the card keeps
    # 1 + query + separator fewer passage tokens.
    assert card.token_ids[:-suffix] == flag_ids[: max_length - suffix]
    assert card.token_ids[-suffix:] == flag_ids[-suffix:]

    # That is the whole difference: genscore given FlagLLMReranker's length builds its ids and scores.
    longer = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(flag_dir), max_length=len(flag_ids), score_mode="logit"
    )
    (same,) = longer.encode(pair[0], [pair[1]])
    assert same.token_ids == flag_ids
    (flag_score,) = flag.compute_score([pair])
    assert longer.score_pairs([pair]) == pytest.approx([flag_score], abs=1e-5)
    (card_score,) = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(flag_dir), max_length=max_length, score_mode="logit"
    ).score_pairs([pair])
    assert abs(card_score - flag_score) > 1e-3, "the truncated prompts must score differently"


@pytest.mark.slow
def test_flag_llm_reranker_leaves_bos_out_when_it_is_the_pad_token(
    flag_class: Any, flag_dir: Path, tmp_path: Path, flag: Any
) -> None:
    """Why this file's tokenizer has its own pad token: FlagLLMReranker adds BOS only when it differs
    from the pad token; the card always adds it, and so does genscore."""
    same_pad = tmp_path / "bge-reranker-v2-gemma-tiny-bos-pad"
    shutil.copytree(flag_dir, same_pad)
    tokenizer = AutoTokenizer.from_pretrained(str(flag_dir))
    tokenizer.pad_token = tokenizer.bos_token
    tokenizer.save_pretrained(str(same_pad))
    peer = flag_class(str(same_pad), devices="cpu", max_length=FLAG_MAX_LENGTH)
    pair = ("what is the giant panda?", "a bear species endemic to China.")
    scorer = GenerativeScorer(
        str(same_pad), device="cpu", dtype="float32", max_length=FLAG_MAX_LENGTH + _suffix_length(tokenizer)
    )
    (ours,) = scorer.encode(pair[0], [pair[1]])
    assert ours.token_ids[0] == tokenizer.bos_token_id
    assert _fed_ids(peer, pair) == ours.token_ids[1:]
    assert _fed_ids(flag, pair) == ours.token_ids
