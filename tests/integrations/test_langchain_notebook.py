"""The LangChain example notebook runs top to bottom on the tiny model, and is committed clean."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.notebooks import assert_committed_clean, run_notebook

NOTEBOOK = "langchain_rag_reranking.ipynb"


def test_notebook_is_committed_without_outputs() -> None:
    assert_committed_clean(NOTEBOOK)


def test_notebook_runs_top_to_bottom(tmp_path: Path) -> None:
    printed = run_notebook(NOTEBOOK, tmp_path)
    assert printed.count("score=") == 3  # top_n=3 reranked documents, with their scores
    assert "truncated=False" in printed
    assert "Answer the question using only this context:" in printed
    assert "Human: Which river flows through Paris?" in printed
