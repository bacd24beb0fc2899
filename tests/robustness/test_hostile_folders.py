"""Hostile or broken model folders: one line naming the folder and the file, a ``ModelFolderError`` in
Python and exit code 2 on the command line; nothing the folder ships runs.

Before, a chat template's ``SecurityError`` or ``TemplateSyntaxError`` escaped raw (the command line
printed a 60-line traceback, exit 1), a template looping 1e10 times or building a 2 GB string hung
loading for over a minute, a weight of the wrong shape gave ``RuntimeError: ... look at the above
report!``, a ``pad_token_id`` past the vocabulary an ``AssertionError``, a malicious pickle a 44-line
traceback advising ``weights_only=False``, and a ``LogitScore`` ``false_token_id`` of ``"no"`` an
``invalid literal for int()`` while ``2152.9`` was cut to 2152.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import CrossEncoder
from sentence_transformers.base.modules import Transformer
from sentence_transformers.cross_encoder.modules import LogitScore

from genscore_core import GenerativeScorer, ModelFolderError, template_sandbox
from genscore_core.cli import main as cli_main
from genscore_core.testing.tiny_model import make_tiny_model

YES, NO = 9693, 2152
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'query' %}Query: {{ m.content }}{% endif %}{% endfor %}\n"
    "{% for m in messages %}{% if m.role == 'document' %}Document: {{ m.content }}{% endif %}{% endfor %}\n"
    "Relevant:"
)
_BIG_FILES = ("model.safetensors", "tokenizer.json")


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder saved by sentence-transformers' own CrossEncoder (text-generation Transformer and a
    two-token LogitScore), with a plain chat template."""
    root = tmp_path_factory.mktemp("hostile")
    transformer = Transformer(str(make_tiny_model(root / "base")), transformer_task="text-generation")
    transformer.tokenizer.chat_template = PLAIN_TEMPLATE
    CrossEncoder(modules=[transformer, LogitScore(true_token_id=YES, false_token_id=NO)]).save(
        str(root / "st")
    )
    return root / "st"


def _copy(source: Path, folder: Path) -> Path:
    """``source`` copied, its large files linked (a test that changes one writes a new file)."""
    for path in source.rglob("*"):
        target = folder / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.name in _BIG_FILES:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path.resolve())
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    return folder


def _with_template(template: str) -> Callable[[Path], str]:
    def tamper(folder: Path) -> str:
        (folder / "chat_template.jinja").write_text(template)
        return "chat_template.jinja"

    return tamper


def _wrong_shape(folder: Path) -> str:
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 5)
    (folder / "model.safetensors").unlink()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return "model.safetensors"


def _pad_beyond_vocabulary(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    config["pad_token_id"] = config["vocab_size"] + 7
    (folder / "config.json").write_text(json.dumps(config))
    return "config.json"


class _Planted:
    """A pickle that runs ``touch <path>`` when loaded unsafely."""

    path = ""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def _malicious_pickle(folder: Path) -> str:
    (folder / "model.safetensors").unlink()
    planted = _Planted()
    planted.path = str(folder.parent / "the-pickle-ran")
    torch.save({"model.embed_tokens.weight": planted}, folder / "pytorch_model.bin")
    return "pytorch_model.bin"


def _false_token_id(value: object) -> Callable[[Path], str]:
    def tamper(folder: Path) -> str:
        path = folder / "1_LogitScore" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "false_token_id": value}))
        return "1_LogitScore/config.json"

    return tamper


CASES: dict[str, tuple[Callable[[Path], str], str]] = {
    "template-syntax": (_with_template("{% for m in messages %}{{ m.content }"), "is not valid Jinja"),
    "template-sandbox": (
        _with_template("{{ messages.__class__.__mro__[1].__subclasses__() }}"),
        "does something jinja's sandbox forbids",
    ),
    "template-raises": (_with_template("{{ raise_exception('no pairs here') }}"), "raises an error"),
    "template-loop": (
        _with_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
        "does not finish rendering one query and document within 2 s",
    ),
    "template-2gb": (
        _with_template("{% set s = 'ab' * 1000000000 %}{{ s | length }}"),
        "needs more than 512 MB of memory",
    ),
    "wrong-shape": (
        _wrong_shape,
        "model.layers.0.mlp.down_proj.weight has shape [3, 5], but config.json gives",
    ),
    "pad-id": (_pad_beyond_vocabulary, "pad_token_id is 151676, outside the vocabulary of 151669 tokens"),
    "pickle": (_malicious_pickle, "a pickle that torch's safe loader refuses"),
    "false-id-word": (_false_token_id("no"), 'false_token_id is "no", not a token id'),
    "false-id-fraction": (_false_token_id(2152.9), "false_token_id is 2152.9, not a token id"),
}


def _tampered(case: str, st_folder: Path, tmp_path: Path) -> tuple[Path, str, str]:
    tamper, problem = CASES[case]
    folder = _copy(st_folder, tmp_path / "folder")
    return folder, tamper(folder), problem


@pytest.fixture(autouse=True)
def _short_render_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_sandbox, "RENDER_TIMEOUT_S", 2.0)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_folder_is_a_model_folder_error_naming_folder_and_file(
    case: str, st_folder: Path, tmp_path: Path
) -> None:
    folder, file, problem = _tampered(case, st_folder, tmp_path)
    started = time.monotonic()
    with pytest.raises(ModelFolderError) as caught:
        GenerativeScorer(str(folder), device="cpu", dtype="float32")
    assert time.monotonic() - started < 30  # a template loop no longer hangs loading
    refused = caught.value
    message = str(refused)
    assert "\n" not in message
    assert message.startswith(f"model {str(folder)!r}: {file}: "), message
    assert problem in message, message
    assert (refused.folder, refused.file, refused.setting) == (str(folder), file, "model")
    assert isinstance(refused, ValueError)  # as the template refusals were before
    assert not (tmp_path / "the-pickle-ran").exists()  # nothing was run that the user did not opt into


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_command_line_names_a_hostile_folder_on_one_line_and_exits_2(
    case: str,
    st_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, file, problem = _tampered(case, st_folder, tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("a document\n"))
    code = cli_main(["rerank", "--model", str(folder), "--device", "cpu", "--query", "q"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert lines[-1].startswith(f"genscore: error: model {str(folder)!r}: {file}: "), lines[-3:]
    assert problem in lines[-1]
    assert not any(line.startswith("Traceback") for line in lines)
    assert not (tmp_path / "the-pickle-ran").exists()


def test_a_plain_copy_of_the_folder_still_loads(st_folder: Path, tmp_path: Path) -> None:
    """The fixture's folder is sound: each case above fails for its tampered file alone."""
    scorer = GenerativeScorer(str(_copy(st_folder, tmp_path / "folder")), device="cpu", dtype="float32")
    assert scorer.label_token_ids == [YES, NO]
    assert scorer.template.body == "Query: {query}Document: {document}Relevant:"
