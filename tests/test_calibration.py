"""Calibration: the Platt fit against scipy's optimiser on the same objective, ECE and Brier against
numpy, and ``score_mode="calibrated"`` against the official recipe's probability mapped by hand, here
and through a server."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize

from genscore_core import ConfigurationError, GenerativeScorer
from genscore_core.calibration import CALIBRATION_FILE, Calibration, calibration_path
from genscore_core.cli import main
from genscore_core.evaluation.calibration import brier_score, expected_calibration_error, fit_platt
from tests.helpers.recipe_ranking import RIVER_QUERY, RIVER_TEXTS, RecipeReference


def _scipy_platt(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Platt's objective (smoothed targets) minimised by BFGS: an independent optimiser."""
    positives, negatives = y.sum(), len(y) - y.sum()
    t = np.where(y == 1, (positives + 1) / (positives + 2), 1 / (negatives + 2))

    def loss(w: np.ndarray) -> float:
        x = w[0] * z + w[1]
        return float(np.sum(np.logaddexp(0, x) - t * x))

    def grad(w: np.ndarray) -> np.ndarray:
        d = 1 / (1 + np.exp(-(w[0] * z + w[1]))) - t
        return np.array([np.sum(d * z), np.sum(d)])

    return minimize(loss, np.array([1.0, 0.0]), jac=grad, method="BFGS", options={"gtol": 1e-10}).x


@pytest.mark.parametrize("separable", [False, True])
def test_platt_fit_equals_scipy(separable: bool) -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 400)
    z = rng.normal(0, 1, 400) + (4.0 if separable else 1.2) * (2 * y - 1)
    if separable:
        z = np.where(y == 1, np.abs(z) + 0.1, -np.abs(z) - 0.1)
    slope, intercept = fit_platt(z.tolist(), y.tolist())
    assert [slope, intercept] == pytest.approx(_scipy_platt(z, y).tolist(), abs=1e-5)


def test_platt_fit_recovers_a_known_mapping() -> None:
    # Labels drawn from sigmoid(2 z - 1): the fit finds (2, -1) within sampling error.
    rng = random.Random(0)
    z = [rng.uniform(-4, 4) for _ in range(20000)]
    y = [1 if rng.random() < 1 / (1 + math.exp(-(2 * v - 1))) else 0 for v in z]
    slope, intercept = fit_platt(z, y)
    assert slope == pytest.approx(2.0, abs=0.1) and intercept == pytest.approx(-1.0, abs=0.1)


def test_fit_needs_both_labels() -> None:
    with pytest.raises(ValueError, match="got 3 relevant and 0 not"):
        fit_platt([0.1, 0.2, 0.3], [1, 1, 1])


def test_ece_and_brier_equal_numpy() -> None:
    rng = np.random.default_rng(1)
    p = np.concatenate([rng.uniform(0, 1, 500), [0.0, 1.0, 0.1, 0.9]])
    y = (rng.uniform(0, 1, len(p)) < p**2).astype(int)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(abs(p[bins == b].sum() - y[bins == b].sum()) for b in range(10)) / len(p)
    assert expected_calibration_error(p.tolist(), y.tolist()) == pytest.approx(ece)
    assert brier_score(p.tolist(), y.tolist()) == pytest.approx(float(np.mean((p - y) ** 2)))


def _mapped(probabilities: list[float], slope: float, intercept: float) -> list[float]:
    return [1 / (1 + math.exp(-(slope * math.log(p / (1 - p)) + intercept))) for p in probabilities]


