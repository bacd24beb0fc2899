"""Prompts built and checked, ready to score: the step between a request and the backend.

Splitting *prepare* from *run* lets a server check and tokenize many requests concurrently, then
score their jobs together in one engine call.
"""

from __future__ import annotations

from dataclasses import dataclass

from genscore_core.backend import ScoringJob
from genscore_core.prompts import EncodedPrompt
from genscore_core.protocol import GenerativeScoringResponse, ScoreData, UsageInfo


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

    def assemble(self, scores: list[list[float]]) -> list[tuple[float, EncodedPrompt]]:
        """(score, prompt) of each pair in input order, from the scores of :attr:`jobs`."""
        results = [(0.0, prompt) for prompt in self.prompts]
        for positions, job_scores in zip(self.positions, scores):
            for position, score in zip(positions, job_scores):
                results[position] = (score, self.prompts[position])
        return results

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every prompt, duplicates included: what a server reports as usage."""
        return sum(len(prompt.token_ids) for prompt in self.prompts)
