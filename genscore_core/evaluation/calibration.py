"""Fitting a :class:`~genscore_core.calibration.Calibration` on judged pairs, and measuring it.

Platt scaling fits ``sigmoid(slope * z + intercept)`` to the labels by maximum likelihood, with
Platt's smoothed targets (``(N+ + 1) / (N+ + 2)`` for a relevant pair, ``1 / (N- + 2)`` for the
others) so that data a score separates perfectly still gives a finite fit; Newton's method on the
two parameters, with step halving, converges in a few iterations.

Measured on pairs the fit never saw:

* Brier score: the mean of ``(p - y)^2``; 0 is perfect, 0.25 is what always saying 0.5 scores.
* ECE (expected calibration error): the pairs put in 10 equal-width bins of ``p``; the mean over
  pairs of ``|mean p - share relevant|`` of the pair's bin. 0 means that among pairs scored about 0.7,
  about 70% are relevant.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genscore_core.calibration import CALIBRATION_FILE, Calibration
from genscore_core.errors import InputError
from genscore_core.evaluation.data import JudgedData, ranked
from genscore_core.templates import ScoreMode

if TYPE_CHECKING:
    from genscore_core.scorer import GenerativeScorer

__all__ = ["CALIBRATION_FILE", "brier_score", "calibrate_on", "expected_calibration_error", "fit_platt"]

ECE_BINS = 10


def fit_platt(
    logits: Sequence[float], labels: Sequence[int], *, iterations: int = 100
) -> tuple[float, float]:
    """``(slope, intercept)`` of Platt scaling of ``logits`` to ``labels`` (1 relevant, 0 not)."""
    positives = sum(1 for label in labels if label)
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError(
            f"calibration needs relevant and non-relevant pairs; got {positives} relevant and {negatives} not"
        )
    high, low = (positives + 1) / (positives + 2), 1 / (negatives + 2)
    targets = [high if label else low for label in labels]
    slope, intercept = 1.0, 0.0
    loss = _loss(logits, targets, slope, intercept)
    for _ in range(iterations):
        g_a = g_b = h_aa = h_ab = h_bb = 0.0
        for z, t in zip(logits, targets):
            p = _sigmoid(slope * z + intercept)
            d, w = p - t, p * (1.0 - p)
            g_a += d * z
            g_b += d
            h_aa += w * z * z
            h_ab += w * z
            h_bb += w
        # A tiny ridge keeps the 2x2 system solvable when every z is the same.
        h_aa, h_bb = h_aa + 1e-12, h_bb + 1e-12
        det = h_aa * h_bb - h_ab * h_ab
        step_a = (h_bb * g_a - h_ab * g_b) / det
        step_b = (h_aa * g_b - h_ab * g_a) / det
        scale = 1.0
        while scale > 1e-10:
            a, b = slope - scale * step_a, intercept - scale * step_b
            new_loss = _loss(logits, targets, a, b)
            if new_loss <= loss:
                break
            scale /= 2
        else:
            break
        converged = loss - new_loss < 1e-12 * max(1.0, abs(loss))
        slope, intercept, loss = a, b, new_loss
        if converged:
            break
    return slope, intercept


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _loss(logits: Sequence[float], targets: Sequence[float], slope: float, intercept: float) -> float:
    """Cross-entropy of ``sigmoid(slope * z + intercept)`` against the targets (softplus form: no log(0))."""
    total = 0.0
    for z, t in zip(logits, targets):
        x = slope * z + intercept
        softplus = max(x, 0.0) + math.log1p(math.exp(-abs(x)))  # log(1 + e^x)
        total += softplus - t * x
    return total


def brier_score(probabilities: Sequence[float], labels: Sequence[int]) -> float:
    return sum((p - y) ** 2 for p, y in zip(probabilities, labels)) / len(labels)


def expected_calibration_error(
    probabilities: Sequence[float], labels: Sequence[int], bins: int = ECE_BINS
) -> float:
    """ECE over ``bins`` equal-width bins of [0, 1] (a probability of exactly 1 is in the last)."""
    sums: list[list[float]] = [[0.0, 0.0, 0.0] for _ in range(bins)]  # count, sum p, sum y
    for p, y in zip(probabilities, labels):
        column = sums[min(int(p * bins), bins - 1)]
        column[0] += 1
        column[1] += p
        column[2] += y
    return sum(abs(total_p - total_y) for _, total_p, total_y in sums) / len(labels)


def as_probability(score: float, mode: ScoreMode) -> float:
    """An uncalibrated score read as a probability: the score, or the sigmoid of a raw logit."""
    return _sigmoid(score) if mode == "logit" else score


@dataclass
class CalibrationReport:
    calibration: Calibration
    before: dict[str, float]
    after: dict[str, float]
    counts: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One object per state (before, after): what ``genscore calibrate`` prints."""
        return [
            {"scores": f"raw ({self.calibration.score_mode})", **self.before},
            {"scores": "calibrated", **self.after},
        ]


