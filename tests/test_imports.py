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
        "LocalSettings", "PromptSettings", "ServerSettings",
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
