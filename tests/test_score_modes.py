"""Score modes on the Qwen3 tiny model against full logits, and what may leave genscore."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer, InvalidRequestError, check_rank_options
from genscore_core.scoring import ScoreRangeError, check_scores
from tests.helpers.reference_recipe import (
    reference_yes_logits,
)

PAIRS = [("capital of France?", "Paris is the capital of France."), ("rivers", "The Thames. The Seine.")]


def test_every_mode_against_full_logits(scorer: GenerativeScorer, tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    prompts = [p.token_ids for q, d in PAIRS for p in scorer.encode(q, [d])]
    with torch.no_grad():
        logits = torch.stack([model(input_ids=torch.tensor([p])).logits[0, -1].double() for p in prompts])
    yes, no = scorer.label_token_ids
    expected = {
        "label-softmax": torch.sigmoid(logits[:, yes] - logits[:, no]),
        "vocab-softmax": torch.log_softmax(logits, dim=-1)[:, yes].exp(),
        "logit": logits[:, yes],
        "logit-sigmoid": torch.sigmoid(logits[:, yes]),
    }
    assert scorer.score_mode == "label-softmax"
    for mode, values in expected.items():
        moded = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, score_mode=mode)
        assert moded.score_mode == mode
        got = moded.score_pairs(PAIRS)
        assert got == pytest.approx(values.tolist(), abs=1e-5, rel=1e-5), mode
        ranked = moded.rerank(PAIRS[0][0], [d for _, d in PAIRS])
        alone = moded.score_pairs([(PAIRS[0][0], d) for _, d in PAIRS])
        assert [r.score for r in ranked] == pytest.approx(sorted(alone, reverse=True), abs=1e-6)


def test_scores_out_of_range_never_leave() -> None:
    check_scores(torch.tensor([0.0, 0.5, 1.0]), "label-softmax")
    check_scores(torch.tensor([-40.0, 12.5]), "logit")
    with pytest.raises(ScoreRangeError, match="prompt 1 scored nan"):
        check_scores(torch.tensor([0.5, float("nan")]), "vocab-softmax")
    with pytest.raises(ScoreRangeError, match="prompt 0 scored inf") as caught:
        check_scores(torch.tensor([float("inf")]), "logit")
    # A logit has no bounds to quote: the message said "within [-inf, inf]", which inf is.
    assert "not a finite number as score mode 'logit' requires" in caught.value.message
    with pytest.raises(ScoreRangeError, match=r"within \[0.0, 1.0\]"):
        check_scores(torch.tensor([0.2, 1.5]), "logit-sigmoid")


DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Thames flows through London.",
    "Paris is the capital of France.",  # a tie with the first: input order decides
    "x",
]


def test_logit_mode_thresholds_are_logits(scorer: GenerativeScorer, tiny_model_dir: Path) -> None:
    """A logit-mode scorer filters by a logit: thresholds outside [0, 1], negative ones included."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    query = "capital of France?"
    expected = reference_yes_logits(model, scorer.tokenizer, query, DOCUMENTS)
    assert min(expected) < 0.0 or max(expected) > 1.0  # the tiny model's logits leave [0, 1]
    logit = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, score_mode="logit")
    distinct = sorted(set(round(value, 6) for value in expected))
    threshold = (distinct[1] + distinct[2]) / 2  # between the second and third lowest logits
    # Best first, ties in input order: sorted is stable.
    kept = sorted(
        (i for i, value in enumerate(expected) if value >= threshold), key=lambda i: -round(expected[i], 6)
    )
    for ranked in (
        logit.rerank(query, DOCUMENTS, score_threshold=threshold),
        asyncio.run(logit.arerank(query, DOCUMENTS, score_threshold=threshold)),
    ):
        assert [r.index for r in ranked] == kept
        assert [r.score for r in ranked] == pytest.approx([expected[i] for i in kept], abs=1e-5)
    everything = logit.rerank(query, DOCUMENTS, score_threshold=min(expected) - 100.0, top_n=2)
    assert [r.index for r in everything] == sorted(range(5), key=lambda i: -round(expected[i], 6))[:2]
    assert logit.rerank(query, DOCUMENTS, score_threshold=max(expected) + 1.0).results == []


@pytest.mark.parametrize("mode", ["label-softmax", "vocab-softmax", "logit-sigmoid", "logit"])
@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), -float("inf"), 2.0, -1.5])
def test_thresholds_outside_the_modes_range_are_refused(
    scorer: GenerativeScorer, mode: str, threshold: float
) -> None:
    moded = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=512, score_mode=mode)
    if mode == "logit" and math.isfinite(threshold):
        assert moded.rerank("q", ["a", "b"], score_threshold=threshold) is not None
        return
    for call in (
        lambda: moded.rerank("q", ["a", "b"], score_threshold=threshold),
        lambda: asyncio.run(moded.arerank("q", ["a", "b"], score_threshold=threshold)),
    ):
        with pytest.raises(InvalidRequestError, match="score_threshold") as caught:
            call()
        assert caught.value.param == "score_threshold"
        assert repr(threshold) in str(caught.value)
        if mode != "logit":
            assert f"score mode {mode!r}" in str(caught.value)


def test_check_rank_options_knows_the_modes() -> None:
    check_rank_options(None, 0.3)
    check_rank_options(None, -1.5, score_mode="logit")
    check_rank_options(None, 40.0, score_mode=None)  # the mode not known yet: any finite number
    with pytest.raises(InvalidRequestError, match=r"within \[0, 1\]"):
        check_rank_options(None, -1.5)
    with pytest.raises(InvalidRequestError, match="finite"):
        check_rank_options(None, float("nan"), score_mode=None)