def split_queries(queries: Sequence[str], held_out: float) -> tuple[list[str], list[str]]:
    """(fit, held-out) queries: the same split on every run and machine (by a CRC of each id)."""
    if len(queries) < 2:
        raise InputError(
            f"calibration needs at least 2 judged queries (one to fit, one to test); got {len(queries)}"
        )
    ordered = sorted(queries, key=lambda query: (zlib.crc32(query.encode("utf-8")), query))
    count = min(max(1, round(held_out * len(ordered))), len(ordered) - 1)
    return ordered[count:], ordered[:count]


def judged_pairs(
    data: JudgedData, candidates: Mapping[str, Mapping[str, float]], query: str
) -> list[tuple[str, int]]:
    """(doc, label) of one query: its candidates and its judged documents in the corpus, relevant
    when judged ``>= 1`` (an unjudged candidate counts as not relevant, as the metrics count it)."""
    judged = data.qrels.get(query, {})
    docs = [doc for doc, _ in ranked(candidates.get(query, {}))]
    docs += [doc for doc in judged if doc in data.corpus and doc not in docs]
    return [(doc, 1 if judged.get(doc, 0) >= 1 else 0) for doc in docs]


def calibrate_on(
    scorer: GenerativeScorer,
    data: JudgedData,
    candidates: Mapping[str, Mapping[str, float]],
    *,
    held_out: float = 0.3,
    progress: bool = False,
) -> CalibrationReport:
    """Score every judged pair, fit on the fit queries, measure before and after on the held-out ones."""
    from tqdm import tqdm

    fit, test = split_queries(list(candidates), held_out)
    pairs = {query: judged_pairs(data, candidates, query) for query in fit + test}
    scores: dict[str, list[float]] = {}
    with tqdm(
        total=sum(len(p) for p in pairs.values()),
        disable=not progress,
        file=sys.stderr,
        desc="scoring",
        unit="pair",
    ) as bar:
        for query, query_pairs in pairs.items():
            scores[query] = scorer.score_documents(
                data.queries[query], [data.corpus[doc] for doc, _ in query_pairs]
            )
            bar.update(len(query_pairs))
    mode = scorer.score_mode
    probe = Calibration(mode, 1.0, 0.0)

    def gathered(queries: list[str]) -> tuple[list[float], list[int]]:
        values = [score for query in queries for score in scores[query]]
        labels = [label for query in queries for _, label in pairs[query]]
        return values, labels

    fit_scores, fit_labels = gathered(fit)
    try:
        slope, intercept = fit_platt([probe.logit(s) for s in fit_scores], fit_labels)
    except ValueError as error:
        raise InputError(f"the fit queries: {error}") from None
    test_scores, test_labels = gathered(test)
    raw = [as_probability(s, mode) for s in test_scores]
    counts = {"fit_queries": len(fit), "fit_pairs": len(fit_scores), "held_out_queries": len(test)}
    counts["held_out_pairs"] = len(test_scores)
    calibration = Calibration(mode, slope, intercept, scorer.config.model)
    calibrated = calibration.apply(test_scores)
    before = {"ece": expected_calibration_error(raw, test_labels), "brier": brier_score(raw, test_labels)}
    after = {
        "ece": expected_calibration_error(calibrated, test_labels),
        "brier": brier_score(calibrated, test_labels),
    }
    fitted_on = {**counts, "before": before, "after": after}
    return CalibrationReport(
        Calibration(mode, slope, intercept, scorer.config.model, fitted_on), before, after, counts
    )


def default_calibration_path(model: str) -> Path:
    """Where ``genscore calibrate`` writes without ``--output``: the model folder's calibration file."""
    if not Path(model).is_dir():
        raise InputError(
            f"--model {model} is not a folder to write {CALIBRATION_FILE} into; pass --output PATH"
        )
    return Path(model) / CALIBRATION_FILE
