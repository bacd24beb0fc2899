"""The public names, pinned: adding or removing one is a decision this test makes visible."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "genscore_core": [
        "BGE_RERANKER_V2_GEMMA", "DEFAULT_MODEL", "MXBAI_RERANK_V2", "QWEN3_RERANKER", "TEMPLATES",
        "ConfigurationError", "GenScoreError", "GenerativeScorer", "GenerativeScoringRequest",
        "GenerativeScoringResponse", "InvalidRequestError", "JobTexts", "KernelUnavailableError",
        "ModelNotFoundError", "NotARerankerError", "PromptTemplate", "PromptTooLongError", "RankedResult", "RankedResults",
        "RemoteConfigurationError", "RemoteScoringError", "ScoreData", "ScoreRangeError", "ScorerConfig",
        "ScoringBackend", "ScoringEngine", "ScoringFrontEnd", "ScoringJob", "ServerBusyError", "UsageInfo",
        "check_rank_options", "scorer_setting_names",
    ],
    "genscore_integrations": [],
    "genscore_integrations.langchain": [
        "RELEVANCE_SCORE_KEY", "TRUNCATED_KEY", "WINDOW_KEY", "GenerativeCrossEncoder", "GenerativeReranker",
    ],
    "genscore_integrations.llama_index": ["RETRIEVAL_SCORE_KEY", "WINDOW_KEY", "GenerativeRerank"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_pinned_and_every_name_imports(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(PUBLIC[module])
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name


def test_every_error_class_lives_in_errors_and_is_exported() -> None:
    import genscore_core
    from genscore_core import errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__
    }
    assert classes <= set(genscore_core.__all__)
    for name in ("RemoteScoringError", "ServerBusyError", "RemoteConfigurationError", "ModelNotFoundError"):
        assert name in classes


TORCH_FREE = """
import sys
from genscore_core.backend import LaunchAhead, ScoringBackend, StreamedJob, StreamLayout
from genscore_core.config import ScorerConfig
from genscore_core.remote import make_backend
from genscore_core.remote.client import TokenScoringClient
from genscore_core.streaming import BatchPlanner, plan_stream

for kind in ("genscore", "vllm", "sglang", "rerank"):
    config = ScorerConfig(model="m", server_url="http://127.0.0.1:9", server_kind=kind)
    backend = make_backend(config)
    assert backend.local_model is None and not backend.streams, kind
    backend.close()
heavy = sorted(name for name in ("torch", "genscore_core.engine", "genscore_core.forward") if name in sys.modules)
print(",".join(heavy))
"""


def test_the_contract_and_the_http_clients_load_no_torch() -> None:
    """A client of a scoring server builds no model: the backend contract, the streamed-call
    types, the prefix grouping the clients send by, and every HTTP client load neither torch nor
    the engine (a fresh interpreter, so that nothing this test process imported counts)."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, env=os.environ, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded: {done.stdout.strip()}"
