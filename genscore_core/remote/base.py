"""What a scoring backend is: the local engine, or a client of a scoring server.

:class:`~genscore_core.GenerativeScorer` builds prompts and hands :class:`ScoringJob` s to a backend.
The local :class:`~genscore_core.engine.ScoringEngine` is one; the classes of this package are the
others. This module imports nothing beyond genscore, so the scorer can use it without ``httpx``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, Protocol

from genscore_core.engine import ScoringJob
from genscore_core.errors import GenScoreError
from genscore_core.forward import ProgressCallback

ServerKind = Literal["genscore", "vllm", "sglang", "rerank"]
SERVER_KINDS: tuple[ServerKind, ...] = ("genscore", "vllm", "sglang", "rerank")


class ScoringBackend(Protocol):
    """Scores token-id prompts: one list of scores per job, in prompt order."""

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]: ...


class RemoteScoringError(GenScoreError):
    """A scoring server could not be reached, or kept failing, or answered something unreadable.

    ``status`` is the last HTTP status received, ``None`` when no answer came at all.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RemoteBackend(ABC):
    """A client of one scoring server.

    Token-level backends (``accepts_token_ids``) receive the exact prompts the local engine would
    score, so templates, truncation and label ids stay on the client and scores match local ones.
    A text backend (``/v1/rerank``) only sends (query, documents); the server applies its own template.
    """

    kind: ServerKind
    accepts_token_ids: bool = True

    @abstractmethod
    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Scores of every prompt of every job, in job order then prompt order."""

    @abstractmethod
    async def ascore_jobs(self, jobs: Sequence[ScoringJob]) -> list[list[float]]:
        """:meth:`score_jobs` without blocking the event loop."""

    def score_texts(self, query: str, documents: Sequence[str]) -> list[float]:
        """Score of each document for ``query``, templated by the server (text backends only)."""
        raise NotImplementedError(f"{type(self).__name__} scores token ids, not texts")

    async def ascore_texts(self, query: str, documents: Sequence[str]) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} scores token ids, not texts")

    @abstractmethod
    def close(self) -> None:
        """Close the connections this backend holds."""