def test_calibrated_score_mode_maps_the_recipe_probability(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    Calibration("label-softmax", 3.0, -0.5, model="tiny").save(path)
    scorer = GenerativeScorer(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_length=512,
        score_mode="calibrated",
        calibration=str(path),
    )
    expected = _mapped(RecipeReference(tiny_model_dir).scores(RIVER_QUERY, RIVER_TEXTS), 3.0, -0.5)
    assert scorer.score_documents(RIVER_QUERY, RIVER_TEXTS) == pytest.approx(expected, abs=1e-5)
    ranked = scorer.rerank(RIVER_QUERY, RIVER_TEXTS)
    assert [r.score for r in ranked] == pytest.approx(sorted(expected, reverse=True), abs=1e-5)
    assert scorer.settings()["score_mode"] == "calibrated"
    # Through a server scoring raw probabilities: the client calibrates what comes back.
    from genscore_core.server import create_app
    from tests.helpers.server import TEST_LIMITS, serve_in_thread

    plain = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)
    with serve_in_thread(create_app(plain, TEST_LIMITS)) as live:
        remote = GenerativeScorer(
            str(tiny_model_dir),
            server_url=live.url,
            max_length=512,
            score_mode="calibrated",
            calibration=str(path),
        )
        assert remote.score_pairs([(RIVER_QUERY, t) for t in RIVER_TEXTS]) == pytest.approx(
            expected, abs=1e-5
        )
        # ... and a server that calibrates answers calibrated scores on /v1/rerank.
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        import httpx

        body = httpx.post(
            f"{live.url}/v1/rerank", json={"query": RIVER_QUERY, "documents": RIVER_TEXTS}
        ).json()
        got = {item["index"]: item["relevance_score"] for item in body["results"]}
        assert [got[i] for i in range(len(RIVER_TEXTS))] == pytest.approx(expected, abs=1e-5)


def test_an_adapter_takes_the_calibrated_mode(tiny_model_dir: Path, tmp_path: Path) -> None:
    from langchain_core.documents import Document

    from genscore_integrations.langchain import GenerativeReranker

    path = tmp_path / "calibration.json"
    Calibration("label-softmax", 0.5, 1.0).save(path)
    reranker = GenerativeReranker(
        model=str(tiny_model_dir), device="cpu", dtype="float32", max_length=512, top_n=None,
        score_mode="calibrated", calibration=str(path), score_threshold=0.0,
    )  # fmt: skip
    kept = reranker.compress_documents([Document(page_content=t) for t in RIVER_TEXTS], RIVER_QUERY)
    expected = _mapped(RecipeReference(tiny_model_dir).scores(RIVER_QUERY, RIVER_TEXTS), 0.5, 1.0)
    got = {doc.page_content: doc.metadata["relevance_score"] for doc in kept}
    assert [got[t] for t in RIVER_TEXTS] == pytest.approx(expected, abs=1e-5)


def test_calibration_files_are_checked(tmp_path: Path) -> None:
    assert calibration_path(str(tmp_path), None) == tmp_path / CALIBRATION_FILE
    with pytest.raises(ConfigurationError, match=r"not a folder to find genscore_calibration\.json"):
        calibration_path("org/not-a-folder", None)
    with pytest.raises(ConfigurationError, match="cannot read it"):
        Calibration.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"format": "genscore-calibration/1", "score_mode": "logit", "slope": "2", "intercept": 0})
    )
    with pytest.raises(ConfigurationError, match="slope '2' is not a finite number"):
        Calibration.load(bad)
    bad.write_text(json.dumps({"score_mode": "logit"}))
    with pytest.raises(ConfigurationError, match="not a genscore calibration"):
        Calibration.load(bad)


def test_logit_mode_calibrates_the_raw_logit() -> None:
    calibration = Calibration("logit", 0.5, 1.0)
    assert calibration.probability(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert calibration.probability(-1000.0) == pytest.approx(0.0) and calibration.probability(1000.0) == 1.0


def test_calibrate_command_writes_what_the_scorer_reads(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from genscore_core.testing.judged_set import FIRST_STAGE_RUN, make_judged_set

    data = make_judged_set(tmp_path / "set", queries=6, candidates=5, seed=1)
    out = tmp_path / "cal.json"
    code = main(
        ["calibrate", str(data), "--run", str(data / FIRST_STAGE_RUN), "--model", str(tiny_model_dir), "-o", str(out),
         "--format", "json", "--no-progress", "--device", "cpu", "--dtype", "float32", "--max-length", "512"]
    )  # fmt: skip
    printed, err = capsys.readouterr()
    assert code == 0, err
    before, after = (json.loads(line) for line in printed.splitlines())
    assert before["scores"] == "raw (label-softmax)" and after["scores"] == "calibrated"
    saved = Calibration.load(out)
    assert saved.fitted_on is not None and saved.fitted_on["after"] == {
        "ece": after["ece"],
        "brier": after["brier"],
    }
    assert saved.fitted_on["fit_pairs"] + saved.fitted_on["held_out_pairs"] == 6 * 5
    code = main(["calibrate", str(data), "--model", "org/hub-model", "--no-progress"])
    assert code == 2 and "pass --output PATH" in capsys.readouterr().err
