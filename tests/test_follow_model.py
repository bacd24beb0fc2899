"""A scorer follows its model when the model is cast, moved or given other weights after the build.

The packed forward fuses each layer's q/k/v and gate/up weights and re-points the model's parameters
to views of them; the head keeps an alias of the LM head's weight. A cast (``model.to(dtype)``) or
``load_state_dict(..., assign=True)`` gives the model new tensors: the engine must notice and build its
parts again, or it would score with the old weights (or fail on a dtype mismatch). Scores are checked
against the independent implementation of the official recipe, run on the model as it is after the
change. A device move is the same replacement of each parameter's tensor as a cast (``nn.Module._apply``);
there is no second device here to run it on.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.frontend import STREAM_MIN_CHARS
from genscore_core.testing.tiny_model import make_tiny_model
from tests.helpers.reference_recipe import official_qwen3_scores

WORDS = "paris france capital river museum berlin wall history london bridge photon energy search".split()
MAX_LENGTH = 256
ATOL = 1e-5


def _pairs(seed: int, count: int = 12, words: int = 30) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [
        (" ".join(rng.choices(WORDS, k=3)), " ".join(rng.choices(WORDS, k=rng.randrange(1, words))))
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny Qwen3 with other random weights (same shapes)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-other"), seed=1)


def _load(path: Path, dtype: torch.dtype) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def _worst(scorer: GenerativeScorer, model: Any, pairs: list[tuple[str, str]]) -> float:
    """Largest difference between the scorer's scores and the official recipe's on ``model``."""
    expected = official_qwen3_scores(model, scorer.tokenizer, pairs, max_length=MAX_LENGTH)
    return max(abs(a - b) for a, b in zip(scorer.score_pairs(pairs), expected, strict=True))


def _views_of_fused(scorer: GenerativeScorer) -> bool:
    """Whether every layer's q_proj weight is the first rows of the decoder's fused q/k/v tensor."""
    layers = scorer.model.model.layers
    fused = scorer.engine.forward.decoder.layers  # type: ignore[attr-defined]
    return all(
        f.qkv is not None and f.qkv[0].data_ptr() == layer.self_attn.q_proj.weight.data_ptr()
        for layer, f in zip(layers, fused, strict=True)
    )


def test_a_model_cast_after_the_scorer_was_built_is_scored_in_its_new_dtype(tiny_model_dir: Path) -> None:
    """Loaded in bf16, scorer built, model cast to float32: the scores are the float32 recipe's on
    the cast model (before: a dtype mismatch error from the first matrix product)."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="bfloat16", max_length=MAX_LENGTH)
    pairs = _pairs(1)
    scorer.score_pairs(pairs)
    scorer.model.to(torch.float32)
    assert _worst(scorer, scorer.model, pairs) <= ATOL
    decoder = scorer.engine.forward.decoder  # type: ignore[attr-defined]
    assert decoder.dtype == torch.float32 and decoder.layers[0].qkv[0].dtype == torch.float32
    assert _views_of_fused(scorer), "fused again: the weights are held once"


@pytest.mark.parametrize("forward", ["packed", "padded"])
@pytest.mark.parametrize("assign", [False, True])
def test_weights_loaded_after_the_scorer_was_built_are_the_ones_scored(
    tiny_model_dir: Path, other_model_dir: Path, forward: str, assign: bool
) -> None:
    """``load_state_dict`` of other weights: copied into the existing tensors (fused views included),
    nothing to rebuild; with ``assign=True`` the model gets new tensors and the engine rebuilds. The
    scores are the official recipe's on the other model, loaded on its own."""
    scorer = GenerativeScorer(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH, forward=forward
    )
    pairs = _pairs(2)
    scorer.score_pairs(pairs)
    other = _load(other_model_dir, torch.float32)
    scorer.model.load_state_dict(_load(other_model_dir, torch.float32).state_dict(), assign=assign)
    assert _worst(scorer, other, pairs) <= ATOL
    assert scorer.engine.follow_model() is False, "the call already followed the model"


