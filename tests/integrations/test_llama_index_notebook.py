"""The LlamaIndex example notebook runs top to bottom on the tiny model, and is committed clean."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "llama_index_query_engine.ipynb"


def read_notebook() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def test_notebook_is_committed_without_outputs() -> None:
    notebook = read_notebook()
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_runs_top_to_bottom(tmp_path: Path) -> None:
    notebook = read_notebook()
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell, if any cell fails
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )
    # query(): three reranked source nodes, with generative and retrieval scores; aquery(): their ids;
    # postprocess_nodes(top_n=2) on the same retrieved nodes: the first two of them.
    scored = [line.split()[0] for line in printed.splitlines() if "score=" in line]
    assert printed.count("retrieval=") == 3 and len(scored) == 3 + 2
    assert str(scored[:3]) in printed
    assert scored[3:] == scored[:2]
