"""Prompts built and checked, ready to score: the step between a request and the backend.

Splitting *prepare* from *run* lets a server check and tokenize many requests concurrently, then
score their jobs together in one engine call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from genscore_core.backend import ScoringJob
from genscore_core.calibration import Calibration
from genscore_core.prompts import EncodedPrompt
from genscore_core.protocol import GenerativeScoringResponse, ScoreData, UsageInfo

P = TypeVar("P")


def scores_in_input_order(
    positions: Sequence[Sequence[int]], prompts: Sequence[P], scores: Sequence[Sequence[float]]
) -> list[tuple[float, P]]:
    """(score, prompt) of each pair in input order, where ``scores[j][k]`` is the score of the pair at
    input position ``positions[j][k]``. Every pair gets exactly one score, or this raises: a score
    left out or a count that does not match is a bug upstream, never a pair dropped or scored 0."""
    results: list[tuple[float, P] | None] = [None] * len(prompts)
    for job_positions, job_scores in zip(positions, scores, strict=True):
        for position, score in zip(job_positions, job_scores, strict=True):
            results[position] = (score, prompts[position])
    missing = [index for index, result in enumerate(results) if result is None]
    if missing:
        raise RuntimeError(f"no score for the pair at input position {missing[0]} ({len(missing)} in all)")
    return [result for result in results if result is not None]


@dataclass(frozen=True)
class PreparedScore:
    """A checked protocol request and its prompts: score :attr:`job`, then answer with :meth:`response`."""

    prompts: list[EncodedPrompt]
    job: ScoringJob
    model: str

    def response(self, scores: list[float]) -> GenerativeScoringResponse:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return GenerativeScoringResponse(
            model=self.model,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens, completion_tokens=0),
        )


@dataclass(frozen=True)
class PreparedPairs:
    """(query, document) pairs and their prompts, grouped into one job per distinct query.

    Each job's :attr:`~genscore_core.backend.ScoringJob.texts` holds its query and documents.
    """

    positions: list[list[int]]
    """Input position of each document of each job."""
    prompts: list[EncodedPrompt]
    """The prompt of each pair, in input order."""
    jobs: list[ScoringJob]
    calibration: Calibration | None = field(default=None, kw_only=True)
    """Maps the jobs' scores to probabilities of relevance (``score_mode="calibrated"``)."""

    def assemble(self, scores: list[list[float]]) -> list[tuple[float, EncodedPrompt]]:
        """(score, prompt) of each pair in input order, from the scores of :attr:`jobs` (calibrated
        where :attr:`calibration` is set)."""
        if self.calibration is not None:
            scores = [self.calibration.apply(job_scores) for job_scores in scores]
        return scores_in_input_order(self.positions, self.prompts, scores)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every prompt, duplicates included: what a server reports as usage."""
        return sum(len(prompt.token_ids) for prompt in self.prompts)
