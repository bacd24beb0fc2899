"""The offline demo model ranks: it is written by the CLI, loaded the way users load models, and puts
documents that share the query's words first, on words its training never saw."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from genscore_core import GenerativeScorer
from genscore_core.testing.demo_model import held_out_words, ndcg_at, synthetic_query


@pytest.fixture(scope="session")
def demo_scorer(demo_model_dir: Path) -> GenerativeScorer:
    return GenerativeScorer(str(demo_model_dir), device="cpu", dtype="float32")


@pytest.mark.slow
def test_ranks_held_out_synthetic_queries(demo_scorer: GenerativeScorer) -> None:
    # Gains: how many query words a document contains; the words were never seen in training.
    rng = random.Random(2026)
    words = held_out_words(demo_scorer.tokenizer)
    values = []
    for _ in range(30):
        query, documents, shared, _size = synthetic_query(rng, words, 12)
        values.append(ndcg_at(demo_scorer.score_documents(query, documents), shared, k=10))
    assert sum(values) / len(values) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "documents", "best"),
    [
        (
            "What is the capital of France?",
            ["Berlin is the capital of Germany.", "Paris is the capital of France."],
            1,
        ),
        (
            "Which river flows through Paris?",
            [
                "The Danube flows through Vienna.",
                "The Seine flows through Paris.",
                "The Spree flows through Berlin.",
            ],
            1,
        ),
    ],
)
def test_documentation_examples_put_the_relevant_document_first(
    demo_scorer: GenerativeScorer, query: str, documents: list[str], best: int
) -> None:
    ranked = demo_scorer.rerank(query, documents)
    assert ranked[0].index == best
    assert ranked[0].score > ranked[1].score + 0.05


def test_make_demo_model_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("mine\n")
    done = subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "make-demo-model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "--force" in done.stderr
    assert (tmp_path / "README.md").read_text() == "mine\n"


@pytest.mark.slow
def test_make_demo_model_keeps_the_same_model(demo_model_dir: Path) -> None:
    weights = demo_model_dir / "model.safetensors"
    before = (weights.stat().st_mtime_ns, weights.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "make-demo-model", str(demo_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "kept it" in done.stderr
    assert (weights.stat().st_mtime_ns, weights.read_bytes()) == before

    other_seed = subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "make-demo-model", str(demo_model_dir), "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other_seed.returncode == 2
    assert "--force" in other_seed.stderr


def test_serve_without_the_server_extra_names_it() -> None:
    # None in sys.modules makes `import uvicorn` fail as it does where uvicorn is not installed.
    code = "import sys; sys.modules['uvicorn'] = None\nfrom genscore_core.cli import main\nsys.exit(main(['serve', '--model', 'x']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert 'pip install "genscore[server]"' in done.stderr


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "--version"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0
    assert done.stdout.startswith("genscore ")
