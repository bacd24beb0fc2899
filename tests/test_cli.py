"""The ``genscore`` command, run as a user runs it: the installed console script in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from genscore_core import GenerativeScorer

GENSCORE = shutil.which("genscore")


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return subprocess.run([GENSCORE, *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_make_tiny_model_is_loadable_and_labelled(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = _run("make-tiny-model", str(out))
    assert result.returncode == 0, result.stderr
    assert "RANDOM WEIGHTS" in result.stderr
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert "RANDOM WEIGHTS" in (out / "GENSCORE_RANDOM_WEIGHTS.txt").read_text()
    scorer = GenerativeScorer(str(out), device="cpu")
    assert scorer.label_token_ids == [9693, 2152]


def test_rerank_plain_text_from_stdin(tiny_model_dir: Path, scorer: GenerativeScorer) -> None:
    docs = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]
    result = _run(
        "rerank", "--model", str(tiny_model_dir), "--query", "capital of France", "--max-length", "512",
        "--no-progress", stdin="\n".join(docs[:2]) + "\n\n" + docs[2] + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Loading weights" not in result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    expected = scorer.rerank("capital of France", docs)
    assert [line["index"] for line in lines] == [r.index for r in expected]
    for line, ranked in zip(lines, expected, strict=True):
        assert line["score"] == pytest.approx(ranked.score, abs=1e-6)
        assert line["text"] == docs[line["index"]]
        assert line["truncated"] is False


def test_rerank_json_lines_file_carries_fields_and_top_n(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    records = [{"text": f"document number {i}", "id": f"doc-{i}", "meta": {"n": i}} for i in range(40)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = _run(
        "rerank",
        "--model",
        str(tiny_model_dir),
        "--query",
        "number",
        "--documents",
        str(path),
        "--top-n",
        "5",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 5
    assert [line["score"] for line in lines] == sorted((line["score"] for line in lines), reverse=True)
    for line in lines:
        assert line["id"] == f"doc-{line['index']}" and line["meta"] == {"n": line["index"]}
    assert "scoring" in result.stderr  # 40 documents: a progress bar on stderr


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("", "stdin: no documents to rerank"),
        ('{"text": "ok"}\n{"text": broken}\n', "stdin, line 2: invalid JSON"),
        (
            '{"text": "ok"}\n\n{"title": "no text"}\n',
            "stdin, line 3: expected a JSON object with a string 'text' field",
        ),
        ('{"text": "ok", "score": 3}\n', "stdin, line 1: field 'score' is reserved"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir: Path, stdin: str, message: str) -> None:
    result = _run("rerank", "--model", str(tiny_model_dir), "--query", "q", stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert result.stdout == ""


def test_unreadable_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = _run(
        "rerank",
        "--model",
        str(tiny_model_dir),
        "--query",
        "q",
        "--documents",
        str(tmp_path / "missing.jsonl"),
    )
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "missing.jsonl" in result.stderr
