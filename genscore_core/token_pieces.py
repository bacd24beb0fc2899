"""Long texts tokenized in pieces, so that the tokenizer's threads share a small call evenly.

The Rust tokenizer's batch call gives each text to one thread. A small call (``rerank`` of 20
documents of 128-512 words) then lasts as long as the threads that drew the longest documents: on
an H200 host's 16 cores the 20 bodies took 2.8-3.0 ms where the longest alone took 1.4 ms
(docs/benchmarks.md, "Small calls"). Cut into pieces of about :data:`PIECE_CHARS` characters, the
same work spreads over every thread.

Cutting is exact only where the tokenizer cannot join tokens across the cut. It is done only for
tokenizers whose every step is known to split there anyway (:func:`splits_exactly`), and only
before a space that stands between two ASCII letters:

* the normalizer is none or NFC: NFC composes a character with the combining marks after it (and
  Hangul jamo), never across an ASCII space, and changes neither ASCII letters nor the space;
* the pre-tokenizer is byte-level BPE's regex split of Qwen2/Qwen3 or Llama 3
  (:data:`SPLIT_PATTERNS`): the letter run ``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+`` (or a contraction)
  that holds the letter before the cut ends at the space, and the match after it starts at the
  space (" word"), as it does at the start of a text; no alternative reads across a letter, so every
  other match is the same in the pieces as in the whole text;
* the model is BPE without dropout: it merges within each pre-token, never across two;
* no added token holds whitespace or strips it (``lstrip``/``rstrip``/``single_word``), so no added
  token is matched across the cut.

So the ids of the whole text are the ids of its pieces, one after the other. The tests compare
both on long English, mixed scripts, contractions, digits, punctuation, newlines and added tokens.
"""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from collections.abc import Sequence
from typing import Any

PIECE_CHARS = 1024
"""Characters of a piece (about 170 English tokens): small enough that a 20-document call makes
several pieces per thread, large enough that each piece is mostly tokenizing, not overhead."""

MAX_TEXTS = 24
"""Only calls of at most this many texts are cut: with not many more texts than a 16-core host has
threads, one thread per text leaves the call waiting for its longest texts. Measured on an H200 host's 16 cores
(docs/benchmarks.md, "Small calls"): W4's 20 bodies 3.71 -> 2.96 ms back to back (3.77 -> 3.47 ms
after the threads idled 13 ms), the first 10 of W1's 2.9 -> 1.9 ms; but W1's 256 bodies in one
call 31.2 -> 38.3 ms (each piece's encoding object and ids cost more than the balance gains)."""

SPLIT_PATTERNS = frozenset(
    {
        # Qwen2 / Qwen2.5 / Qwen3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        # Llama 3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
)
"""Pre-tokenizer regexes under which a cut before a space between two ASCII letters is exact."""

_exact: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_exact_lock = threading.Lock()


def splits_exactly(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` gives the same ids for a text and for its :func:`cut_points` pieces
    (see the module's docstring); cached per tokenizer."""
    with _exact_lock:
        try:
            return _exact[tokenizer]
        except KeyError:
            pass
        except TypeError:  # not weakly referable: no Hugging Face tokenizer
            return False
        try:
            exact = _splits_exactly(tokenizer)
        except Exception:  # an unfamiliar tokenizer object: never cut
            exact = False
        _exact[tokenizer] = exact
        return exact


def _splits_exactly(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    model = backend.model
    if type(model).__name__ != "BPE" or getattr(model, "dropout", None) is not None:
        return False
    if backend.normalizer is not None and json.loads(backend.normalizer.__getstate__()) != {"type": "NFC"}:
        return False
    if backend.pre_tokenizer is None:
        return False
    pre = json.loads(backend.pre_tokenizer.__getstate__())
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return False
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or (split.get("pattern") or {}).get("Regex") not in SPLIT_PATTERNS
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex")
        or byte_level.get("add_prefix_space")
    ):
        return False
    # Added tokens are matched in the raw text first: none may reach across a space.
    for added in backend.get_added_tokens_decoder().values():
        if any(ch.isspace() for ch in added.content) or added.lstrip or added.rstrip or added.single_word:
            return False
    return True


def _safe(text: str, at: int) -> bool:
    """Whether ``text[at]`` is a space between two ASCII letters."""
    if at <= 0 or at + 1 >= len(text) or text[at] != " ":
        return False
    before, after = text[at - 1], text[at + 1]
    return before.isascii() and before.isalpha() and after.isascii() and after.isalpha()


def cut_points(text: str, piece_chars: int = PIECE_CHARS) -> list[int]:
    """Where to cut ``text`` into pieces of about ``piece_chars`` characters: each cut is before a
    space between two ASCII letters, the last one at or before the piece's end when there is one,
    else the first after it (a text with no such space stays whole)."""
    if piece_chars <= 0:
        raise ValueError(f"piece_chars must be positive, got {piece_chars}")
    cuts: list[int] = []
    start = 0
    while len(text) - start > piece_chars:
        at = text.rfind(" ", start + 1, start + piece_chars + 1)
        while at > start and not _safe(text, at):
            at = text.rfind(" ", start + 1, at)
        if at <= start:
            at = text.find(" ", start + piece_chars)
            while at != -1 and not _safe(text, at):
                at = text.find(" ", at + 1)
            if at == -1:
                break
        cuts.append(at)
        start = at
    return cuts


def worth_cutting(texts: Sequence[str], piece_chars: int = PIECE_CHARS) -> bool:
    """Whether a batch call on ``texts`` is one to cut: at most :data:`MAX_TEXTS` texts, one of
    them longer than a piece."""
    return len(texts) <= MAX_TEXTS and any(len(text) > piece_chars for text in texts)


def pieces_of(texts: Sequence[str], piece_chars: int = PIECE_CHARS) -> tuple[list[str], list[int]]:
    """Every text's pieces, in order, and how many pieces each text gave."""
    pieces: list[str] = []
    counts: list[int] = []
    for text in texts:
        bounds = [0, *cut_points(text, piece_chars), len(text)]
        pieces.extend(text[a:b] for a, b in itertools.pairwise(bounds))
        counts.append(len(bounds) - 1)
    return pieces, counts


def joined(piece_ids: Sequence[list[int]], counts: Sequence[int]) -> list[list[int]]:
    """The ids of each text from the ids of its pieces (:func:`pieces_of`'s ``counts``)."""
    out: list[list[int]] = []
    position = 0
    for count in counts:
        if count == 1:
            out.append(piece_ids[position])
        else:
            ids: list[int] = []
            for piece in piece_ids[position : position + count]:
                ids.extend(piece)
            out.append(ids)
        position += count
    return out
