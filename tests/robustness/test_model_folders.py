"""Model folders a user may point genscore at that lack a part: a clear error naming the folder and
what is missing, never a confusing one from deep in loading or scores of an empty prompt."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from genscore_core import ConfigurationError, GenerativeScorer, ModelNotFoundError
from genscore_core.cli import main as cli_main
from tests.helpers.doc_blocks import REPO
from tests.helpers.server import free_port

RefusalT = TypeVar("RefusalT", bound=ConfigurationError)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _refusal(error: type[RefusalT], folder: Path) -> RefusalT:
    """The ``error`` that building a CPU float32 scorer of ``folder`` raises."""
    with pytest.raises(error) as caught:
        GenerativeScorer(str(folder), device="cpu", dtype="float32")
    return caught.value


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
    refused = _refusal(ModelNotFoundError, folder)
    message = str(refused)
    assert str(folder.resolve()) in message
    assert "holds no tokenizer files" in message
    assert "tokenizer.save_pretrained(folder)" in message
    assert refused.setting == "model"


def test_a_tokenizer_folder_without_config_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = _copy_without(tiny_model_dir, tmp_path / "tokenizer-only", ("config.json",))
    refused = _refusal(ModelNotFoundError, folder)
    message = str(refused)
    assert str(folder.resolve()) in message
    assert "holds no config.json" in message
    assert refused.setting == "model"


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


# -- folders whose files are missing or torn: a genscore error naming the model and the file ----------
# transformers raised OSError, JSONDecodeError or safetensors' SafetensorError ("header too large",
# naming no file): none a genscore error, so `genscore rerank` printed a traceback and exited 1.


def _copy(source: Path, folder: Path) -> Path:
    return _copy_without(source, folder, ())


def test_a_folder_without_weights_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = _copy_without(tiny_model_dir, tmp_path / "no-weights", ("model.safetensors",))
    refused = _refusal(ModelNotFoundError, folder)
    message = str(refused)
    assert repr(str(folder)) in message and "cannot load its weights" in message
    assert "model.safetensors" in message  # what transformers looked for
    assert refused.setting == "model"


@pytest.mark.parametrize(
    ("torn", "part"),
    [("model.safetensors", "weights"), ("config.json", "tokenizer"), ("tokenizer.json", "tokenizer")],
)
def test_a_torn_file_is_named(tiny_model_dir: Path, tmp_path: Path, torn: str, part: str) -> None:
    # A download cut short: the first bytes of the file only. (config.json is read first by the
    # tokenizer, which asks it for the tokenizer class.)
    folder = _copy(tiny_model_dir, tmp_path / "torn")
    whole = (folder / torn).read_bytes()
    (folder / torn).write_bytes(whole[:7])
    refused = _refusal(ConfigurationError, folder)
    message = str(refused)
    assert repr(str(folder)) in message and f"cannot load its {part}" in message
    assert f"unreadable (corrupted or partly written?): {torn}" in message
    assert refused.setting == "model"


def test_the_command_line_names_a_torn_folder_on_one_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy(tiny_model_dir, tmp_path / "torn")
    (folder / "model.safetensors").write_bytes(b"garbage" * 10)
    monkeypatch.setattr("sys.stdin", io.StringIO("a document\n"))
    code = cli_main(["rerank", "--model", str(folder), "--device", "cpu", "--query", "q"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert error[-1].startswith("genscore: error: model ") and "model.safetensors" in error[-1]
    assert not any(line.startswith("Traceback") for line in error)


# -- devices ------------------------------------------------------------------------------------------


def _missing_device() -> str:
    """A device this machine lacks (a build without MPS, or a CUDA index past the GPUs there are)."""
    if not torch.backends.mps.is_available():
        return "mps"
    return f"cuda:{torch.cuda.device_count()}"


@pytest.mark.parametrize("device", ["meta", _missing_device()])
def test_a_device_that_cannot_hold_the_model_is_refused_by_name(tiny_model_dir: Path, device: str) -> None:
    # "meta" loaded, then failed at the first score ("Tensor.item() cannot be called on meta
    # tensors"); "mps" on Linux failed inside transformers with a RuntimeError after the tokenizer loaded.
    with pytest.raises(ValueError, match=rf"device '{device}' ") as caught:
        GenerativeScorer(str(tiny_model_dir), device=device, dtype="float32")
    assert not isinstance(caught.value, RuntimeError)
    assert len(str(caught.value)) < 400  # torch's list of dispatch keys is not repeated


# -- a hub id without network -------------------------------------------------------------------------


def _load_in_fresh_process(model: str, hf_home: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    """``GenerativeScorer(model)`` in a process whose hub is ``endpoint`` and whose cache is ``hf_home``
    (huggingface_hub reads both when imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, PYTHONPATH=str(REPO))
    code = (
        "import sys, time\n"
        "from genscore_core import GenerativeScorer\n"
        "start = time.monotonic()\n"
        "try:\n"
        f"    scorer = GenerativeScorer({model!r}, device='cpu', dtype='float32', max_length=128)\n"
        "    print('SCORES', scorer.score_pairs([('q', 'd')]))\n"
        "except Exception as error:\n"
        "    print('ERROR', type(error).__name__, error)\n"
        "print('SECONDS', time.monotonic() - start)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
    )


