"""Running the example notebooks as a reader would: top to bottom, in a fresh kernel."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def assert_committed_clean(name: str) -> None:
    """The notebook is valid and carries no outputs, so diffs stay readable."""
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def run_notebook(name: str, workdir: Path) -> str:
    """Execute every cell (a failing cell raises CellExecutionError) and return what it printed."""
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )
