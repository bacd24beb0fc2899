"""Ranked results returned by :meth:`GenerativeScorer.rerank`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, overload

from pydantic import BaseModel, ConfigDict

from genscore_core.errors import InvalidRequestError

if TYPE_CHECKING:
    from genscore_core.prompts import PromptInfo
    from genscore_core.templates import ScoreMode


class RankedResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    """Position of the document in the input."""
    score: float
    """The score under the scorer's score mode: a probability in [0, 1], or with
    ``score_mode="logit"`` the label's raw logit."""
    document: str
    truncated: bool
    """Whether the document was shortened to fit the maximum prompt length (or ``max_tokens_per_doc``)."""
    prompt_tokens: int
    window: tuple[int, int] | None = None
    """With ``long_documents="chunk"``: the character span ``[start, end)`` of the window whose score is
    reported (the best one, for ``"max"`` and ``"mean"``; ``(0, len(document))`` for a document that
    fit whole); None when the scorer does not chunk."""
    windows: int = 1
    """How many windows the document was scored as."""


class RankedResults(BaseModel):
    """Results best first; ties keep input order."""

    model_config = ConfigDict(frozen=True)

    query: str
    results: list[RankedResult]
    prompt_tokens: int = 0
    """Tokens of the prompts of every document scored, kept or dropped (the usage servers report)."""

    def __iter__(self) -> Iterator[RankedResult]:  # type: ignore[override]
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @overload
    def __getitem__(self, position: int) -> RankedResult: ...

    @overload
    def __getitem__(self, position: slice) -> list[RankedResult]: ...

    def __getitem__(self, position: int | slice) -> RankedResult | list[RankedResult]:
        """The result at ``position`` (best first), or a list of them for a slice (``ranked[:3]``)."""
        return self.results[position]

    def top_k(self, k: int) -> list[RankedResult]:
        """The ``k`` best results (all of them when there are fewer)."""
        # A plain slice would take a negative k from the end: top_k(-1) gave all but the worst.
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise InvalidRequestError(f"k must be an integer of 0 or more, got {k!r}", param="k")
        return self.results[: int(k)]

    def score_of(self, index: int) -> float:
        """Score of the document that was at ``index`` in the input."""
        for result in self.results:
            if result.index == index:
                return result.score
        raise KeyError(f"no result for input index {index}")


def rank_results(
    query: str,
    documents: Sequence[str],
    scored: Sequence[tuple[float, PromptInfo]],
    *,
    top_n: int | None = None,
    score_threshold: float | None = None,
    score_mode: ScoreMode | None = "label-softmax",
) -> RankedResults:
    """Documents best first (ties in input order), at most ``top_n``, none below ``score_threshold``
    (a score of ``score_mode``: see :func:`check_rank_options`)."""
    check_rank_options(top_n, score_threshold, score_mode=score_mode)
    # Ranked, filtered and cut on the scores first; then every kept result is validated in one call
    # of pydantic's core over plain dicts, which for W1's 256 results took a third of the time of
    # building each model by its own constructor (docs/benchmarks.md, "Small calls").
    order = sorted(range(len(scored)), key=lambda i: _rank_key(scored[i][0]))  # stable: ties keep input order
    if score_threshold is not None:
        order = [i for i in order if scored[i][0] >= score_threshold]
    if top_n is not None:
        order = order[: int(top_n)]
    results = []
    for i in order:
        score, p = scored[i]
        results.append(
            {
                "index": i,
                "score": score,
                "document": documents[i],
                "truncated": p.truncated,
                "prompt_tokens": p.num_tokens,
                "window": p.window,
                "windows": p.windows,
            }
        )
    return RankedResults.model_validate(
        {
            "query": query,
            "results": results,
            "prompt_tokens": sum(p.all_tokens or p.num_tokens for _, p in scored),
        }
    )


def _rank_key(score: float) -> tuple[bool, float]:
    # A NaN compares false with everything, which would scramble a plain sort around it (and
    # ``top_n`` could then drop the best document): NaN scores rank last instead.
    return (math.isnan(score), -score)


def check_rank_options(
    top_n: object,
    score_threshold: object,
    *,
    score_mode: ScoreMode | Literal["auto"] | None = "label-softmax",
) -> None:
    """Raise :class:`~genscore_core.InvalidRequestError` naming the option unless both are usable.

    ``top_n`` must be ``None`` or a positive integer. ``score_threshold`` must be ``None`` or a score
    of ``score_mode``: a number within [0, 1] in every mode but ``"logit"``, where it is a logit, any
    finite number (``-1.5`` keeps documents whose logit is at least -1.5). ``score_mode=None`` is for
    callers that do not know the mode yet (an adapter before its scorer is loaded): any finite number
    passes, and the scorer checks it against its mode again when it ranks; ``"auto"`` is the setting
    that leaves the mode to the recipe, whose modes all score in [0, 1]. NumPy's integers and floats
    count (``top_n=np.int64(5)``, a threshold read off an array); a bool does not.
    """
    if top_n is not None and (
        isinstance(top_n, bool) or not isinstance(top_n, numbers.Integral) or top_n < 1
    ):
        raise InvalidRequestError(f"top_n must be a positive integer or None, got {top_n!r}", param="top_n")
    if score_threshold is None:
        return
    # A logit has no bounds; a mode not known yet might be "logit". Either way it must be finite.
    unbounded = score_mode in ("logit", None)
    if not isinstance(score_threshold, bool) and isinstance(score_threshold, numbers.Real):
        try:
            value = float(score_threshold)
        except OverflowError:  # an integer beyond float's range
            value = math.nan
        if math.isfinite(value) if unbounded else 0.0 <= value <= 1.0:
            return
    problem = "a finite number" if unbounded else "a number within [0, 1]"
    under = "" if score_mode is None else f" under score mode {score_mode!r}"
    hint = "" if unbounded else " (a logit threshold needs score_mode='logit')"
    raise InvalidRequestError(
        f"score_threshold must be {problem}{under} or None, got {score_threshold!r}{hint}",
        param="score_threshold",
    )
