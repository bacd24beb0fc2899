"""Shared fixtures: one tiny random Qwen3 (real tokenizer) per test session, loaded the way users load."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from genscore_core import GenerativeScorer
from genscore_core.testing.tiny_model import make_tiny_model


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random-weight Qwen3ForCausalLM with the real Qwen3 tokenizer."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def scorer(tiny_model_dir: Path) -> GenerativeScorer:
    """A CPU fp32 scorer on the tiny model, shared by tests that only read from it."""
    return GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Written once per session through the command line, as the README does."""
    out = tmp_path_factory.mktemp("demo") / "model"
    done = subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "make-demo-model", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "DEMO MODEL" in done.stderr
    return out
