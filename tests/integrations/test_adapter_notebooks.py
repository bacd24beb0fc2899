"""The LangChain and LlamaIndex example notebooks run top to bottom on the demo model, put the Seine
first, and are committed with the outputs a fresh run gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.notebooks import committed, committed_output, printed, run_on_demo_model, scored_ids

LANGCHAIN = "langchain_rag_reranking.ipynb"
LLAMA_INDEX = "llama_index_query_engine.ipynb"


@pytest.mark.parametrize("notebook", [LANGCHAIN, LLAMA_INDEX])
def test_notebook_is_committed_with_its_outputs(notebook: str) -> None:
    assert scored_ids(committed_output(notebook))[0] == "seine"


@pytest.mark.slow
def test_langchain_notebook_runs_top_to_bottom(tmp_path: Path, demo_model_dir: Path) -> None:
    out = run_on_demo_model(LANGCHAIN, tmp_path, demo_model_dir)
    reranked = scored_ids(out)
    assert len(reranked) == 3  # top_n=3 reranked documents, with their scores
    # The demo model scores word overlap: the only passage naming the river, Paris and "flows".
    assert reranked[0] == "seine"
    assert "truncated=False" in out
    # ainvoke and CrossEncoderReranker print the same order.
    assert out.count(str(reranked)) == 2
    assert "Answer the question using only this context:\n[seine]" in out
    assert "Human: Which river flows through Paris?" in out
    # What a reader sees committed is what a run gives, as far as it holds on every machine: the first
    # passage (well ahead) and how many follow. The order below it is not compared: float32 rounding
    # in the demo model's training differs with the CPU's vector width (AVX2, AVX-512), and over 400
    # steps that moves the close scores of the other passages.
    shown = scored_ids(printed(committed(LANGCHAIN)))
    assert (shown[0], len(shown)) == (reranked[0], len(reranked))


@pytest.mark.slow
def test_llama_index_notebook_runs_top_to_bottom(tmp_path: Path, demo_model_dir: Path) -> None:
    out = run_on_demo_model(LLAMA_INDEX, tmp_path, demo_model_dir)
    # query(): three reranked source nodes, with generative and retrieval scores; aquery(): their ids;
    # postprocess_nodes(top_n=2) on the same retrieved nodes: the first two of them.
    scored = scored_ids(out)
    assert out.count("retrieval=") == 3 and len(scored) == 3 + 2
    assert str(scored[:3]) in out
    assert scored[3:] == scored[:2]
    # The demo model scores word overlap: the only node naming the river, Paris and "flows".
    assert scored[0] == "seine"
    # The committed outputs agree with the run where every machine agrees: the first node (well
    # ahead) and how many are printed. The order below it is not compared: float32 rounding in the
    # demo model's training differs with the CPU's vector width (AVX2, AVX-512), and over 400 steps
    # that moves the close scores of the other nodes.
    shown = scored_ids(printed(committed(LLAMA_INDEX)))
    assert (shown[0], shown[3], len(shown)) == (scored[0], scored[3], len(scored))
