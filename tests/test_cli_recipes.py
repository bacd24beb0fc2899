"""The recipe flags of ``genscore rerank`` and ``genscore serve`` (the console script, in a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from genscore_core import GenerativeScorer

GENSCORE = shutil.which("genscore")
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany. " * 60]


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return subprocess.run([GENSCORE, *args], input=stdin, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "settings"),
    [
        (["--score-mode", "logit"], {"score_mode": "logit"}),
        (
            ["--long-documents", "chunk", "--chunk-overlap", "8", "--chunk-aggregation", "mean"],
            {"long_documents": "chunk", "chunk_overlap": 8, "chunk_aggregation": "mean"},
        ),
    ],
)
def test_rerank_flags_reach_the_scorer(
    tiny_model_dir: Path, scorer: GenerativeScorer, flags: list[str], settings: dict[str, object]
) -> None:
    query = "capital of France"
    result = _run(
        "rerank", "--model", str(tiny_model_dir), "--query", query, "--max-length", "120", "--no-progress",
        *flags, stdin="\n\n".join(DOCUMENTS) + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    expected = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=120, **settings).rerank(
        query, DOCUMENTS
    )
    # The long document spans several windows (and is cut when truncating), so each flag matters.
    assert max(r.windows for r in expected) > 1 or not settings.get("long_documents")
    assert [line["index"] for line in lines] == [r.index for r in expected]
    assert [line["score"] for line in lines] == pytest.approx([r.score for r in expected], abs=1e-6)


def test_serve_names_the_score_modes() -> None:
    result = _run("serve", "--model", "unused", "--score-mode", "probability")
    assert result.returncode == 2
    assert "label-softmax" in result.stderr and "logit-sigmoid" in result.stderr
