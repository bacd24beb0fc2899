"""Model folders a user may point genscore at that lack a part: a clear error naming the folder and
what is missing, never a confusing one from deep in loading or scores of an empty prompt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from genscore_core import GenerativeScorer, ModelNotFoundError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _copy_without(source: Path, folder: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir()
    for path in source.iterdir():
        if path.name not in names:
            shutil.copy(path, folder / path.name)
    return folder


def test_a_model_saved_without_its_tokenizer_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    # model.save_pretrained(folder) alone: transformers 5 builds a one-token tokenizer from config.json,
    # and the label words came out as "0 tokens".
    folder = _copy_without(tiny_model_dir, tmp_path / "model-only", _TOKENIZER_FILES)
    with pytest.raises(ModelNotFoundError) as caught:
        GenerativeScorer(str(folder), device="cpu", dtype="float32")
    message = str(caught.value)
    assert str(folder.resolve()) in message
    assert "holds no tokenizer files" in message
    assert "tokenizer.save_pretrained(folder)" in message
    assert caught.value.setting == "model"


def test_a_tokenizer_folder_without_config_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = _copy_without(tiny_model_dir, tmp_path / "tokenizer-only", ("config.json",))
    with pytest.raises(ModelNotFoundError) as caught:
        GenerativeScorer(str(folder), device="cpu", dtype="float32")
    message = str(caught.value)
    assert str(folder.resolve()) in message
    assert "holds no config.json" in message
    assert caught.value.setting == "model"


def test_a_sharded_checkpoint_scores_as_the_single_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).save_pretrained(
        str(sharded), max_shard_size="5MB"
    )
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(str(sharded))
    assert len(list(sharded.glob("model-0000*-of-*.safetensors"))) > 1
    pairs = [("capital of France", "Paris is the capital."), ("q", "")]
    whole = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=128)
    parts = GenerativeScorer(str(sharded), device="cpu", dtype="float32", max_length=128)
    assert parts.score_pairs(pairs) == whole.score_pairs(pairs)