def test_a_streamed_call_follows_the_model(tiny_model_dir: Path, other_model_dir: Path) -> None:
    """A text call large enough to stream (the producer lays batches out for the forward's device)."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    query = "capital of france"
    documents = [" ".join(random.Random(i).choices(WORDS, k=200)) for i in range(60)]
    assert sum(len(d) for d in documents) >= STREAM_MIN_CHARS and scorer._streams(None)
    scorer.rerank(query, documents[:2])
    other = _load(other_model_dir, torch.float32)
    scorer.model.load_state_dict(_load(other_model_dir, torch.float32).state_dict(), assign=True)
    ranked = scorer.rerank(query, documents)
    # The reference: a scorer built on the other model loaded on its own (the tests above check
    # such a scorer against the official recipe; the recipe's full logits over 60 long prompts are slow).
    expected = GenerativeScorer.from_model(other, scorer.tokenizer, max_length=MAX_LENGTH).rerank(
        query, documents
    )
    worst = max(abs(ranked.score_of(i) - expected.score_of(i)) for i in range(len(documents)))
    assert worst <= ATOL


def test_a_cast_to_bf16_scores_as_a_scorer_built_after_it(tiny_model_dir: Path) -> None:
    """float32 scorer, model cast to bf16: the same scores as a scorer built on the cast model
    (which finds the weights fused and adjacent, and shares them)."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    pairs = _pairs(4)
    scorer.score_pairs(pairs)
    scorer.model.to(torch.bfloat16)
    got = scorer.score_pairs(pairs)
    assert _views_of_fused(scorer)
    built_after = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=MAX_LENGTH)
    assert built_after.score_pairs(pairs) == got


def test_nothing_is_rebuilt_while_the_model_keeps_its_tensors(tiny_model_dir: Path) -> None:
    """A rebuild drops CUDA graphs and fuses again: only a real change may cause one."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    engine = scorer.engine
    decoder, head = engine.forward.decoder, engine.head.weight  # type: ignore[attr-defined]
    assert engine.follow_model() is False, "built from the model as it is"
    scorer.model.to(torch.float32).eval()  # no-ops
    with torch.no_grad():
        scorer.model.model.layers[0].mlp.up_proj.weight.mul_(2.0)  # in place: the views see it
    assert engine.follow_model() is False
    assert engine.forward.decoder is decoder and engine.head.weight is head  # type: ignore[attr-defined]


def test_a_model_the_packed_forward_cannot_run_any_more_is_named(tiny_model_dir: Path) -> None:
    """After a change the packed forward cannot follow (here: the model marked as split over two
    devices, as accelerate's ``device_map`` does), the call fails naming why and what to do."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    scorer.model.to(torch.bfloat16)
    scorer.model.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": 0}
    with pytest.raises(ValueError, match=r"changed after the scorer was built.*split over several devices"):
        scorer.score_pairs(_pairs(5))


def test_save_pretrained_after_building_a_scorer_loads_back_identical(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Saving a model whose parameters are views of the fused tensors writes the same checkpoint:
    reloaded, every tensor is bitwise the original file's and the scores are equal. Saving leaves the
    scorer as it was (the views stay; nothing to rebuild)."""
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    pairs = _pairs(6)
    scores = scorer.score_pairs(pairs)
    assert _views_of_fused(scorer)
    scorer.model.save_pretrained(str(tmp_path))
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(str(tmp_path))
    original = _load(tiny_model_dir, torch.float32).state_dict()
    reloaded = GenerativeScorer(str(tmp_path), device="cpu", dtype="float32", max_length=MAX_LENGTH)
    state = reloaded.model.state_dict()
    assert state.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(state[name], tensor), name
    assert reloaded.score_pairs(pairs) == scores
    assert scorer.engine.follow_model() is False and _views_of_fused(scorer)
