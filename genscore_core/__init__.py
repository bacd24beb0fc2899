"""genscore's engine: rerank documents by a causal LM's next-token label probabilities.

``GenerativeScorer`` composes a front end (``ScoringFrontEnd``: templates, truncation, request checks)
with one backend (``ScoringBackend``: the local ``ScoringEngine``, a server client, or ``genscore
serve``'s batcher); docs/architecture.md draws the whole picture.
"""

from genscore_core.backend import JobTexts, ScoringBackend, ScoringJob
from genscore_core.config import DEFAULT_MODEL, ScorerConfig, scorer_setting_names
from genscore_core.engine import ScoringEngine
from genscore_core.errors import (
    ConfigurationError,
    GenScoreError,
    InvalidRequestError,
    KernelUnavailableError,
    ModelNotFoundError,
    PromptTooLongError,
    RemoteConfigurationError,
    RemoteScoringError,
    ScoreRangeError,
    ServerBusyError,
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

__all__ = [
    "BGE_RERANKER_V2_GEMMA",
    "DEFAULT_MODEL",
    "MXBAI_RERANK_V2",
    "QWEN3_RERANKER",
    "TEMPLATES",
    "ConfigurationError",
    "GenScoreError",
    "GenerativeScorer",
    "GenerativeScoringRequest",
    "GenerativeScoringResponse",
    "InvalidRequestError",
    "JobTexts",
    "KernelUnavailableError",
    "ModelNotFoundError",
    "PromptTemplate",
    "PromptTooLongError",
    "RankedResult",
    "RankedResults",
    "RemoteConfigurationError",
    "RemoteScoringError",
    "ScoreData",
    "ScoreRangeError",
    "ScorerConfig",
    "ScoringBackend",
    "ScoringEngine",
    "ScoringFrontEnd",
    "ScoringJob",
    "ServerBusyError",
    "UsageInfo",
    "check_rank_options",
    "scorer_setting_names",
]

__version__ = "0.1.0"
