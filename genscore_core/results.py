"""Ranked results returned by :meth:`GenerativeScorer.rerank`."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict


class RankedResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    """Position of the document in the input."""
    score: float
    """Probability of the positive label, in [0, 1]."""
    document: str
    truncated: bool
    """Whether the document was shortened to fit the maximum prompt length."""
    prompt_tokens: int


class RankedResults(BaseModel):
    """Results best first; ties keep input order."""

    model_config = ConfigDict(frozen=True)

    query: str
    results: list[RankedResult]

    def __iter__(self) -> Iterator[RankedResult]:  # type: ignore[override]
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, position: int) -> RankedResult:
        return self.results[position]

    def top_k(self, k: int) -> list[RankedResult]:
        return self.results[:k]

    def score_of(self, index: int) -> float:
        """Score of the document that was at ``index`` in the input."""
        for result in self.results:
            if result.index == index:
                return result.score
        raise KeyError(f"no result for input index {index}")
