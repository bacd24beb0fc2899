"""genscore's engine: rerank documents by a causal LM's next-token label probabilities."""

from genscore_core.config import DEFAULT_MODEL, ScorerConfig
from genscore_core.engine import ScoringEngine, ScoringJob
from genscore_core.errors import GenScoreError, InvalidRequestError, PromptTooLongError
from genscore_core.protocol import (
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    ScoreData,
    UsageInfo,
)
from genscore_core.results import RankedResult, RankedResults
from genscore_core.scorer import GenerativeScorer
from genscore_core.templates import MXBAI_RERANK_V2, QWEN3_RERANKER, TEMPLATES, PromptTemplate

__all__ = [
    "DEFAULT_MODEL",
    "MXBAI_RERANK_V2",
    "QWEN3_RERANKER",
    "TEMPLATES",
    "GenScoreError",
    "GenerativeScorer",
    "GenerativeScoringRequest",
    "GenerativeScoringResponse",
    "InvalidRequestError",
    "PromptTemplate",
    "PromptTooLongError",
    "RankedResult",
    "RankedResults",
    "ScoreData",
    "ScorerConfig",
    "ScoringEngine",
    "ScoringJob",
    "UsageInfo",
]

__version__ = "0.1.0"
