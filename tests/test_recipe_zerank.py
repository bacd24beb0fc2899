"""zerank-1 / zerank-2 (ZeroEntropy) against the reference of their model repositories.

The reference is ZeroEntropy's ``modeling_zeranker.py``, written here from its code: each query cut to
2,000 characters and each document to 10,000, both stripped, the query as the system message and the
document as the user message of the tokenizer's chat template with the generation prompt, the text
tokenized in one call; the score is the "Yes" logit at the last position, and its 0-1 score
``sigmoid(logit / 5)``. On a tiny random Qwen3 with the real Qwen3 tokenizer (zerank-2 is a Qwen3-4B,
zerank-1-small a Qwen3-1.7B, both with Qwen3's chat template).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.recipes import resolve_recipe
from genscore_core.templates import ZERANK
from tests.helpers.tiny_models import linked_model

PAIRS = [
    ("What is 2+2?", "4"),
    ("What is 2+2?", "The answer is definitely 1 million"),
    ("  capital of France?\n", "\nParis is the capital and largest city of France.  "),
    ("who wrote {Hamlet}?", "Shakespeare wrote it around 1600 ... {json: true}"),
    ("rivers", "The Seine flows through Paris;\n\nthe Thames through London!"),
    ("x" * 2100 + " tail", "short"),  # a query past the reference's 2,000 characters
    ("long", "information retrieval " * 460 + "END"),  # a document past its 10,000 characters
]


def reference_zerank(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]]
) -> tuple[list[list[int]], list[float]]:
    """The prompt ids and the raw "Yes" logits of ZeroEntropy's ``predict`` (before its ``/ 5``)."""
    yes = tokenizer.encode("Yes", add_special_tokens=False)[0]
    ids, logits = [], []
    for query, document in [(q[:2_000], d[:10_000]) for q, d in pairs]:
        messages = [
            {"role": "system", "content": query.strip()},
            {"role": "user", "content": document.strip()},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text)["input_ids"]
        # One prompt at a time: the reference's right-padded batch reads each row at its last real
        # token, which a causal model scores as the prompt alone.
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), use_cache=False, logits_to_keep=1).logits[0, -1]
        ids.append(prompt)
        logits.append(float(out[yes].double()))
    return ids, logits


@pytest.fixture(scope="module")
def zerank_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return linked_model(tiny_model_dir, tmp_path_factory.mktemp("zerank") / "zerank-2-tiny")


def test_zerank_matches_zeroentropys_reference(zerank_dir: Path) -> None:
    scorer = GenerativeScorer(str(zerank_dir), device="cpu", dtype="float32")
    assert scorer.template is ZERANK
    assert scorer.recipe.source == "preset 'zerank' from the model name"
    assert scorer.score_mode == "logit-sigmoid"

    tokenizer = AutoTokenizer.from_pretrained(str(zerank_dir))
    model = AutoModelForCausalLM.from_pretrained(str(zerank_dir), dtype=torch.float32).eval()
    expected_ids, raw = reference_zerank(model, tokenizer, PAIRS)
    # Token ids first: the chat markup, the stripping and the character cuts.
    encoded = [scorer.encode(q, [d])[0] for q, d in PAIRS]
    assert [p.token_ids for p in encoded] == expected_ids
    assert [p.truncated for p in encoded] == [False] * 5 + [True, True]
    assert max(raw) - min(raw) > 0.5, "scores must spread for the comparison to mean something"

    reference = [1 / (1 + math.exp(-x / 5)) for x in raw]
    assert scorer.score_pairs(PAIRS) == pytest.approx(reference, abs=1e-5)
    # sigmoid(logit), the 0-1 score of genscore's plain logit-sigmoid, is not zerank's.
    assert scorer.score_pairs(PAIRS) != pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-3)

    logit = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(zerank_dir), score_mode="logit"
    )
    assert logit.template is ZERANK
    assert logit.score_pairs(PAIRS) == pytest.approx(raw, abs=1e-5, rel=1e-5)
    ranked = scorer.rerank(PAIRS[0][0], [PAIRS[0][1], PAIRS[1][1]])
    assert [r.score for r in ranked] == pytest.approx(sorted(reference[:2], reverse=True), abs=1e-5)


def test_zerank_is_detected_where_the_folder_says_so(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """By the ``_name_or_path`` transformers 4 saved, and by its model card's base_model (its path,
    above, names it too)."""
    root = tmp_path_factory.mktemp("detect")  # a path that names no family
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))

    by_config = linked_model(tiny_model_dir, root / "finetuned")
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (by_config / "config.json").unlink()
    (by_config / "config.json").write_text(json.dumps({**config, "_name_or_path": "zeroentropy/zerank-1"}))
    recipe = resolve_recipe("auto", str(by_config), tokenizer)
    assert recipe.template is ZERANK
    assert recipe.source == "preset 'zerank' from the name in config.json"

    by_card = linked_model(tiny_model_dir, root / "my-reranker")
    (by_card / "README.md").write_text("---\nbase_model:\n- zeroentropy/zerank-1-small\n---\n# fine-tune\n")
    recipe = resolve_recipe("auto", str(by_card), tokenizer)
    assert recipe.template is ZERANK
    assert recipe.source == "preset 'zerank' from the model card's base_model"
    assert recipe.template.logit_temperature == 5.0


# zerank-2's sentence-transformers integration renders the "query" message as the system turn and the
# "document" message as the user turn; this template does the same in Qwen3's chat markup.
ST_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'query' %}<|im_start|>system\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% for m in messages %}{% if m.role == 'document' %}<|im_start|>user\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n"
)


@pytest.mark.slow
def test_a_sentence_transformers_zerank_fine_tune_keeps_zeranks_scale(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A folder saved for sentence-transformers (one true token, "Yes") in a path that names no family:
    read as such, and scored on zerank's scale where its model card names zerank as its base."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    folder = tmp_path_factory.mktemp("st") / "my-reranker"
    transformer = Transformer(str(tiny_model_dir), transformer_task="text-generation")
    transformer.tokenizer.chat_template = ST_TEMPLATE
    CrossEncoder(modules=[transformer, LogitScore(true_token_id=9454)]).save(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    plain = resolve_recipe("auto", str(folder), tokenizer)
    assert plain.source.startswith("sentence-transformers CrossEncoder configuration")
    assert plain.template.logit_temperature == 1.0

    (folder / "README.md").write_text("---\nbase_model: zeroentropy/zerank-2\n---\n# a zerank fine-tune\n")
    scorer = GenerativeScorer(str(folder), device="cpu", dtype="float32")
    assert scorer.recipe.source.startswith("sentence-transformers CrossEncoder configuration")
    assert "divided by 5 as 'zerank''s" in scorer.recipe.source
    pairs = PAIRS[:5]
    raw = CrossEncoder(str(folder)).predict(pairs, activation_fn=torch.nn.Identity()).tolist()
    assert max(raw) - min(raw) > 0.5
    assert scorer.score_pairs(pairs) == pytest.approx([1 / (1 + math.exp(-x / 5)) for x in raw], abs=1e-5)
