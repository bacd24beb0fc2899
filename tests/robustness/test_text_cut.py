"""Texts are cut before tokenization to what the prompt can use, and the prompts stay the same."""

from __future__ import annotations

import sys
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, BertTokenizerFast

from genscore_core import GenerativeScorer
from genscore_core.prompts import bounded_texts
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from genscore_core.truncation import (
    CUT_MARGIN_CHARS,
    NFC_CHARS_PER_BYTE,
    NFC_CHARS_PER_CHAR,
    max_chars_per_token,
)
from tests.reference_recipe import label_softmax_prob, official_qwen3_scores

MAX_LENGTH = 512


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def test_nfc_composition_bounds_hold_for_every_code_point() -> None:
    per_byte = per_char = 0.0
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        for form, decomposed in (("NFC", "NFD"), ("NFKC", "NFKD")):
            if unicodedata.normalize(form, char) != char:
                continue
            parts = len(unicodedata.normalize(decomposed, char))
            per_byte = max(per_byte, parts / len(char.encode()))
            per_char = max(per_char, parts)
    assert per_byte <= NFC_CHARS_PER_BYTE
    assert per_char <= NFC_CHARS_PER_CHAR


def test_the_qwen3_bound_comes_from_its_vocabulary(qwen_tokenizer: Any) -> None:
    longest = max(len(token) for token in qwen_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False))
    assert longest == 128  # 128 spaces, as bytes
    assert max_chars_per_token(qwen_tokenizer) == 192


def test_a_tokenizer_with_an_unknown_token_is_not_cut() -> None:
    tokenizer = BertTokenizerFast(vocab={"[UNK]": 0, "[PAD]": 1, "the": 2})
    assert max_chars_per_token(tokenizer) is None
    text = "x" * 1_000_000
    assert bounded_texts(tokenizer, [text], 8)[0] is text


# Texts that each stress one way a token can cover many characters, or a word can be long.
def _long_texts(length: int) -> dict[str, str]:
    return {
        "cjk": ("中文文本的检索与重排序。" * length)[:length],
        "emoji": ("👩‍👩‍👧‍👦🎉 ok " * length)[:length],
        "spaces": ("word" + " " * 300 + "\n\t\n") * (length // 300),
        "only_spaces": " " * length,
        "one_word": "a" * length,
        "dashes": "//" + "-" * length,
        "combining": ("U\u0308\u0304" * length)[:length],  # NFC composes each triple into U+01D5
        "mixed": ("Hello, wörld! 123 456 — ça va? " * length)[:length],
    }


@pytest.mark.parametrize("kind", sorted(_long_texts(10)))
def test_the_cut_keeps_more_than_the_budget(qwen_tokenizer: Any, kind: str) -> None:
    budget = 300
    bound = max_chars_per_token(qwen_tokenizer)
    assert bound is not None
    text = _long_texts(4 * ((budget + 1) * bound + CUT_MARGIN_CHARS))[kind]
    [cut] = bounded_texts(qwen_tokenizer, [text], budget)
    assert len(cut) < len(text)
    cut_ids = qwen_tokenizer(cut, add_special_tokens=False)["input_ids"]
    full_ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(cut_ids) > budget
    assert cut_ids[:budget] == full_ids[:budget]


@pytest.fixture(scope="module")
def model_and_scorer(tiny_model_dir: Path) -> tuple[Any, Any, GenerativeScorer]:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    return model, tokenizer, scorer


@pytest.mark.slow
def test_long_documents_score_as_with_full_tokenization(model_and_scorer: tuple[Any, Any, Any]) -> None:
    model, tokenizer, scorer = model_and_scorer
    length = 3 * ((MAX_LENGTH + 1) * 192 + CUT_MARGIN_CHARS)
    documents = list(_long_texts(length).values())
    pairs = [("which text is this?", document) for document in documents]
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=MAX_LENGTH)
    prompts = scorer.encode("which text is this?", documents)
    assert all(prompt.truncated and len(prompt.token_ids) == MAX_LENGTH for prompt in prompts)
    assert scorer.score_pairs(pairs) == pytest.approx(expected, abs=1e-5)


def test_long_raw_items_score_as_with_full_tokenization(model_and_scorer: tuple[Any, Any, Any]) -> None:
    model, tokenizer, scorer = model_and_scorer
    length = 3 * ((MAX_LENGTH + 1) * 192 + CUT_MARGIN_CHARS)
    items = [_long_texts(length)[kind] for kind in ("cjk", "spaces", "one_word")]
    labels = [9693, 2152]
    query_ids = tokenizer.encode("is it?", add_special_tokens=True)
    answer = scorer.score({"query": "is it?", "items": items, "label_token_ids": labels})
    for entry, item in zip(answer.data, items):
        full = tokenizer(item, add_special_tokens=False)["input_ids"]
        prompt = query_ids + full[: MAX_LENGTH - len(query_ids)]
        assert entry.score == pytest.approx(label_softmax_prob(model, prompt, labels), abs=1e-5)


class _CountingBackend:
    """A tokenizer's backend that counts (and slows) reads of its vocabulary."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        self.reads += 1
        time.sleep(0.05)  # long enough for every thread to ask before the first answer
        vocab: dict[str, int] = self._backend.get_vocab(with_added_tokens=with_added_tokens)
        return vocab


class _CountingTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.backend_tokenizer = _CountingBackend(tokenizer.backend_tokenizer)
        self.added_tokens_decoder = tokenizer.added_tokens_decoder


def test_concurrent_first_requests_read_the_vocabulary_once(qwen_tokenizer: Any) -> None:
    """A fresh server's first requests all need the bound at once; it is computed once, not by each."""
    tokenizer = _CountingTokenizer(qwen_tokenizer)
    with ThreadPoolExecutor(8) as pool:
        bounds = list(pool.map(lambda _: max_chars_per_token(tokenizer), range(8)))
    assert bounds == [192] * 8
    assert tokenizer.backend_tokenizer.reads == 1
