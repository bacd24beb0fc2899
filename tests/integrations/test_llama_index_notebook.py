"""The LlamaIndex example notebook runs top to bottom on the tiny model, and is committed clean."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.notebooks import assert_committed_clean, run_notebook

NOTEBOOK = "llama_index_query_engine.ipynb"


def test_notebook_is_committed_without_outputs() -> None:
    assert_committed_clean(NOTEBOOK)


def test_notebook_runs_top_to_bottom(tmp_path: Path) -> None:
    printed = run_notebook(NOTEBOOK, tmp_path)
    # query(): three reranked source nodes, with generative and retrieval scores; aquery(): their ids;
    # postprocess_nodes(top_n=2) on the same retrieved nodes: the first two of them.
    scored = [line.split()[0] for line in printed.splitlines() if "score=" in line]
    assert printed.count("retrieval=") == 3 and len(scored) == 3 + 2
    assert str(scored[:3]) in printed
    assert scored[3:] == scored[:2]
