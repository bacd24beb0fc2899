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

The doors of the contract:

* :meth:`ScoringBackend.score_jobs` / :meth:`~ScoringBackend.ascore_jobs`: whole jobs;
* :meth:`ScoringBackend.score_stream`: a call whose prompts arrive in parts (:class:`StreamedJob`,
  :class:`JobPart`) as they are tokenized; by default gathered, then scored by ``score_jobs``. A
  backend that scores early parts while later ones are made overrides it and says so
  (:attr:`~ScoringBackend.streams`);
* :attr:`ScoringBackend.local_model`: the model a backend runs in this process, or None;
* :class:`LaunchAhead`, an optional capability: a call's host work done ahead, then its device
  work queued and its scores collected separately (``genscore serve``'s batcher lays call k+1 out
  while call k runs on the GPU).

This module imports nothing heavy (no torch, no httpx): every side can name the contract.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

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
    logit_temperature: float = 1.0
    """What the label logits are divided by before the mode makes a score of them (the template's
    ``logit_temperature``: zerank's 5); the raw ``logit`` and ``vocab-softmax`` modes ignore it."""

    @property
    def mode(self) -> ScoreMode:
        """The score mode the job is scored with: ``score_mode``, else what ``apply_softmax`` says."""
        if self.score_mode is not None:
            return self.score_mode
        return "label-softmax" if self.apply_softmax else "vocab-softmax"


@dataclass(frozen=True)
class StreamedJob:
    """A job whose ``size`` prompts arrive later, in parts (:meth:`ScoringBackend.score_stream`)."""

    size: int
    label_ids: list[int]
    mode: ScoreMode = "label-softmax"
    logit_temperature: float = 1.0
    """As :attr:`ScoringJob.logit_temperature`."""


@dataclass(frozen=True)
class JobPart:
    """Some of the prompts (token ids) of job ``job``, in the job's prompt order."""

    job: int
    prompts: Sequence[Sequence[int]]


@dataclass(frozen=True)
class StreamLayout:
    """How a backend that runs forward batches of its own lays out a streamed call; a hint, which
    a backend without such batches (a server client, the default :meth:`ScoringBackend.score_stream`)
    ignores. The default: the first batch small, so that the device starts early, each later one
    larger."""

    batch_tokens: int | None = None
    """Every batch filled to this many tokens (the last holds the rest), so that batch shapes repeat
    from call to call (``genscore serve --forward-batch-tokens``); must be positive."""


def streamed(jobs: Sequence[ScoringJob]) -> tuple[list[StreamedJob], list[JobPart]]:
    """Whole ``jobs`` as a streamed call of one part each (jobs without prompts have none)."""
    return (
        [StreamedJob(len(job.prompts), job.label_ids, job.mode, job.logit_temperature) for job in jobs],
        [JobPart(index, job.prompts) for index, job in enumerate(jobs) if job.prompts],
    )


def check_part(sizes: Sequence[int], taken: Sequence[int], part: JobPart) -> None:
    """``part`` is of one of the call's jobs and does not take it past its declared size, ``taken[j]``
    prompts of job ``j`` having come before it. Checked before the part is planned: a job's group
    is closed (its kept prefix released) once its size is reached, so a prompt past it would reach a
    batch that reads a prefix no longer kept."""
    job = part.job
    if not 0 <= job < len(sizes):
        raise ValueError(
            f"a part is of job {job}, but the call has {len(sizes)} jobs (0 to {len(sizes) - 1})"
        )
    if taken[job] + len(part.prompts) > sizes[job]:
        raise ValueError(
            f"job {job} was declared with {sizes[job]} prompts, but its parts hold more "
            f"({taken[job] + len(part.prompts)} by this part)"
        )


def check_all_taken(sizes: Sequence[int], taken: Sequence[int]) -> None:
    """Every job's parts held the prompts it was declared with: a short job would otherwise get
    fewer scores than prompts, silently."""
    for job, (size, count) in enumerate(zip(sizes, taken)):
        if count != size:
            raise ValueError(f"job {job} was declared with {size} prompts, but its parts held {count}")


