"""Running the example notebooks as a reader would: top to bottom, in a fresh kernel.

The notebooks are committed with their outputs, so a reader sees the ranking without running anything.
To refresh those outputs after changing a notebook::

    PYTHONPATH=. python -m tests.helpers.notebooks

which executes each notebook in a scratch folder (the demo model is written there once, or linked from
``--demo-model DIR``) and writes it back with its outputs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = (
    "langchain_rag_reranking.ipynb",
    "llama_index_query_engine.ipynb",
    "evaluate_and_calibrate.ipynb",
)
# The folder the notebooks (and the README) write the demo model to, relative to where they run.
DEMO_FOLDER = "demo-qwen3"


def execute(name: str, workdir: Path) -> nbformat.NotebookNode:
    """Every cell run in order in a fresh kernel started in ``workdir``; a failing cell raises."""
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    # No timing metadata: re-running a notebook should change its file only where its output changed.
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            # tqdm's warning that ipywidgets is missing belongs to the Jupyter install that ran the
            # notebook, not to the notebook; committed, it would show this machine's paths.
            cell.outputs = [output for output in cell.outputs if "TqdmWarning" not in output.get("text", "")]
    return notebook


def printed(notebook: nbformat.NotebookNode) -> str:
    """What the notebook's cells printed to stdout, in order."""
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )


def committed(name: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(notebook)
    return notebook


def committed_output(name: str) -> str:
    """What the committed notebook ``name`` printed, once its code cells are checked to have run
    once each, in order (as a run top to bottom leaves them)."""
    notebook = committed(name)
    counts = [cell.execution_count for cell in notebook.cells if cell.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{name} is committed with cells run out of order: {counts}"
    )
    return printed(notebook)


def run_on_demo_model(name: str, workdir: Path, demo_model_dir: Path) -> str:
    """What ``name`` prints run top to bottom in ``workdir``, the demo model it loads there being
    ``demo_model_dir``."""
    (workdir / DEMO_FOLDER).symlink_to(demo_model_dir)
    return printed(execute(name, workdir))


def scored_ids(text: str) -> list[str]:
    """The ids the notebook printed with a score (a line's first word, where the line has ``score=``)."""
    return [line.split()[0] for line in text.splitlines() if "score=" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description="Execute the example notebooks and save their outputs.")
    parser.add_argument("--demo-model", type=Path, help="an existing demo model folder to link to")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="genscore-notebooks-") as scratch:
        workdir = Path(scratch)
        if args.demo_model is not None:
            (workdir / DEMO_FOLDER).symlink_to(args.demo_model.resolve())
        for name in NOTEBOOKS:
            notebook = execute(name, workdir)
            nbformat.validate(notebook)
            nbformat.write(notebook, EXAMPLES / name)
            print(f"wrote {EXAMPLES / name}")


if __name__ == "__main__":
    main()
