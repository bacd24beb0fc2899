"""Truncation on token lists that never cuts fixed template text.

Plain tail truncation (``prompt[:max_len]``) drops the answer cue at the end of a reranker prompt and
makes the score meaningless. Here only the substituted document (and, past its share of the budget,
the query) is shortened.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from genscore_core.errors import PromptTooLongError
from genscore_core.templates import Span


def token_range(offsets: Sequence[tuple[int, int]], span: Span) -> tuple[int, int]:
    """Half-open range of the tokens whose characters overlap ``span`` (empty when none do)."""
    first = last = -1
    for position, (start, end) in enumerate(offsets):
        if start < span.end and end > span.start:
            if first < 0:
                first = position
            last = position
    if first < 0:
        return (0, 0)
    return (first, last + 1)


def query_token_cap(room: int, query_share: float) -> int:
    """The most tokens the query may keep when a prompt has to be shortened: ``query_share`` of
    ``room``, the tokens left to the query and the document (what the fixed text of the prompt
    leaves), so that the document keeps the rest."""
    return max(1, int(room * query_share))


def drop_tail_of_range(ids: list[int], token_span: tuple[int, int], excess: int) -> list[int]:
    """Remove ``excess`` tokens from the end of ``token_span`` (tokens after the span are kept)."""
    start, end = token_span
    keep = end - start - excess
    if keep < 0:
        raise ValueError("cannot drop more tokens than the range holds")
    return ids[: start + keep] + ids[end:]


def truncate_raw(
    query_ids: list[int],
    item_ids: list[int],
    max_length: int,
    item_first: bool,
    index: int,
    query_cut: bool = False,
) -> tuple[list[int], bool]:
    """Concatenate query and item ids, shortening the item (never the query) to fit ``max_length``.

    ``query_cut``: the query's text was cut before tokenization (:func:`cut_to_token_budget`), so
    ``query_ids`` are only its first tokens and an error says "at least"."""
    excess = len(query_ids) + len(item_ids) - max_length
    truncated = excess > 0
    if truncated:
        # An item cut away entirely would score the query alone, which is not what was asked.
        if excess >= max(len(item_ids), 1):
            size = f"at least {len(query_ids)}" if query_cut else f"{len(query_ids)}"
            raise PromptTooLongError(
                f"the query is {size} tokens, which leaves no room for item {index} within "
                f"max_length={max_length}; shorten the query or raise max_length",
                param="query",
                index=index,
            )
        item_ids = item_ids[: len(item_ids) - excess]
    prompt = item_ids + query_ids if item_first else query_ids + item_ids
    if not prompt:
        raise PromptTooLongError(
            f"item {index} and the query are both empty: there is nothing to score",
            param="items",
            index=index,
        )
    return prompt, truncated


# -- cutting text before tokenization -----------------------------------------------------------------

# Characters of text that one *byte* of NFC/NFKC-normalized text can stand for: U+01D5 (2 bytes in
# UTF-8) is composed from 3 characters. Checked over every code point by the tests.
NFC_CHARS_PER_BYTE = 1.5
# Characters that one normalized *character* can stand for: U+1F82 is composed from 4.
NFC_CHARS_PER_CHAR = 4
# Normalizers that never merge characters: a normalized character stands for at most one of the text.
_NON_MERGING_NORMALIZERS = frozenset({"NFD", "NFKD", "Lowercase", "Prepend"})
_COMPOSING_NORMALIZERS = frozenset({"NFC", "NFKC"})
# Extra characters kept past the bound, so that the word the cut falls in (whose tokens can change)
# lies well after every token that can be kept.
CUT_MARGIN_CHARS = 4096

_bounds: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
_bounds_lock = threading.Lock()


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of input text that any one token of ``tokenizer`` can cover.

    ``None`` when no bound exists: a model with an unknown-word token (one ``[UNK]`` can stand for a
    whole word of any length) or a normalizer that may delete text. Cached per tokenizer.
    """
    # Computed under the lock: it reads the whole vocabulary (about 0.1-0.4 s holding the interpreter
    # lock for Qwen3's 151k entries), and a fresh server's first concurrent requests would each
    # compute it at once otherwise, stalling every thread of the process for seconds.
    with _bounds_lock:
        if tokenizer not in _bounds:
            _bounds[tokenizer] = _chars_per_token_bound(tokenizer)
        return _bounds[tokenizer]


def _chars_per_token_bound(tokenizer: Any) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = backend.model
    if type(model).__name__ != "BPE" or (model.unk_token is not None and not model.byte_fallback):
        return None
    factor = _normalizer_factor(backend.normalizer, _is_byte_level(backend))
    if factor is None:
        return None
    longest = max((len(token) for token in backend.get_vocab(with_added_tokens=False)), default=1)
    # Added (special) tokens are matched in the raw text, before normalization.
    added = max((len(str(token)) for token in tokenizer.added_tokens_decoder.values()), default=1)
    return max(math.ceil(longest * factor), added, 1)


def _is_byte_level(backend: Any) -> bool:
    state = backend.pre_tokenizer.__getstate__() if backend.pre_tokenizer is not None else b""
    return b'"ByteLevel"' in state


