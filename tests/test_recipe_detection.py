"""template="auto" on folders saved by the installed transformers: what survives ``save_pretrained``.

transformers 5 no longer writes ``_name_or_path`` into config.json, so a fine-tune saved under a neutral
folder name carries no name there. These tests save real folders (a hub-like folder loaded and saved
again, as a user's fine-tuning script does) and check what detection then picks, and what it says.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, ModelCardData
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from genscore_core import MXBAI_RERANK_V2, QWEN3_RERANKER, GenerativeScorer
from genscore_core.recipes import resolve_recipe
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import mxbai_fixed_tokens, mxbai_reference_ids
from tests.helpers.tiny_models import tiny_sizes

MXBAI_ID = "mixedbread-ai/mxbai-rerank-base-v2"


@pytest.fixture(scope="module")
def resaved_mxbai(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 under mxbai's folder name, loaded and saved again to a neutral folder."""
    root = tmp_path_factory.mktemp("resaved")
    original = root / "mxbai-rerank-base-v2"
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    config = Qwen2Config(
        **tiny_sizes(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1),
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(5)
    Qwen2ForCausalLM(config).save_pretrained(str(original))
    tokenizer.save_pretrained(str(original))
    finetuned = root / "finetuned"
    AutoModelForCausalLM.from_pretrained(str(original)).save_pretrained(str(finetuned))
    AutoTokenizer.from_pretrained(str(original)).save_pretrained(str(finetuned))
    return finetuned


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for file in folder.iterdir():
        (to / file.name).write_bytes(file.read_bytes())
    return to


def test_a_folder_saved_by_transformers_5_names_no_family_and_the_warning_says_why(
    resaved_mxbai: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = json.loads((resaved_mxbai / "config.json").read_text())
    # The fact the detection has to live with (if transformers writes the name again, step 3 fires).
    assert "_name_or_path" not in config
    tokenizer = AutoTokenizer.from_pretrained(str(resaved_mxbai))
    with caplog.at_level(logging.WARNING, logger="genscore_core.recipes"):
        recipe = resolve_recipe("auto", str(resaved_mxbai), tokenizer)
    assert recipe.template is QWEN3_RERANKER
    assert "records no _name_or_path (transformers 5 does not save it)" in caplog.text
    assert "no model card names a base_model" in caplog.text
    # A Qwen2 model is mxbai's architecture: the warning names the template to pass, without guessing.
    assert "template='mxbai-rerank-v2'" in caplog.text


def test_a_name_in_config_json_written_by_transformers_4_still_picks_the_preset(
    resaved_mxbai: Path, tmp_path: Path
) -> None:
    folder = _copy(resaved_mxbai, tmp_path / "finetuned-v4")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_name_or_path": MXBAI_ID}))
    recipe = resolve_recipe("auto", str(folder), AutoTokenizer.from_pretrained(str(folder)))
    assert recipe.template is MXBAI_RERANK_V2
    assert recipe.source == "preset 'mxbai-rerank-v2' from the name in config.json"


def test_the_model_cards_base_model_picks_the_preset_and_the_prompts_are_mixedbreads(
    resaved_mxbai: Path, tmp_path: Path
) -> None:
    folder = _copy(resaved_mxbai, tmp_path / "pushed")
    # What the Trainer writes when it pushes a fine-tune: base_model in the card's metadata.
    ModelCard.from_template(ModelCardData(base_model=MXBAI_ID, library_name="transformers")).save(
        str(folder / "README.md")
    )
    scorer = GenerativeScorer(str(folder), device="cpu", dtype="float32", max_length=200)
    assert scorer.template is MXBAI_RERANK_V2
    assert scorer.recipe.source == "preset 'mxbai-rerank-v2' from the model card's base_model"
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    pairs = [("what is the capital of France?", "Paris is the capital of France.\n"), ("why?", "x " * 300)]
    expected = mxbai_reference_ids(
        tokenizer, pairs, max_length=200 - mxbai_fixed_tokens(tokenizer), model_max_length=131072
    )
    assert [p.token_ids for q, d in pairs for p in scorer.encode(q, [d])] == expected


def test_a_card_naming_two_families_or_broken_metadata_picks_nothing(
    resaved_mxbai: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    merged = _copy(resaved_mxbai, tmp_path / "merged")
    (merged / "README.md").write_text(f"---\nbase_model:\n- {MXBAI_ID}\n- Qwen/Qwen3-Reranker-0.6B\n---\n")
    broken = _copy(resaved_mxbai, tmp_path / "broken")
    (broken / "README.md").write_text("---\nbase_model: [unclosed\n---\n")
    tokenizer = AutoTokenizer.from_pretrained(str(merged))
    with caplog.at_level(logging.WARNING, logger="genscore_core.recipes"):
        assert resolve_recipe("auto", str(merged), tokenizer).template is QWEN3_RERANKER
        assert f"the model card's base_model ['{MXBAI_ID}', 'Qwen/Qwen3-Reranker-0.6B']" in caplog.text
        assert resolve_recipe("auto", str(broken), tokenizer).template is QWEN3_RERANKER


def test_the_deepest_folder_that_names_a_family_wins(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.helpers.reference_recipe import official_qwen3_scores

    # A Qwen3-Reranker fine-tune kept in a folder of mxbai experiments: the model's own folder decides.
    nested = tmp_path / "mxbai-rerank-experiments" / "Qwen3-Reranker-0.6B-ft"
    nested.parent.mkdir()
    nested.symlink_to(tiny_model_dir, target_is_directory=True)
    scorer = GenerativeScorer(str(nested), device="cpu", dtype="float32", max_length=256)
    assert scorer.template is QWEN3_RERANKER
    assert scorer.recipe.source == "preset 'qwen3-reranker' from the model name"
    pairs = [("capital of France?", "Paris is the capital of France."), ("rivers", "The Seine flows.")]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    reference = official_qwen3_scores(model, tokenizer, pairs, max_length=256)
    assert scorer.score_pairs(pairs) == pytest.approx(reference, abs=1e-5)
    # A Trainer checkpoint (no name of its own) takes the name of the run folder above it.
    checkpoint = tmp_path / "qwen3-reranker-runs" / "mxbai-rerank-ft" / "checkpoint-500"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.symlink_to(tiny_model_dir, target_is_directory=True)
    assert resolve_recipe("auto", str(checkpoint), tokenizer).template is MXBAI_RERANK_V2
