"""What every client of a scoring server shares: :class:`HttpBackend` (a transport, an endpoint and
how large one request may be) and :class:`TokenScoringClient` (token-id prompts sent as a shared
``query`` and the ``items`` after it, split into requests and sent in parallel). The HTTP plumbing is
:mod:`genscore_core.remote.transport`; reading scores out of an answer, :mod:`genscore_core.remote.answers`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from genscore_core.backend import ProgressCallback, ScoringBackend, ScoringJob
from genscore_core.config import ServerKind
from genscore_core.errors import InvalidRequestError, RemoteScoringError
from genscore_core.prefixes import group_prompts
from genscore_core.remote.transport import HttpTransport


@dataclass(frozen=True)
class _Call:
    job: int
    """Index of the job the call scores part of."""
    count: int
    """Number of items (prompts) sent."""
    start: int
    """Place of the first item sent among the job's items."""
    payload: dict[str, Any]


REQUEST_TOKEN_BUDGET = 262_144
"""Most prompt tokens the client puts in one request: ``genscore serve``'s default
``--max-prompt-tokens``, which refuses a request over it. With items alone capping a request, the
default 256 items of documents over ~1,000 tokens each made every large job fail against a server
with default settings. Servers without such a limit (vLLM, SGLang) just get smaller requests."""


def request_spans(lengths: Sequence[int], max_items: int, max_tokens: int) -> list[tuple[int, int]]:
    """``(start, stop)`` runs of consecutive prompts of ``lengths`` tokens: each run at most ``max_items``
    prompts and ``max_tokens`` tokens, but never empty (a prompt longer than ``max_tokens`` goes alone,
    for the server to accept or refuse with its own message)."""
    spans = []
    start, tokens = 0, 0
    for index, length in enumerate(lengths):
        if index > start and (index - start >= max_items or tokens + length > max_tokens):
            spans.append((start, index))
            start, tokens = index, 0
        tokens += length
    if start < len(lengths):
        spans.append((start, len(lengths)))
    return spans


class HttpBackend(ScoringBackend):
    """What every client of a scoring server holds: the transport, the endpoint and request sizing.

    ``batch_size`` caps the items of one HTTP request and ``max_request_tokens`` their prompts' tokens
    (:data:`REQUEST_TOKEN_BUDGET`); bigger jobs become several requests, at most ``max_concurrency``
    in flight at once.
    """

    path: str
    kind: ServerKind

    def __init__(
        self,
        http: HttpTransport,
        *,
        model: str | None = None,
        batch_size: int = 256,
        max_concurrency: int = 8,
        max_request_tokens: int = REQUEST_TOKEN_BUDGET,
    ) -> None:
        if batch_size < 1 or max_concurrency < 1 or max_request_tokens < 1:
            raise ValueError("batch_size, max_concurrency and max_request_tokens must be positive")
        self.http = http
        self.model = model
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.max_request_tokens = max_request_tokens

    def _spans(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """How a job's prompts are split into requests (:func:`request_spans`)."""
        return request_spans([len(prompt) for prompt in prompts], self.batch_size, self.max_request_tokens)

    def close(self) -> None:
        self.http.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.http.base_url + self.path!r}, kind={self.kind!r})"

    def _bad_answer(self, detail: str) -> RemoteScoringError:
        return RemoteScoringError(f"{self.http.base_url}{self.path} answered {detail}", status=200)

    def _listed(self, entries: Any, count: int, what: str) -> list[Any]:
        """``entries``, the list of an answer that should hold ``count`` of them; otherwise the error
        that the server answered ``<how many> <what>``."""
        if not isinstance(entries, list) or len(entries) != count:
            got = len(entries) if isinstance(entries, list) else "no"
            raise self._bad_answer(f"{got} {what}")
        return entries


class TokenScoringClient(HttpBackend):
    """A backend that sends token-id prompts as ``query`` (their shared prefix) + ``items`` (the rests).

    Prompts are concatenated at token level by every server that speaks these protocols, so the
    server scores exactly the prompts built here. Jobs larger than ``batch_size`` items are split
    into several requests, sent in parallel (at most ``max_concurrency`` at a time).
    """

    def _payload(self, query: list[int], items: list[list[int]], job: ScoringJob) -> dict[str, Any]:
        """The request body every such protocol shares; a server kind adds its own fields."""
        return {
            "query": query,
            "items": items,
            "label_token_ids": job.label_ids,
            "apply_softmax": job.apply_softmax,
        }

    def _parse(
        self, body: Any, count: int, offset: int = 0, request: dict[str, Any] | None = None
    ) -> list[float]:
        """The scores of a request for ``count`` items, the first being item ``offset`` of its job;
        ``request`` is the body sent, for answers that can be checked against it."""
        raise NotImplementedError

    def _plan(self, jobs: Sequence[ScoringJob]) -> list[_Call]:
        calls = []
        for index, job in enumerate(jobs):
            if job.mode not in ("label-softmax", "vocab-softmax"):
                # These protocols return probabilities only (apply_softmax true or false). A label
                # softmax over one label is always 1, so a single-label model is not sent there.
                usable = "'label-softmax' or 'vocab-softmax'" if len(job.label_ids) > 1 else "'vocab-softmax'"
                raise InvalidRequestError(
                    f"score_mode {job.mode!r} cannot be asked of a scoring server's {self.path}, which "
                    f"returns probabilities only: use {usable}, or server_kind='rerank' against a "
                    f"genscore serve scoring in {job.mode!r} (it scores the text in its own mode)",
                    param="score_mode",
                )
            if job.logit_temperature != 1.0 and job.mode == "label-softmax":
                # The protocols have no temperature: the server would normalise the raw logits.
                raise InvalidRequestError(
                    f"this template divides its label logits by {job.logit_temperature:g} before "
                    f"normalising them, which a scoring server's {self.path} cannot: use "
                    "server_kind='rerank' against a genscore serve of this model",
                    param="score_mode",
                )
            group = group_prompts(job.prompts)
            for start, stop in self._spans(job.prompts):
                items = group.suffix_ids[start:stop]
                payload = self._payload(group.prefix_ids, items, job)
                if self.model is not None:
                    payload["model"] = self.model
                calls.append(_Call(index, len(items), start, payload))
        return calls

    def _collect(
        self, jobs: Sequence[ScoringJob], calls: list[_Call], answers: Iterable[Any]
    ) -> list[list[float]]:
        results: list[list[float]] = [[] for _ in jobs]
        for call, body in zip(calls, answers):
            results[call.job].extend(self._parse(body, call.count, call.start, call.payload))
        return results

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        calls = self._plan(jobs)

        def send(call: _Call) -> Any:
            body = self.http.post_json(self.path, call.payload)
            if on_progress is not None:
                on_progress(call.count)
            return body

        if len(calls) <= 1:
            return self._collect(jobs, calls, [send(call) for call in calls])
        with ThreadPoolExecutor(min(len(calls), self.max_concurrency), "genscore-remote") as pool:
            return self._collect(jobs, calls, list(pool.map(send, calls)))

    async def ascore_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        calls = self._plan(jobs)
        limit = asyncio.Semaphore(self.max_concurrency)

        async def send(call: _Call) -> Any:
            async with limit:
                body = await self.http.apost_json(self.path, call.payload)
            if on_progress is not None:
                on_progress(call.count)
            return body

        return self._collect(jobs, calls, await asyncio.gather(*(send(call) for call in calls)))
