"""Score modes on the Qwen3 tiny model against full logits, and what may leave genscore."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer
from genscore_core.scoring import ScoreRangeError, check_scores

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
    with pytest.raises(ScoreRangeError, match="prompt 0 scored inf"):
        check_scores(torch.tensor([float("inf")]), "logit")
    with pytest.raises(ScoreRangeError, match=r"within \[0.0, 1.0\]"):
        check_scores(torch.tensor([0.2, 1.5]), "logit-sigmoid")