def gathered(jobs: Sequence[StreamedJob], parts: Iterable[JobPart]) -> list[ScoringJob]:
    """The streamed jobs with all their parts, checked against their sizes: a call for a backend
    that scores whole jobs."""
    sizes = [job.size for job in jobs]
    taken = [0] * len(jobs)
    prompts: list[list[list[int]]] = [[] for _ in jobs]
    for part in parts:
        check_part(sizes, taken, part)
        taken[part.job] += len(part.prompts)
        prompts[part.job].extend(list(p) for p in part.prompts)
    check_all_taken(sizes, taken)
    return [
        ScoringJob(p, job.label_ids, score_mode=job.mode, logit_temperature=job.logit_temperature)
        for p, job in zip(prompts, jobs)
    ]


class ScoringBackend(ABC):
    """Scores jobs: one list of scores per job, in job order then prompt order.

    Implementations override :meth:`score_jobs`; those with native async I/O also override
    :meth:`ascore_jobs`, whose default runs :meth:`score_jobs` on a worker thread so the event loop
    keeps running. :meth:`score_stream` works for every backend; one that overlaps taking the parts
    with scoring them overrides it and sets :attr:`streams`.
    """

    @property
    def streams(self) -> bool:
        """Whether :meth:`score_stream` scores early parts while later ones are made. False (the
        default): it gathers the parts first, so a caller holding whole jobs gains nothing by
        streaming them (and whole jobs carry their texts, :attr:`ScoringJob.texts`, which a
        streamed call does not)."""
        return False

    @property
    def local_model(self) -> Any:
        """The causal LM this backend runs in this process, or None (the default) where the weights
        are elsewhere: a server, or a queue in front of a backend (``genscore serve``'s batcher)."""
        return None

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

    def score_stream(
        self,
        jobs: Sequence[StreamedJob],
        parts: Iterable[JobPart],
        on_progress: ProgressCallback | None = None,
        *,
        layout: StreamLayout | None = None,
    ) -> list[list[float]]:
        """:meth:`score_jobs` of jobs whose prompts are handed over in ``parts`` as they are made.

        The parts of each job come in prompt order and hold its ``size`` prompts, no more, no fewer
        (else ``ValueError`` naming the job). An exception raised by ``parts`` reaches the caller.
        Scores equal :meth:`score_jobs` on the whole jobs. The default gathers every part, then
        scores the jobs; ``layout`` is a hint for backends with forward batches of their own.
        """
        return self.score_jobs(gathered(jobs, parts), on_progress)

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (connections); the default holds nothing."""


@runtime_checkable
class LaunchAhead(Protocol):
    """An optional capability of a backend: a call scored in three steps on up to three threads.

    :meth:`prepare_jobs` does the call's host work (distinct prompts, prefix groups, the forward's
    batches laid out) without touching the device or waiting for the backend, so a server lays out
    call k+1 while call k runs; :meth:`launch_prepared` queues its device work and returns at once;
    :meth:`collect_launched` waits for its scores. ``collect_launched(launch_prepared(
    prepare_jobs(jobs)))`` equals :meth:`ScoringBackend.score_jobs` of ``jobs``. The prepared and
    launched calls are the backend's own objects, opaque to the caller.
    """

    def prepare_jobs(self, jobs: Sequence[ScoringJob], *, lay_out: bool = True) -> Any:
        """The host work of scoring ``jobs``, done now; with ``lay_out`` False the forward lays each
        batch out when it runs instead."""

    def launch_prepared(self, prepared: Any, on_progress: ProgressCallback | None = None) -> Any:
        """Queue the prepared call's work on the device and return without waiting for it."""

    def collect_launched(self, call: Any, on_progress: ProgressCallback | None = None) -> list[list[float]]:
        """The launched call's scores, one list per job (waits for the device)."""


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
