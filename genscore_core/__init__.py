"""genscore's engine: rerank documents by a causal LM's next-token label probabilities.

``GenerativeScorer`` composes a front end (``ScoringFrontEnd``: templates, truncation, request checks)
with one backend (``ScoringBackend``: the local ``ScoringEngine``, a server client, or ``genscore
serve``'s batcher); docs/architecture.md draws the whole picture.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genscore_core.backend import JobTexts, ScoringBackend, ScoringJob
    from genscore_core.config import (
        DEFAULT_MODEL,
        LocalSettings,
        PromptSettings,
        ScorerConfig,
        ServerSettings,
        scorer_setting_names,
    )
    from genscore_core.engine import ScoringEngine
    from genscore_core.errors import (
        AttemptTooLongError,
        BodyTimeoutError,
        BodyTooLargeError,
        ConfigurationError,
        GenScoreError,
        InputChangedError,
        InputError,
        InputFileError,
        InvalidRequestError,
        JobLockedError,
        JobStateError,
        KernelUnavailableError,
        ModelFolderError,
        ModelNotFoundError,
        NotARerankerError,
        NotStandardJSONError,
        PromptTooLongError,
        RemoteConfigurationError,
        RemoteScoringError,
        RepeatedKeyError,
        RequestAbandoned,
        ScoreRangeError,
        ServerBusyError,
        ServerHTTPError,
        StrictJSONError,
        UnknownModelError,
    )
    from genscore_core.frontend import ScoringFrontEnd
    from genscore_core.protocol import (
        GenerativeScoringRequest,
        GenerativeScoringResponse,
        ScoreData,
        UsageInfo,
    )
    from genscore_core.results import RankedResult, RankedResults, check_rank_options
    from genscore_core.scorer import GenerativeScorer
    from genscore_core.templates import (
        BGE_RERANKER_V2_GEMMA,
        MXBAI_RERANK_V2,
        QWEN3_RERANKER,
        TEMPLATES,
        PromptTemplate,
    )

# Each public name is imported on first use: the ``genscore`` command line imports this package, and
# ``genscore --help`` should not wait for torch and transformers to load.
_EXPORTS = {
    "JobTexts": "genscore_core.backend",
    "ScoringBackend": "genscore_core.backend",
    "ScoringJob": "genscore_core.backend",
    "DEFAULT_MODEL": "genscore_core.config",
    "ScorerConfig": "genscore_core.config",
    "PromptSettings": "genscore_core.config",
    "LocalSettings": "genscore_core.config",
    "ServerSettings": "genscore_core.config",
    "scorer_setting_names": "genscore_core.config",
    "ScoringEngine": "genscore_core.engine",
    "AttemptTooLongError": "genscore_core.errors",
    "BodyTimeoutError": "genscore_core.errors",
    "BodyTooLargeError": "genscore_core.errors",
    "ConfigurationError": "genscore_core.errors",
    "GenScoreError": "genscore_core.errors",
    "InputChangedError": "genscore_core.errors",
    "InputError": "genscore_core.errors",
    "InputFileError": "genscore_core.errors",
    "InvalidRequestError": "genscore_core.errors",
    "JobLockedError": "genscore_core.errors",
    "JobStateError": "genscore_core.errors",
    "KernelUnavailableError": "genscore_core.errors",
    "ModelFolderError": "genscore_core.errors",
    "ModelNotFoundError": "genscore_core.errors",
    "NotARerankerError": "genscore_core.errors",
    "NotStandardJSONError": "genscore_core.errors",
    "PromptTooLongError": "genscore_core.errors",
    "RemoteConfigurationError": "genscore_core.errors",
    "RemoteScoringError": "genscore_core.errors",
    "RepeatedKeyError": "genscore_core.errors",
    "RequestAbandoned": "genscore_core.errors",
    "ScoreRangeError": "genscore_core.errors",
    "ServerBusyError": "genscore_core.errors",
    "ServerHTTPError": "genscore_core.errors",
    "StrictJSONError": "genscore_core.errors",
    "UnknownModelError": "genscore_core.errors",
    "ScoringFrontEnd": "genscore_core.frontend",
    "GenerativeScoringRequest": "genscore_core.protocol",
    "GenerativeScoringResponse": "genscore_core.protocol",
    "ScoreData": "genscore_core.protocol",
    "UsageInfo": "genscore_core.protocol",
    "RankedResult": "genscore_core.results",
    "RankedResults": "genscore_core.results",
    "check_rank_options": "genscore_core.results",
    "GenerativeScorer": "genscore_core.scorer",
    "BGE_RERANKER_V2_GEMMA": "genscore_core.templates",
    "MXBAI_RERANK_V2": "genscore_core.templates",
    "QWEN3_RERANKER": "genscore_core.templates",
    "TEMPLATES": "genscore_core.templates",
    "PromptTemplate": "genscore_core.templates",
}

__all__ = [
    "BGE_RERANKER_V2_GEMMA",
    "DEFAULT_MODEL",
    "MXBAI_RERANK_V2",
    "QWEN3_RERANKER",
    "TEMPLATES",
    "AttemptTooLongError",
    "BodyTimeoutError",
    "BodyTooLargeError",
    "ConfigurationError",
    "GenScoreError",
    "GenerativeScorer",
    "GenerativeScoringRequest",
    "GenerativeScoringResponse",
    "InputChangedError",
    "InputError",
    "InputFileError",
    "InvalidRequestError",
    "JobLockedError",
    "JobStateError",
    "JobTexts",
    "KernelUnavailableError",
    "LocalSettings",
    "ModelFolderError",
    "ModelNotFoundError",
    "NotARerankerError",
    "NotStandardJSONError",
    "PromptSettings",
    "PromptTemplate",
    "PromptTooLongError",
    "RankedResult",
    "RankedResults",
    "RemoteConfigurationError",
    "RemoteScoringError",
    "RepeatedKeyError",
    "RequestAbandoned",
    "ScoreData",
    "ScoreRangeError",
    "ScorerConfig",
    "ScoringBackend",
    "ScoringEngine",
    "ScoringFrontEnd",
    "ScoringJob",
    "ServerBusyError",
    "ServerHTTPError",
    "ServerSettings",
    "StrictJSONError",
    "UnknownModelError",
    "UsageInfo",
    "check_rank_options",
    "scorer_setting_names",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
