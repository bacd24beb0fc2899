"""Scores against an independent implementation of the official recipe and of the protocol."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from tests.helpers.reference_recipe import full_vocab_label_prob, label_softmax_prob, official_qwen3_scores

WORDS = (
    "paris france capital city river seine museum louvre berlin germany wall history london thames "
    "bridge tower queen science energy quantum photon model language token rerank search engine"
).split()


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return model, tokenizer


def _text(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    if words:
        words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", "?", "!", "", "\n"])


@pytest.mark.slow
@pytest.mark.parametrize("forward", ["padded", "packed"])
def test_official_recipe_parity_fp32(
    scorer: GenerativeScorer, reference_model: tuple[object, object], forward: str
) -> None:
    scorer = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, forward=forward)
    assert (
        type(scorer.engine.forward).__name__
        == {"padded": "PaddedForward", "packed": "PackedForward"}[forward]
    )
    rng = random.Random(7)
    queries = [_text(rng, n) for n in (3, 8, 15, 40, 1)]
    # Lengths from a word to far past max_length=512, so some pairs are truncated.
    doc_lengths = [0, 1, 2, 5, 12, 30, 60, 120, 250, 500, 900]
    pairs = [(q, _text(rng, n)) for q in queries for n in doc_lengths]
    assert len(pairs) >= 50
    model, tokenizer = reference_model
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=scorer.max_length)
    got = scorer.score_pairs(pairs)
    encoded = [scorer.encode(q, [d])[0] for q, d in pairs]
    assert any(e.truncated for e in encoded), "the set must include truncated pairs"
    assert all(len(e.token_ids) <= scorer.max_length for e in encoded)
    worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    assert worst <= 1e-5, f"max |score - official| = {worst:.3g}"


def test_rerank_matches_official_order(
    scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    model, tokenizer = reference_model
    query = "What is the capital of France?"
    docs = ["Paris is the capital of France.", "Berlin is in Germany.", "The Thames flows through London."]
    expected = official_qwen3_scores(
        model, tokenizer, [(query, d) for d in docs], max_length=scorer.max_length
    )
    ranked = scorer.rerank(query, docs)
    assert [r.index for r in ranked] == sorted(range(3), key=lambda i: -expected[i])
    for result in ranked:
        assert result.score == pytest.approx(expected[result.index], abs=1e-5)
        assert result.document == docs[result.index]


def test_true_probability_against_float64_log_softmax(
    scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    model, tokenizer = reference_model
    request = {
        "query": "Is this city the capital of France?",
        "items": ["Paris", "London", "New York", "Dublin", "Berlin"],
        "label_token_ids": [9454, 2753],
        "apply_softmax": False,
    }
    response = scorer.score(request)
    query_ids = tokenizer.encode(request["query"])
    for entry, item in zip(response.data, request["items"], strict=True):
        prompt = query_ids + tokenizer.encode(item, add_special_tokens=False)
        expected = full_vocab_label_prob(model, prompt, 9454)
        assert entry.score == pytest.approx(expected, rel=1e-4, abs=1e-9)


def test_k_label_softmax_against_float64(
    scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    model, _ = reference_model
    labels = [9693, 2152, 9454, 2753, 16]
    response = scorer.score(
        {"query": [100, 200, 300], "items": [[400, 500], [600], [7, 8, 9, 10]], "label_token_ids": labels}
    )
    for entry, item in zip(response.data, [[400, 500], [600], [7, 8, 9, 10]], strict=True):
        assert entry.score == pytest.approx(
            label_softmax_prob(model, [100, 200, 300, *item], labels), abs=1e-6
        )


@pytest.mark.parametrize("item_first", [False, True])
def test_seed_examples(
    scorer: GenerativeScorer, reference_model: tuple[object, object], item_first: bool
) -> None:
    model, tokenizer = reference_model
    text = scorer.score(
        {
            "query": "Is this city the capital of France?",
            "items": ["Paris", "London", "New York", "Dublin", "Berlin"],
            "label_token_ids": [9454, 2753],
            "item_first": item_first,
        }
    )
    assert [d.index for d in text.data] == [0, 1, 2, 3, 4]
    assert all(0.0 < d.score < 1.0 for d in text.data)
    query_ids = tokenizer.encode("Is this city the capital of France?")
    for entry, item in zip(text.data, ["Paris", "London", "New York", "Dublin", "Berlin"], strict=True):
        item_ids = tokenizer.encode(item, add_special_tokens=False)
        prompt = item_ids + query_ids if item_first else query_ids + item_ids
        assert entry.score == pytest.approx(label_softmax_prob(model, prompt, [9454, 2753]), abs=1e-6)

    ids = scorer.score(
        {"query": [100, 200], "items": [[300, 400], [500, 600]], "label_token_ids": [9454, 2753]}
    )
    assert [d.index for d in ids.data] == [0, 1]
    assert all(0.0 < d.score < 1.0 for d in ids.data)
    assert ids.data[0].score == pytest.approx(
        label_softmax_prob(model, [100, 200, 300, 400], [9454, 2753]), abs=1e-6
    )
    assert ids.data[1].score == pytest.approx(
        label_softmax_prob(model, [100, 200, 500, 600], [9454, 2753]), abs=1e-6
    )
