"""A fitted calibration: a model's score mapped to a probability of relevance (``score_mode="calibrated"``).

Platt scaling: ``P(relevant) = sigmoid(slope * z + intercept)``, where ``z`` is the logit of the
score the model gives in the mode the calibration was fitted on: the score itself in ``"logit"``
mode, ``log(p / (1 - p))`` in the probability modes (``p`` held within [1e-7, 1 - 1e-7], where a
float32 probability has already lost its digits). It keeps the order of the scores, so a ranking is
unchanged; what changes is what a score means: 0.8 is "relevant four times in five", on any model
calibrated on the same kind of data, so that one threshold serves several models.

``genscore calibrate`` fits one (:mod:`genscore_core.evaluation.calibration`) and writes it as
JSON: by default to :data:`CALIBRATION_FILE` in the model's folder, where a scorer with
``score_mode="calibrated"`` and no ``calibration=`` looks for it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from genscore_core.errors import ConfigurationError
from genscore_core.templates import SCORE_MODES, ScoreMode

CALIBRATION_FILE = "genscore_calibration.json"
"""The calibration's file name in a model folder."""
FORMAT = "genscore-calibration/1"
_EDGE = 1e-7


@dataclass(frozen=True)
class Calibration:
    """Platt scaling of one model's scores in one score mode."""

    score_mode: ScoreMode
    """The mode of the scores it maps (the scorer scores in it, then maps)."""
    slope: float
    intercept: float
    model: str | None = None
    """The model it was fitted for (informative: a calibration is data, not checked against the model)."""
    fitted_on: dict[str, Any] | None = None
    """What ``genscore calibrate`` measured: pairs, queries, ECE and Brier before and after."""

    def logit(self, score: float) -> float:
        """The ``z`` of a score (see the module's docstring)."""
        if self.score_mode == "logit":
            return score
        p = min(max(score, _EDGE), 1.0 - _EDGE)
        return math.log(p) - math.log1p(-p)

    def probability(self, score: float) -> float:
        """The calibrated probability of relevance of one score."""
        x = self.slope * self.logit(score) + self.intercept
        # Either branch avoids overflowing exp() for a large |x|.
        return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))

    def apply(self, scores: Sequence[float]) -> list[float]:
        return [self.probability(score) for score in scores]

    def save(self, path: str | os.PathLike[str]) -> None:
        data = {"format": FORMAT, **asdict(self)}
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Read a calibration file; :class:`ConfigurationError` naming the file and what is wrong."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigurationError(
                f"calibration {path}: cannot read it ({error.strerror}); fit one with genscore calibrate",
                setting="calibration",
            ) from None
        except ValueError as error:
            raise ConfigurationError(
                f"calibration {path}: not JSON ({error})", setting="calibration"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigurationError(
                f'calibration {path}: not a genscore calibration (expected "format": {FORMAT!r})',
                setting="calibration",
            )
        mode, slope, intercept = data.get("score_mode"), data.get("slope"), data.get("intercept")
        if mode not in SCORE_MODES:
            raise ConfigurationError(
                f"calibration {path}: score_mode {mode!r} is none of {list(SCORE_MODES)}",
                setting="calibration",
            )
        numbers = []
        for name, value in (("slope", slope), ("intercept", intercept)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigurationError(
                    f"calibration {path}: {name} {value!r} is not a finite number", setting="calibration"
                )
            numbers.append(float(value))
        return cls(mode, numbers[0], numbers[1], data.get("model"), data.get("fitted_on"))


def calibration_path(model: str, setting: str | None) -> Path:
    """Where a scorer of ``model`` reads its calibration: ``setting``, else the model folder's file."""
    if setting is not None:
        return Path(setting)
    if Path(model).is_dir():
        return Path(model) / CALIBRATION_FILE
    raise ConfigurationError(
        f"score_mode 'calibrated' needs a calibration: {model!r} is not a folder to find "
        f"{CALIBRATION_FILE} in; pass calibration=PATH (the file genscore calibrate wrote)",
        setting="calibration",
    )
