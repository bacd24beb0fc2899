"""Texts are cut before tokenization to what the prompt can use, and the prompts stay the same."""

from __future__ import annotations

import sys
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, BertTokenizerFast

from genscore_core import QWEN3_RERANKER, GenerativeScorer, PromptTooLongError
from genscore_core.prompts import TemplatePromptBuilder, bounded_texts, build_raw_prompts
from genscore_core.protocol import GenerativeScoringRequest
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from genscore_core.truncation import (
    CUT_MARGIN_CHARS,
    NFC_CHARS_PER_BYTE,
    NFC_CHARS_PER_CHAR,
    max_chars_per_token,
)
from tests.helpers.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    label_softmax_prob,
    official_qwen3_scores,
)

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


@pytest.mark.parametrize("trials", [False, True], ids=["bound", "trials"])
@pytest.mark.parametrize("kind", sorted(_long_texts(10)))
def test_the_cut_keeps_more_than_the_budget(qwen_tokenizer: Any, kind: str, trials: bool) -> None:
    budget = 300
    bound = max_chars_per_token(qwen_tokenizer)
    assert bound is not None
    text = _long_texts(4 * ((budget + 1) * bound + CUT_MARGIN_CHARS))[kind]
    # Given the tokenizer's lock, the cut is found by trial (cut_where_settled), else at the bound.
    [cut] = bounded_texts(qwen_tokenizer, [text], budget, threading.Lock() if trials else None)
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


