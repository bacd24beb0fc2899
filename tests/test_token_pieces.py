"""Long texts tokenized in pieces give the ids of the whole text (genscore_core.token_pieces), on the
real Qwen3 tokenizer, and other tokenizers are never cut."""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any

import pytest
from transformers import AutoTokenizer

from genscore_core.prompts import token_ids, token_ids_in_pieces
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from genscore_core.token_pieces import MAX_TEXTS, cut_points, joined, pieces_of, splits_exactly, worth_cutting


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


WORDS = ["the", "Paris", "café", "naïve", "don't", "it's", "we'll", "x", "A", "résumé", "東京", "Straße",
         "e\u0301", "12", "3.14", "1,000", "—", "?!", "(see", "note)", "<think>", "<|im_end|>", "a\tb",
         "\n", "\n\n", "  ", "🙂", "ok", "I'm", "O'Neil", "x-ray", "e.g.", "u.s.a", "naïvely"]  # fmt: skip


def _texts(seed: int, count: int = 40) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) if rng.random() < 0.4 else rng.choice(["alpha", "beta", "Gamma", "delta"])
                 for _ in range(rng.randint(1, 400))]  # fmt: skip
        joiners = [rng.choice([" ", " ", " ", "  ", "\n", ""]) for _ in words]
        texts.append("".join(w + j for w, j in zip(words, joiners)))
    return texts


def test_the_qwen3_tokenizer_is_cut() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    assert splits_exactly(tokenizer)


@pytest.mark.parametrize("piece_chars", [1, 7, 64, 1024])
def test_pieces_give_the_ids_of_the_whole_text(qwen3: Any, piece_chars: int) -> None:
    lock = threading.Lock()
    texts = [*_texts(piece_chars), "", "a", "no-spaces-at-all" * 50, " leading space", "trailing space "]
    whole = token_ids(qwen3, texts, lock)
    for start in range(0, len(texts), MAX_TEXTS):  # calls small enough to be cut
        batch = texts[start : start + MAX_TEXTS]
        assert worth_cutting(batch, piece_chars) == any(len(t) > piece_chars for t in batch)
        assert token_ids_in_pieces(qwen3, batch, lock, piece_chars) == whole[start : start + MAX_TEXTS]
    assert not worth_cutting(texts, piece_chars), "a call of more texts is left whole"
    assert token_ids_in_pieces(qwen3, texts, lock, piece_chars) == whole
    # And each cut is where the module says it may be: a space between two ASCII letters.
    for text in texts:
        for at in cut_points(text, piece_chars):
            assert text[at] == " " and text[at - 1].isascii() and text[at - 1].isalpha()
            assert text[at + 1].isascii() and text[at + 1].isalpha()


def test_pieces_of_a_realistic_document(qwen3: Any) -> None:
    rng = random.Random(3)
    vocabulary = [w[1:] for w in qwen3.get_vocab() if w.startswith("\u0120") and w[1:].isalpha()]
    body = "<Instruct>: Given a query\n<Query>: what is it\n<Document>: " + " ".join(
        rng.choice(vocabulary) for _ in range(2000)
    )
    lock = threading.Lock()
    pieces, counts = pieces_of([body])
    assert counts[0] > 5 and "".join(pieces) == body
    assert token_ids_in_pieces(qwen3, [body], lock) == token_ids(qwen3, [body], lock)


def test_cut_points_bound_the_pieces() -> None:
    text = " ".join(["word"] * 1000)  # 4,999 characters
    cuts = cut_points(text, 100)
    bounds = [0, *cuts, len(text)]
    assert all(0 < b - a <= 100 for a, b in itertools.pairwise(bounds))
    assert cut_points("short text", 100) == []
    # No safe space within the piece: the next one after it.
    assert cut_points("x" * 50 + " 1 " + "z" * 10 + " ab", 20) == [63]
    assert cut_points("1 2 3 4 5 6 7 8 9", 2) == []  # spaces between digits are never cut
    with pytest.raises(ValueError):
        cut_points("text", 0)


def test_joined_puts_each_texts_pieces_together() -> None:
    assert joined([[1], [2, 3], [], [4], [5]], [1, 3, 1]) == [[1], [2, 3, 4], [5]]


def test_other_tokenizers_are_not_cut(qwen3: Any) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    def fast(backend: Tokenizer) -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=backend)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    assert not splits_exactly(fast(bpe))
    lowercase = Tokenizer.from_str(qwen3.backend_tokenizer.to_str())
    lowercase.normalizer = normalizers.Lowercase()
    assert not splits_exactly(fast(lowercase))
    stripping = Tokenizer.from_str(qwen3.backend_tokenizer.to_str())
    from tokenizers import AddedToken

    stripping.add_tokens([AddedToken("<mask>", rstrip=True)])
    assert not splits_exactly(fast(stripping))
    spaced = Tokenizer.from_str(qwen3.backend_tokenizer.to_str())
    spaced.add_tokens(["new york"])
    assert not splits_exactly(fast(spaced))
    assert not splits_exactly(object())
