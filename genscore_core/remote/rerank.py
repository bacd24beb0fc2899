"""Client of the ``/v1/rerank`` shape (Cohere, Jina, vLLM, TEI, ``genscore serve``).

The request carries text only, so the *server* applies its template and truncation: scores equal
local ones only when the server uses the same template, instruction and length limit (as
``genscore serve`` with the same settings does). The client sends the texts each job carries
(:attr:`~genscore_core.backend.ScoringJob.texts`); raw protocol jobs (``GenerativeScorer.score``)
exist only as token ids, cannot be expressed in this shape, and are refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from genscore_core.backend import JobTexts, ProgressCallback, ScoringJob
from genscore_core.errors import ConfigurationError, InvalidRequestError
from genscore_core.remote.answers import scores_by_index
from genscore_core.remote.client import HttpBackend
from genscore_core.templates import ScoreMode


class RerankClient(HttpBackend):
    kind = "rerank"
    path = "/v1/rerank"

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        results = []
        for job in jobs:
            scores: list[float] = []
            for start, payload in self._payloads(job):
                count = len(payload["documents"])
                scores.extend(self._parse(self.http.post_json(self.path, payload), count, start, job.mode))
                if on_progress is not None:
                    on_progress(count)
            results.append(scores)
        return results

    async def ascore_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        limit = asyncio.Semaphore(self.max_concurrency)
        plans = [self._payloads(job) for job in jobs]

        async def send(start: int, payload: dict[str, Any], mode: ScoreMode) -> list[float]:
            async with limit:
                body = await self.http.apost_json(self.path, payload)
            count = len(payload["documents"])
            if on_progress is not None:
                on_progress(count)
            return self._parse(body, count, start, mode)

        async def score(payloads: list[tuple[int, dict[str, Any]]], mode: ScoreMode) -> list[float]:
            chunks = await asyncio.gather(*(send(start, payload, mode) for start, payload in payloads))
            return [value for chunk in chunks for value in chunk]

        return list(await asyncio.gather(*(score(payloads, job.mode) for payloads, job in zip(plans, jobs))))

    def _payloads(self, job: ScoringJob) -> list[tuple[int, dict[str, Any]]]:
        """The requests of one job, each with the place of its first document in the job.

        The job's prompts (built here with the client's template) size the requests: the server
        builds its own, of the same length when its template is the same.
        """
        texts = _texts_of(job)
        spans = self._spans(job.prompts) if len(job.prompts) == len(texts.documents) else None
        if spans is None:  # no prompt per document to measure: items alone size the requests
            spans = [
                (start, min(start + self.batch_size, len(texts.documents)))
                for start in range(0, len(texts.documents), self.batch_size)
            ]
        payloads = []
        for start, stop in spans:
            chunk = list(texts.documents[start:stop])
            payload: dict[str, Any] = {"query": texts.query, "documents": chunk, "top_n": len(chunk)}
            if self.model is not None:
                payload["model"] = self.model
            payloads.append((start, payload))
        return payloads

    def _parse(
        self, body: Any, count: int, offset: int = 0, mode: ScoreMode = "label-softmax"
    ) -> list[float]:
        """Scores of score mode ``mode`` by input index from ``{"results": [{"index", "relevance_score"}]}``.

        SGLang's own ``/v1/rerank`` answers a bare list of ``{"index", "score"}``; that is read too.
        The server applies its own score mode; ``genscore serve`` names it (``score_mode``), and one
        other than ``mode`` is refused: its scores would rank and threshold as the wrong kind of number
        even where they fall in the range of ``mode``. Other servers are held to the range of ``mode``.
        """
        served = body.get("score_mode") if isinstance(body, dict) else None
        if served is not None and served != mode:
            raise ConfigurationError(
                f"{self.http.base_url}{self.path} scores in score mode {served!r}, this client in {mode!r}: "
                f"set score_mode={served!r} here, or serve with --score-mode {mode}",
                setting="score_mode",
            )
        entries = body.get("results") if isinstance(body, dict) else body
        entries = self._listed(entries, count, f"results for {count} documents (top_n ignored?)")
        try:
            return scores_by_index(
                entries,
                count,
                lambda entry: entry["relevance_score"] if "relevance_score" in entry else entry["score"],
                offset,
                mode,
            )
        except ValueError as error:
            raise self._bad_answer(f"a malformed result ({error})") from None


def _texts_of(job: ScoringJob) -> JobTexts:
    if job.texts is None:
        raise InvalidRequestError(
            "server_kind='rerank' sends text and lets the server apply its own template, so it cannot score "
            "token-id prompts (GenerativeScorer.score); use server_kind 'genscore', 'vllm' or 'sglang'"
        )
    return job.texts