def _normalizer_factor(normalizer: Any, byte_level: bool) -> float | None:
    """Characters of text per character of a vocabulary entry, or ``None`` when unbounded."""
    if normalizer is None:
        return 1.0
    spec = json.loads(normalizer.__getstate__())
    steps = spec["normalizers"] if spec.get("type") == "Sequence" else [spec]
    factor = 1.0
    for step in steps:
        kind = step.get("type")
        if kind in _COMPOSING_NORMALIZERS:
            # A byte-level vocabulary entry is one character per byte of normalized text.
            factor *= NFC_CHARS_PER_BYTE if byte_level else NFC_CHARS_PER_CHAR
        elif kind == "Replace" and "String" in step.get("pattern", {}) and step.get("content"):
            factor *= max(1.0, len(step["pattern"]["String"]) / len(step["content"]))
        elif kind not in _NON_MERGING_NORMALIZERS:
            return None  # Strip, StripAccents, BertNormalizer... may delete characters
    return factor


def cut_to_token_budget(texts: Sequence[str], tokens: int, chars_per_token: int | None) -> list[str]:
    """Shorten each text, before it is tokenized, to a prefix that still holds more than ``tokens`` tokens.

    A prompt can keep at most ``tokens`` tokens of any one text, so tokenizing a long text whole (an
    8 MB document, with character offsets) only costs memory. Each text longer than
    ``limit = (tokens + 1) * chars_per_token + CUT_MARGIN_CHARS`` characters is cut to its first
    ``limit`` characters.

    Why the cut text still fills the budget: every token covers at most ``chars_per_token``
    characters of the text (:func:`max_chars_per_token`: the longest vocabulary entry, in bytes for a
    byte-level vocabulary, since one character is at least one byte, times what the normalizer can
    merge into one character or byte; a vocabulary without an unknown-word token loses no text, so
    the tokens cover every character). ``n`` characters therefore make at least
    ``n / chars_per_token`` tokens, and the cut text makes at least ``tokens + 1`` tokens from its
    first ``(tokens + 1) * chars_per_token`` characters alone: the text still overflows the budget, is
    marked truncated, and truncation keeps only tokens that lie within those characters.

    Why those tokens are the same as the uncut text's: pre-tokenizers split text into words by
    looking at most one character ahead, and BPE encodes each word on its own, so only the word the
    cut falls into can be encoded differently. The kept tokens end at least ``chars_per_token +
    CUT_MARGIN_CHARS`` characters before the cut; a difference would have to travel back that far
    through one word's merges. The tests compare cut and uncut prompts on long CJK, emoji,
    whitespace-only and single-word texts.

    ``chars_per_token=None`` (no bound for this tokenizer) leaves the texts whole.
    """
    if chars_per_token is None:
        return list(texts)
    limit = (tokens + 1) * chars_per_token + CUT_MARGIN_CHARS
    return [text[:limit] if len(text) > limit else text for text in texts]


TRIAL_CHARS_PER_TOKEN = 6
"""Characters per token that :func:`cut_where_settled` first tries a long text at: English averages
about 4.5 on Qwen3's vocabulary, so one trial usually settles an English text; CJK, digits and emoji
make more tokens per character and settle sooner still."""

TokenOffsets = Callable[[str], Sequence[tuple[int, int]]]
"""Tokenizes one text (no special tokens) and gives each token's character span."""


def cut_where_settled(
    texts: Sequence[str], tokens: int, chars_per_token: int, offsets_of: TokenOffsets
) -> list[str]:
    """Shorten each long text to a prefix, found by trial, that overflows a ``tokens`` budget with
    tokens of the uncut text: what is tokenized follows the tokens a prompt can keep, not the
    worst case :func:`cut_to_token_budget` must allow for.

    That bound lets every token cover ``chars_per_token`` characters (192 on Qwen3: a run of 128
    spaces), so a document of digits, CJK or emoji, at a token for every character or two, was
    tokenized 100-190 times further than any prompt reads it: 1.5 million tokens, about 0.8 GB and
    seconds for each 8192-token prompt's document.

    A trial tokenizes the text cut at ``n`` characters. Its token is *settled* when it starts at
    least ``margin = chars_per_token + CUT_MARGIN_CHARS`` characters into the text and ends as far
    before the cut: by :func:`cut_to_token_budget`'s argument, neither the text after the cut nor the
    text a prompt puts before it can change such a token. A trial with more than ``tokens`` settled
    tokens is kept as the cut: placed in a prompt, the text still makes more than ``tokens`` tokens,
    so it overflows, and truncation keeps only tokens before the settled ones end, the uncut text's.

    Trials start at ``(tokens + 1) * TRIAL_CHARS_PER_TOKEN + 2 * margin`` characters; each next one
    is where the last one's characters per settled token say the text settles (at least twice as
    long). A text is tried only while it is over twice the trial's length, so a trial costs less than
    the cut saves; a text of long tokens (a run of spaces, 128 characters a token) is tried once and
    keeps :func:`cut_to_token_budget`'s cut, which it should already have.
    """
    margin = chars_per_token + CUT_MARGIN_CHARS
    first_trial = (tokens + 1) * TRIAL_CHARS_PER_TOKEN + 2 * margin
    return [_settled_prefix(text, tokens, margin, first_trial, offsets_of) for text in texts]


def _settled_prefix(text: str, tokens: int, margin: int, length: int, offsets_of: TokenOffsets) -> str:
    while len(text) > 2 * length:
        trial = text[:length]
        settled_end = length - margin
        settled = sum(1 for start, end in offsets_of(trial) if start >= margin and end <= settled_end)
        if settled > tokens:
            return trial
        # The next trial where this one's characters per token, with a quarter to spare, would settle
        # (at least twice as long): a text of long tokens, past the point where trying pays, ends here.
        chars_per_settled = (settled_end - margin) / max(settled, 1)
        length = max(2 * length, 2 * margin + math.ceil(1.25 * (tokens + 1) * chars_per_settled))
    return text
