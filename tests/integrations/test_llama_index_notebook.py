"""The LlamaIndex example notebook runs top to bottom on the demo model, puts the Seine first, and is
committed with the outputs a fresh run gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.notebooks import DEMO_FOLDER, committed, execute, printed

NOTEBOOK = "llama_index_query_engine.ipynb"


def _scored_ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if "score=" in line]


def test_notebook_is_committed_with_its_outputs() -> None:
    notebook = committed(NOTEBOOK)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert _scored_ids(printed(notebook))[0] == "seine"


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path: Path, demo_model_dir: Path) -> None:
    (tmp_path / DEMO_FOLDER).symlink_to(demo_model_dir)
    out = printed(execute(NOTEBOOK, tmp_path))
    # query(): three reranked source nodes, with generative and retrieval scores; aquery(): their ids;
    # postprocess_nodes(top_n=2) on the same retrieved nodes: the first two of them.
    scored = _scored_ids(out)
    assert out.count("retrieval=") == 3 and len(scored) == 3 + 2
    assert str(scored[:3]) in out
    assert scored[3:] == scored[:2]
    # The demo model scores word overlap: the only node naming the river, Paris and "flows".
    assert scored[0] == "seine"
    # The committed outputs agree with the run where every machine agrees: the first node (well
    # ahead) and how many are printed. The order below it is not compared: float32 rounding in the
    # demo model's training differs with the CPU's vector width (AVX2, AVX-512), and over 400 steps
    # that moves the close scores of the other nodes.
    shown = _scored_ids(printed(committed(NOTEBOOK)))
    assert (shown[0], shown[3], len(shown)) == (scored[0], scored[3], len(scored))
