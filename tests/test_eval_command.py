"""``genscore eval``: the first stage and the reranked runs measured, locally and through a server,
and an interrupted evaluation resumed. Scores are checked against the official Qwen3-Reranker recipe
and the metrics against ir-measures (pytrec_eval), never against genscore's own numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ir_measures
import pytest
from ir_measures import AP, RR, R, nDCG

from genscore_core import GenerativeScorer
from genscore_core.cli import main
from tests.helpers.recipe_ranking import RecipeReference

QUERIES = {
    "q1": "Which river flows through Paris?",
    "q2": "What is the capital of Germany?",
    "q3": "How long is the Loire?",
}
CORPUS = {
    "d1": "The Seine flows through Paris before reaching the English Channel.",
    "d2": "Berlin is the capital of Germany and lies on the Spree.",
    "d3": "The Loire is the longest river in France, about 1,000 km.",
    "d4": "Paris hosted the Summer Olympics in 1900, 1924 and 2024.",
    "d5": "The Thames flows through London.",
    "d6": "Bonn was the capital of West Germany.",
}
QRELS = {"q1": {"d1": 2, "d5": 0}, "q2": {"d2": 2, "d6": 1}, "q3": {"d3": 1}}
RUN = {  # the first stage: a tie in q1, a relevant document below the depth of 4 in q2
    "q1": {"d4": 3.0, "d5": 3.0, "d1": 2.0, "d3": 1.0, "d2": 0.5},
    "q2": {"d1": 9.0, "d4": 8.0, "d5": 7.0, "d2": 6.0, "d6": 5.0},
    "q3": {"d5": 2.0, "d1": 1.5, "d3": 1.0, "d4": 0.9},
}
DEPTH = 4
SETTINGS = ["--device", "cpu", "--dtype", "float32", "--max-length", "512"]


def _judged_set(folder: Path) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in CORPUS.items())
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items())
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{r}\n" for q, j in QRELS.items() for d, r in j.items())
    )
    (folder / "run.trec").write_text(
        "".join(
            f"{q} Q0 {d} {i} {s} bm25\n"
            for q, docs in RUN.items()
            for i, (d, s) in enumerate(docs.items(), 1)
        )
    )
    return folder


def _reference_metrics(run: dict[str, dict[str, float]]) -> dict[str, float]:
    measures = ir_measures.calc_aggregate([nDCG @ 10, RR @ 10, AP @ 100, R @ DEPTH], QRELS, run)
    return {
        "ndcg@10": measures[nDCG @ 10],
        "mrr@10": measures[RR @ 10],
        "map@100": measures[AP @ 100],
        f"recall@{DEPTH}": measures[R @ DEPTH],
    }


def _top(docs: dict[str, float], k: int) -> list[str]:
    # trec_eval's order: score, then document id, larger first.
    return [d for d, _ in sorted(docs.items(), key=lambda item: (item[1], item[0]), reverse=True)[:k]]


def _eval(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["eval", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()] if code == 0 else [], err


def _recipe_run(model_dir: Path) -> dict[str, dict[str, float]]:
    recipe = RecipeReference(model_dir)
    run = {}
    for query, docs in RUN.items():
        candidates = _top(docs, DEPTH)
        run[query] = dict(zip(candidates, recipe.scores(QUERIES[query], [CORPUS[d] for d in candidates])))
    return run


def _check_rows(rows: list[dict[str, Any]], model_dir: Path, runs: Path) -> None:
    first, model = rows
    assert first["system"] == "first-stage"
    truncated = {q: {d: RUN[q][d] for d in _top(docs, DEPTH)} for q, docs in RUN.items()}
    assert {k: first[k] for k in _reference_metrics(truncated)} == pytest.approx(
        _reference_metrics(truncated)
    )
    # The model's scores are the recipe's; the measures of the run it wrote are ir-measures'.
    recipe = _recipe_run(model_dir)
    written = {
        q: {d: float(s) for _, d, s in group}
        for q, group in _trec_groups(runs / f"{model['system']}.run").items()
    }
    for query, scores in recipe.items():
        assert written[query] == pytest.approx(scores, abs=1e-5)
    assert {k: model[k] for k in _reference_metrics(written)} == pytest.approx(_reference_metrics(written))
    assert model["pairs"] == DEPTH * len(RUN) - 0 and model["pairs/s"] > 0
    assert 0 < model["latency_p50_ms"] <= model["latency_p95_ms"]


def _trec_groups(path: Path) -> dict[str, list[tuple[int, str, str]]]:
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for line in path.read_text().splitlines():
        query, _, doc, rank, score, _ = line.split()
        groups.setdefault(query, []).append((int(rank), doc, score))
    return groups


def test_eval_measures_a_run_and_a_local_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _judged_set(tmp_path / "set")
    code, rows, err = _eval(
        capsys, str(data), "--run", str(data / "run.trec"), "--model", str(tiny_model_dir), "--top-k", str(DEPTH),
        "--format", "json", "--no-progress", "--runs-dir", str(tmp_path / "runs"), *SETTINGS,
    )  # fmt: skip
    assert code == 0, err
    _check_rows(rows, tiny_model_dir, tmp_path / "runs")


def test_eval_through_a_server(
    scorer: GenerativeScorer, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from genscore_core.server import create_app
    from tests.helpers.server import TEST_LIMITS, serve_in_thread

    data = _judged_set(tmp_path / "set")
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        code, rows, err = _eval(
            capsys, str(data), "--run", str(data / "run.trec"), "--model", str(tiny_model_dir), "--top-k", str(DEPTH),
            "--format", "json", "--no-progress", "--runs-dir", str(tmp_path / "runs"), "--server-url", live.url,
            "--max-length", "512",
        )  # fmt: skip
    assert code == 0, err
    _check_rows(rows, tiny_model_dir, tmp_path / "runs")


def test_eval_resumes_and_refuses_other_settings(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _judged_set(tmp_path / "set")
    results = tmp_path / "results"
    args = [
        str(data),
        "--model",
        str(tiny_model_dir),
        "--top-k",
        "3",
        "--format",
        "json",
        "--results-dir",
        str(results),
    ]
    code, first, err = _eval(capsys, *args, *SETTINGS)  # BM25 as first stage, progress bar on
    assert code == 0, err
    assert "tiny" in err and "pair" in err  # the bar names the system and counts pairs
    saved = results / f"{first[1]['system']}.jsonl"
    lines = saved.read_text().splitlines()
    assert len(lines) == 1 + len(QRELS)  # the settings, then one line per query
    # As if killed while writing the third query: its line half written.
    saved.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    code, again, err = _eval(capsys, *args, "--no-progress", *SETTINGS)
    assert code == 0, err
    assert again == [first[0], {**first[1], "pairs/s": again[1]["pairs/s"], "latency_p50_ms": again[1]["latency_p50_ms"],
                                "latency_p95_ms": again[1]["latency_p95_ms"]}]  # fmt: skip
    kept = saved.read_text().splitlines()
    assert kept[:3] == lines[:3]  # the queries done were not scored again (same timings)
    assert json.loads(kept[3])["query"] == json.loads(lines[3])["query"] and len(kept) == len(lines)
    code, _, err = _eval(
        capsys, *args, "--no-progress", "--device", "cpu", "--dtype", "float32", "--max-length", "256"
    )
    assert code == 2 and "other settings (max_length)" in err and "--restart" in err
