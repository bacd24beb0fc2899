"""Shared fixtures: one tiny random Qwen3 (real tokenizer) and one demo model per test run, loaded the
way users load.

Under pytest-xdist (``-n``) every worker is a session of its own: the model folders are built once
per run by whichever worker asks first, under a file lock, in the folder all workers share; and each
worker gets an equal share of the CPU cores for torch, so that the workers do not oversubscribe them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from genscore_core import GenerativeScorer
from genscore_core.testing.tiny_model import make_tiny_model
from tests.helpers.demo_cli import make_demo_model_cli

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    torch.set_num_threads(int(_THREADS))
    # The same share for the Python subprocesses tests start (the CLI, servers, notebooks' kernels).
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _THREADS)


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    torch.manual_seed(0)


def _built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``root/name`` built by ``build`` once per run, also when xdist workers ask for it together."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's folder, above each worker's own
    out = root / name
    done = root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random-weight Qwen3ForCausalLM with the real Qwen3 tokenizer."""
    return _built_once(tmp_path_factory, "tiny-qwen3", make_tiny_model)


@pytest.fixture(scope="session")
def scorer(tiny_model_dir: Path) -> GenerativeScorer:
    """A CPU fp32 scorer on the tiny model, shared by tests that only read from it."""
    return GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)


def _make_demo_model(out: Path) -> None:
    """Through the command line, as the README does."""
    done = make_demo_model_cli(out, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "DEMO MODEL" in done.stderr


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo reranker, trained once per run (one to two minutes)."""
    return _built_once(tmp_path_factory, "demo-model", _make_demo_model)
