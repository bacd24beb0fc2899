"""Decoder ``*ForSequenceClassification`` folders (vLLM's ``convert_model_to_seq_cls.py``) against
transformers' own sequence-classification forward on the official Qwen3-Reranker prompt, and against
the causal reranker they were converted from."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.errors import ConfigurationError, InvalidRequestError, NotARerankerError
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import (
    official_qwen3_ids,
    official_qwen3_scores,
)
from tests.helpers.tiny_models import convert_to_seq_cls

PAIRS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("What is the capital of France?", "The Thames flows through London."),
    ("quantum photon energy", "A photon carries energy proportional to its frequency."),
    ("berlin wall history", "Berlin"),
    ("search engine", ""),
    ("token", "Rerank the search results of the engine by the model's token scores " * 6),
]


@pytest.fixture(scope="module")
def folders(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq-cls")
    made = {
        "one-row": convert_to_seq_cls(tiny_model_dir, root / "one-row", ["no", "yes"], "from_2_way_softmax"),
        "two-row": convert_to_seq_cls(
            tiny_model_dir, root / "two-row", ["no", "yes"], "no_post_processing", record_tokens=True
        ),
    }
    # The same weights, with vLLM's fields naming the tokens: the right ones, and the wrong order.
    for name, tokens in (("one-row-recorded", ["no", "yes"]), ("reversed", ["yes", "no"])):
        made[name] = shutil.copytree(made["one-row"], root / name)
        config = json.loads((made[name] / "config.json").read_text())
        config.update(classifier_from_token=tokens, method="from_2_way_softmax")
        (made[name] / "config.json").write_text(json.dumps(config))
    return made


def _classifier_logits(folder: Path) -> tuple[list[list[int]], torch.Tensor]:
    """transformers' own sequence-classification forward of each official prompt: [pairs, rows]."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = [official_qwen3_ids(tokenizer, q, d) for q, d in PAIRS]
    with torch.no_grad():
        logits = torch.cat([model(input_ids=torch.tensor([ids])).logits for ids in prompts])
    return prompts, logits.double()


@pytest.fixture(scope="module")
def original(tiny_model_dir: Path) -> list[float]:
    """The causal reranker's scores by the model card's recipe."""
    causal = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return official_qwen3_scores(causal, tokenizer, PAIRS, max_length=8192)


def _scores(scorer: GenerativeScorer, forward: str, mode: str) -> list[float]:
    """The scores of the scorer's model through ``forward`` in score mode ``mode``."""
    other = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, forward=forward, score_mode=mode)
    assert (
        type(other.engine.forward).__name__ == {"packed": "PackedForward", "padded": "PaddedForward"}[forward]
    )
    return other.score_pairs(PAIRS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["one-row", "one-row-recorded"])
def test_one_row_head_equals_transformers_and_the_causal_original(
    folders: dict[str, Path], original: list[float], name: str
) -> None:
    prompts, logits = _classifier_logits(folders[name])
    assert logits.shape == (len(PAIRS), 1)
    assert float(logits.max() - logits.min()) > 0.1, "scores must spread for the comparison to mean something"

    scorer = GenerativeScorer(str(folders[name]), device="cpu", dtype="float32")
    assert type(scorer.model).__name__ == "Qwen3ForSequenceClassification"
    assert scorer.template.name == "qwen3-reranker"
    assert [p.token_ids for q, d in PAIRS for p in scorer.encode(q, [d])] == prompts

    probabilities = [1 / (1 + math.exp(-x)) for x in logits[:, 0].tolist()]
    for forward in ("packed", "padded"):
        assert _scores(scorer, forward, "auto") == pytest.approx(probabilities, abs=1e-5), forward
        assert _scores(scorer, forward, "auto") == pytest.approx(original, abs=1e-5), forward
        assert _scores(scorer, forward, "logit") == pytest.approx(logits[:, 0].tolist(), abs=1e-5), forward
        assert _scores(scorer, forward, "logit-sigmoid") == pytest.approx(probabilities, abs=1e-5), forward


@pytest.mark.slow
def test_two_row_head_reads_no_then_yes(folders: dict[str, Path], original: list[float]) -> None:
    _, logits = _classifier_logits(folders["two-row"])  # rows [no, yes]
    scorer = GenerativeScorer(str(folders["two-row"]), device="cpu", dtype="float32")
    for forward in ("packed", "padded"):
        assert _scores(scorer, forward, "auto") == pytest.approx(
            torch.softmax(logits, 1)[:, 1].tolist(), abs=1e-5
        )
        assert _scores(scorer, forward, "auto") == pytest.approx(original, abs=1e-5)
        assert _scores(scorer, forward, "logit") == pytest.approx(logits[:, 1].tolist(), abs=1e-5)


def test_tokens_recorded_against_the_template_are_refused(folders: dict[str, Path]) -> None:
    # ["yes", "no"] as [false, true]: the row is w[no] - w[yes], which the template would read upside down.
    with pytest.raises(ConfigurationError, match=r"classifier_from_token \['yes', 'no'\].*\[false, true\]"):
        GenerativeScorer(str(folders["reversed"]), device="cpu", dtype="float32")
    # A one-row head cannot stand for three labels.
    with pytest.raises(ConfigurationError, match=r"1 score row\(s\).*3 label\(s\)"):
        GenerativeScorer(
            str(folders["one-row"]),
            device="cpu",
            dtype="float32",
            template={"name": "three", "body": "{query} {document}", "label_words": ["yes", "no", "maybe"]},
        )


def test_a_classifier_has_no_vocabulary_probability(folders: dict[str, Path]) -> None:
    scorer = GenerativeScorer(str(folders["one-row"]), device="cpu", dtype="float32")
    with pytest.raises(ConfigurationError, match=r"sequence classifier.*score_mode='vocab-softmax'"):
        GenerativeScorer.from_model(scorer.model, scorer.tokenizer, score_mode="vocab-softmax")
    # A request that asks for it (the protocol's apply_softmax=false) is refused alone.
    with pytest.raises(InvalidRequestError, match=r"sequence classifier.*vocab-softmax"):
        scorer.score(
            {"query": [100, 200], "items": [[300]], "label_token_ids": [9693, 2152], "apply_softmax": False}
        )


def test_an_encoder_classifier_is_still_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    BertForSequenceClassification(config).save_pretrained(str(tmp_path))
    AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir())).save_pretrained(str(tmp_path))
    with pytest.raises(
        NotARerankerError, match=r"BertForSequenceClassification.*not a causal language model"
    ):
        GenerativeScorer(str(tmp_path), device="cpu", dtype="float32")