def _seconds(done: subprocess.CompletedProcess[str]) -> float:
    return float(done.stdout.split("SECONDS")[-1])


def test_a_hub_id_that_is_not_cached_fails_at_once_without_network(tmp_path: Path) -> None:
    # The hub is a closed port on loopback. huggingface_hub retried each file five times with backoff
    # (1+2+4+8+8 s) and transformers asked twice: 47 s, then an OSError naming no model.
    endpoint = f"http://127.0.0.1:{free_port()}"
    done = _load_in_fresh_process("someorg/some-reranker", tmp_path / "hf-home", endpoint)
    assert "ERROR ModelNotFoundError model 'someorg/some-reranker' is not a local folder" in done.stdout
    assert endpoint in done.stdout and str(tmp_path / "hf-home") in done.stdout
    assert _seconds(done) < 15, done.stdout


def test_a_cached_hub_id_loads_from_the_cache_at_once_without_network(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Each file the cache lacks (vocab.json, merges.txt, special_tokens_map.json, modules.json, ...)
    # was asked of the hub with five retries: three minutes to load a model wholly in the cache. With
    # peft installed (the test extra has it, through FlagEmbedding), transformers also asked the hub
    # for adapter_config.json, local_files_only not passed on: 32 s.
    home = tmp_path / "hf-home"
    snapshot = home / "hub" / "models--someorg--cached-reranker" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in tiny_model_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    (home / "hub" / "models--someorg--cached-reranker" / "refs").mkdir()
    (home / "hub" / "models--someorg--cached-reranker" / "refs" / "main").write_text("0" * 40)
    done = _load_in_fresh_process("someorg/cached-reranker", home, f"http://127.0.0.1:{free_port()}")
    assert "SCORES [" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "loading someorg/cached-reranker from the Hugging Face cache only" in done.stderr
    assert _seconds(done) < 15, done.stdout


def test_a_model_given_to_from_model_under_a_hub_name_is_built_at_once_without_network(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The name only tells which family's prompt to use; looking for its model card and settings
    # asked the unreachable hub for each file with five retries: 71 s before the scorer existed.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    endpoint = f"http://127.0.0.1:{free_port()}"
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT=endpoint, PYTHONPATH=str(REPO))
    code = (
        "import time\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from genscore_core import GenerativeScorer\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})\n"
        "start = time.monotonic()\n"
        "scorer = GenerativeScorer.from_model(model, tokenizer, model='someorg/some-reranker')\n"
        "print('TEMPLATE', scorer.template.name)\n"
        "print('SCORES', scorer.score_pairs([('q', 'd')]))\n"
        "print('SECONDS', time.monotonic() - start)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    assert "TEMPLATE qwen3-reranker" in done.stdout and "SCORES [" in done.stdout, done.stderr[-3000:]
    assert (
        "reading the settings files of someorg/some-reranker from the Hugging Face cache only" in done.stderr
    )
    assert "Retrying in" not in done.stderr
    assert _seconds(done) < 15, done.stdout


# -- code a model folder ships --------------------------------------------------------------------------


def test_a_folder_that_needs_its_own_code_names_it_and_never_runs_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # transformers said only that the repository "contains custom code which must be executed":
    # neither the code nor the setting that allows it.
    folder = _copy(tiny_model_dir, tmp_path / "custom")
    ran = tmp_path / "the-code-ran"
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="my-reranker",
        architectures=["MyRerankerForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_my.MyConfig",
            "AutoModelForCausalLM": "modeling_my.MyRerankerForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    for module in ("configuration_my.py", "modeling_my.py"):
        (folder / module).write_text(f"open({str(ran)!r}, 'w').close()\n")
    refused = _refusal(ConfigurationError, folder)
    message = str(refused)
    assert "AutoConfig -> configuration_my.MyConfig" in message
    assert "AutoModelForCausalLM -> modeling_my.MyRerankerForCausalLM" in message
    assert "trust_remote_code=True (--trust-remote-code)" in message
    assert refused.setting == "trust_remote_code"
    assert not ran.exists()