class _CharCountingBackend:
    """A Rust tokenizer that counts the characters it is given to tokenize."""

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "chars", 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._backend, name, value)  # settings the Hugging Face wrapper writes

    def reset(self) -> None:
        object.__setattr__(self, "chars", 0)

    def _count(self, texts: Any) -> None:
        texts = [texts] if isinstance(texts, str) else texts
        object.__setattr__(self, "chars", self.chars + sum(len(t) for t in texts if isinstance(t, str)))

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(text)
        return self._backend.encode(text, *args, **kwargs)

    def encode_batch(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(texts)
        return self._backend.encode_batch(texts, *args, **kwargs)

    def encode_batch_fast(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(texts)
        return self._backend.encode_batch_fast(texts, *args, **kwargs)


def _counting_tokenizer() -> tuple[Any, _CharCountingBackend]:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    counter = _CharCountingBackend(tokenizer._tokenizer)
    tokenizer._tokenizer = counter
    return tokenizer, counter


def _official_qwen3_ids(tokenizer: Any, query: str, document: str, max_length: int) -> list[int]:
    """The prompt ids of the model card's recipe (tests/helpers/reference_recipe.py): the body tokenized whole
    and tail-truncated to what the prefix and suffix leave."""
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    body = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    ids = tokenizer([body], truncation="longest_first", max_length=max_length - len(prefix) - len(suffix))[
        "input_ids"
    ][0]
    return [*prefix, *ids, *suffix]


# Texts of short tokens (a token every 1-8 characters): a prompt reads a small part of them.
SHORT_TOKEN_KINDS = ("cjk", "emoji", "one_word", "combining", "mixed", "digits")
# Characters a prompt may have tokenized per token of max_length (trials, then the prompt's own
# tokenizations). Cut at the worst-case bound alone, a text of short tokens cost 2 * 192 or more.
WORK_PER_PROMPT_TOKEN = 128


@pytest.mark.parametrize("kind", SHORT_TOKEN_KINDS)
def test_a_long_document_is_tokenized_no_further_than_its_prompt_reads(
    qwen_tokenizer: Any, kind: str
) -> None:
    max_length = 2048
    bound = max_chars_per_token(qwen_tokenizer)
    assert bound is not None
    # Longer than the worst-case cut ((budget + 1) * 192 + margin, about 390k characters), which
    # used to be tokenized whole, twice: for a 50 MB document, 1.5 million tokens at 8192.
    length = 2 * max_length * bound
    text = {**_long_texts(length), "digits": ("1234567890" * length)[:length]}[kind]
    tokenizer, counter = _counting_tokenizer()
    builder = TemplatePromptBuilder(
        tokenizer, QWEN3_RERANKER, max_length=max_length, tokenizer_lock=threading.Lock()
    )
    counter.reset()
    [prompt] = builder.build("which text is this?", [text])
    assert counter.chars < WORK_PER_PROMPT_TOKEN * max_length, counter.chars
    assert prompt.truncated
    assert prompt.token_ids == _official_qwen3_ids(qwen_tokenizer, "which text is this?", text, max_length)


@pytest.mark.parametrize("kind", [*SHORT_TOKEN_KINDS, "spaces", "only_spaces", "dashes"])
def test_long_queries_and_raw_items_are_tokenized_no_further_than_their_prompt_reads(
    qwen_tokenizer: Any, kind: str
) -> None:
    max_length = 1024
    length = 3 * ((max_length + 1) * 192 + CUT_MARGIN_CHARS)
    text = {**_long_texts(length), "digits": ("1234567890" * length)[:length]}[kind]
    full = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    tokenizer, counter = _counting_tokenizer()
    request = GenerativeScoringRequest(query="is it?", items=[text], label_token_ids=[9693])
    [prompt] = build_raw_prompts(tokenizer, request, max_length=max_length)
    query_ids = qwen_tokenizer.encode("is it?")
    assert prompt.token_ids == query_ids + full[: max_length - len(query_ids)]
    # A query that long is refused, whatever it is cut to first.
    with pytest.raises(PromptTooLongError, match="leaves no room for item 0"):
        build_raw_prompts(
            tokenizer, request.model_copy(update={"query": text, "items": ["x"]}), max_length=max_length
        )
    if kind in SHORT_TOKEN_KINDS:
        assert counter.chars < 2 * WORK_PER_PROMPT_TOKEN * max_length, counter.chars
    # The templated query keeps its share of the prompt, the first tokens of the uncut query in the
    # body (cut after its last token kept, the body tokenized again).
    builder = TemplatePromptBuilder(tokenizer, QWEN3_RERANKER, max_length=max_length, query_share=0.5)
    counter.reset()
    [capped] = builder.build(text, ["the document"])
    if kind in SHORT_TOKEN_KINDS:
        assert counter.chars < WORK_PER_PROMPT_TOKEN * max_length, counter.chars
    assert capped.token_ids == _qwen3_ids_with_capped_query(
        qwen_tokenizer, text, "the document", builder._query_cap
    )


def _qwen3_ids_with_capped_query(tokenizer: Any, query: str, document: str, cap: int) -> list[int]:
    def body(query: str) -> str:
        return f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"

    start = body("").index("<Query>: ") + len("<Query>: ")
    offsets = tokenizer(body(query), add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    first = next(i for i, (_, end) in enumerate(offsets) if end > start)
    cut_at = offsets[first + cap - 1][1] - start
    ids = tokenizer.encode(body(query[:cut_at]), add_special_tokens=False)
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    return [*prefix, *ids, *tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)]


@pytest.mark.parametrize("kind", ["digits", "cjk"])
def test_max_tokens_per_doc_tokenizes_no_further_than_it_keeps(
    model_and_scorer: tuple[Any, Any, Any], kind: str
) -> None:
    model, reference_tokenizer, _ = model_and_scorer
    keep = 256
    length = 2 * keep * 192  # past the worst-case cut for `keep` tokens, which was tokenized whole
    text = {**_long_texts(length), "digits": ("1234567890" * length)[:length]}[kind]
    tokenizer, counter = _counting_tokenizer()
    scorer = GenerativeScorer.from_model(model, tokenizer, max_length=MAX_LENGTH)
    counter.reset()
    [result] = scorer.rerank("which text is this?", [text], max_tokens_per_doc=keep)
    assert counter.chars < WORK_PER_PROMPT_TOKEN * keep, counter.chars
    # The recipe scores the document cut after its first `keep` tokens of the whole text.
    spans = reference_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    [expected] = official_qwen3_scores(
        model,
        reference_tokenizer,
        [("which text is this?", text[: spans[keep - 1][1]])],
        max_length=MAX_LENGTH,
    )
    assert result.score == pytest.approx(expected, abs=1e-5)
