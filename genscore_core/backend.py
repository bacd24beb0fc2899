"""The backend contract: what scores :class:`ScoringJob` s, whoever it is.

A :class:`~genscore_core.GenerativeScorer` is a front end (templates, truncation, protocol checks:
:mod:`genscore_core.frontend`) composed with one :class:`ScoringBackend`. Three kinds implement it:

* :class:`~genscore_core.engine.ScoringEngine`: the model on this machine;
* the HTTP clients of :mod:`genscore_core.remote`: a scoring server elsewhere;
* :class:`~genscore_core.server.RequestBatcher`: ``genscore serve``'s queue, which batches the jobs
  of concurrent requests into one call of the backend behind it.

A job carries token-id prompts, and, when it came from (query, documents) texts, those texts too
(:attr:`ScoringJob.texts`). Token-level backends score the prompts; a backend that only speaks text
(``/v1/rerank``) scores the texts and refuses jobs that have none (raw protocol requests). So one
contract covers both, and no flag tells the scorer which method to call.

This module imports nothing heavy (no torch, no httpx): every side can name the contract.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from genscore_core.request_life import RequestAbandoned
from genscore_core.templates import ScoreMode

T = TypeVar("T")

ProgressCallback = Callable[[int], None]
"""Called with the number of prompts just scored."""


@dataclass(frozen=True)
class JobTexts:
    """The texts a templated job was built from: ``documents[i]`` became ``prompts[i]``."""

    query: str
    documents: tuple[str, ...]


@dataclass(frozen=True)
class ScoringJob:
    """The prompts of one request (or of one query of a request), scored with the same labels."""

    prompts: list[list[int]]
    label_ids: list[int]
    apply_softmax: bool = True
    """The protocol's switch: normalise over the labels (True) or the whole vocabulary (False)."""
    texts: JobTexts | None = None
    """The (query, documents) behind the prompts, for backends that template texts themselves;
    ``None`` for raw protocol requests, which exist only as token ids."""
    score_mode: ScoreMode | None = None
    """A score mode that overrides ``apply_softmax`` (templated jobs set it; see :attr:`mode`)."""

    @property
    def mode(self) -> ScoreMode:
        """The score mode the job is scored with: ``score_mode``, else what ``apply_softmax`` says."""
        if self.score_mode is not None:
            return self.score_mode
        return "label-softmax" if self.apply_softmax else "vocab-softmax"


class ScoringBackend(ABC):
    """Scores jobs: one list of scores per job, in job order then prompt order.

    Implementations override :meth:`score_jobs`; those with native async I/O also override
    :meth:`ascore_jobs`, whose default runs :meth:`score_jobs` on a worker thread so the event loop
    keeps running.
    """

    @abstractmethod
    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Scores of every prompt of every job, in job order then prompt order.

        Raises:
            InvalidRequestError: A job this backend cannot score (e.g. a raw job for a text backend).
            RemoteScoringError: A server behind the backend could not be reached or kept failing.
        """

    async def ascore_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """:meth:`score_jobs` without blocking the event loop; cancelled, it stops at its next batch
        (:func:`in_worker_thread`)."""
        return await in_worker_thread(lambda progress: self.score_jobs(jobs, progress), on_progress)

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (connections); the default holds nothing."""


async def in_worker_thread(
    work: Callable[[ProgressCallback], T], on_progress: ProgressCallback | None = None
) -> T:
    """``work(progress)`` on a worker thread, the event loop running meanwhile; ``work`` reports each
    batch it finishes to ``progress``, which passes it on to ``on_progress``.

    Cancelling the awaiting task (``asyncio.wait_for``'s timeout, a caller gone) cannot stop the
    thread, which would score the rest of the call for nobody while later calls waited for the model.
    So from then on ``progress`` raises :class:`~genscore_core.request_life.RequestAbandoned`: the
    call ends at its next batch (a streamed call's producer thread stops and is joined) and the model
    is free again. A call cancelled before its thread starts does not start.
    """
    abandoned = threading.Event()

    def progress(done: int) -> None:
        if abandoned.is_set():
            raise RequestAbandoned("the call was cancelled; its remaining batches were dropped")
        if on_progress is not None:
            on_progress(done)

    def run() -> T:
        if abandoned.is_set():
            raise RequestAbandoned("the call was cancelled before it started")
        return work(progress)

    try:
        return await asyncio.to_thread(run)
    except asyncio.CancelledError:
        abandoned.set()
        raise
