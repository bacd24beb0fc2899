"""The offline demo model ranks because it is trained: written by the CLI, loaded the way users load
models, it puts documents that share the query's words first, on words its training never saw; its
untrained start does not; and two builds with the same seed give the same weights."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from genscore_core import GenerativeScorer
from genscore_core.testing.demo_model import (
    build_demo_model,
    held_out_words,
    make_demo_model,
    ndcg_at,
    synthetic_query,
)
from tests.helpers.demo_cli import make_demo_model_cli


@pytest.fixture(scope="session")
def demo_scorer(demo_model_dir: Path) -> GenerativeScorer:
    return GenerativeScorer(str(demo_model_dir), device="cpu", dtype="float32")


def held_out_ndcg(scorer: GenerativeScorer) -> float:
    """Mean nDCG@10 over 30 synthetic queries of 12 documents, built from words training never saw;
    a document's gain is how many of the query's words it contains."""
    rng = random.Random(2026)
    words = held_out_words(scorer.tokenizer)
    values = []
    for _ in range(30):
        query, documents, shared, _size = synthetic_query(rng, words, 12)
        values.append(ndcg_at(scorer.score_documents(query, documents), shared, k=10))
    return sum(values) / len(values)


@pytest.mark.slow
def test_ranks_held_out_synthetic_queries(demo_scorer: GenerativeScorer) -> None:
    assert held_out_ndcg(demo_scorer) >= 0.9


@pytest.mark.slow
def test_the_untrained_start_does_not_rank(tmp_path: Path) -> None:
    # Training, not the starting weights, makes the ranking: random order scores about 0.67 here.
    start = make_demo_model(tmp_path / "start", train_steps=0)
    assert held_out_ndcg(GenerativeScorer(str(start), device="cpu", dtype="float32")) < 0.8


@pytest.mark.slow
def test_same_seed_same_weights_and_every_parameter_trained() -> None:
    first, tokenizer = build_demo_model(train_steps=3)
    second, _ = build_demo_model(train_steps=3)
    other_seed, _ = build_demo_model(train_steps=3, seed=1)
    start, _ = build_demo_model(train_steps=0)
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(
        a["model.embed_tokens.weight"], other_seed.state_dict()["model.embed_tokens.weight"]
    )

    # Three steps move every parameter tensor; embedding rows move only for tokens that occur in
    # training, so a held-out word keeps its random start code.
    trained, initial = dict(first.named_parameters()), dict(start.named_parameters())
    assert [name for name in trained if torch.equal(trained[name], initial[name])] == []
    table, start_table = trained["model.embed_tokens.weight"], initial["model.embed_tokens.weight"]
    (held_out,) = tokenizer.encode(" " + held_out_words(tokenizer)[0], add_special_tokens=False)
    (the,) = tokenizer.encode(" the", add_special_tokens=False)
    assert torch.equal(table[held_out], start_table[held_out])
    assert not torch.equal(table[the], start_table[the])


@pytest.mark.slow
def test_the_callers_thread_count_does_not_change_the_weights() -> None:
    # Training pins its own thread count: a machine with more cores (or an xdist worker given fewer)
    # writes the same weights. Other CPUs (AVX2 against AVX-512) still round differently: the
    # notebook checks compare only what does not depend on that.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two, _ = build_demo_model(train_steps=3)
        torch.set_num_threads(1)
        one, _ = build_demo_model(train_steps=3)
        assert torch.get_num_threads() == 1  # and the caller's setting is given back
    finally:
        torch.set_num_threads(before)
    a, b = one.state_dict(), two.state_dict()
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


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
    done = make_demo_model_cli(tmp_path)
    assert done.returncode == 2
    assert "--force" in done.stderr
    assert (tmp_path / "README.md").read_text() == "mine\n"


@pytest.mark.slow
def test_make_demo_model_keeps_the_same_model(demo_model_dir: Path) -> None:
    weights = demo_model_dir / "model.safetensors"
    before = (weights.stat().st_mtime_ns, weights.read_bytes())
    done = make_demo_model_cli(demo_model_dir)
    assert done.returncode == 0, done.stderr
    assert "kept it" in done.stderr
    assert (weights.stat().st_mtime_ns, weights.read_bytes()) == before

    other_seed = make_demo_model_cli(demo_model_dir, "--seed", "1")
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
