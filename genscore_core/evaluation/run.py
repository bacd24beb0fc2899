"""A first stage, and the same candidates reranked by a scorer: measured, timed and resumable.

Each query's top ``k`` candidates of the first stage (the run given, else :mod:`BM25
<genscore_core.evaluation.bm25>`) are scored in one call of the scorer, as a RAG pipeline scores
them, so the time of that call is the query's latency; pairs/s is every pair over every call's
time (the model's loading and one warm-up call are not counted).

With ``results_dir``, each query's scores are appended to ``<results_dir>/<system>.jsonl`` as it
is done (the first line holds the scorer's settings): a rerun of an interrupted evaluation scores
only the queries missing there, and refuses a file written with other settings.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genscore_core import strict_json
from genscore_core.errors import InputError
from genscore_core.evaluation.bm25 import BM25
from genscore_core.evaluation.data import JudgedData, Run, ranked
from genscore_core.evaluation.metrics import evaluate, evaluated_queries

if TYPE_CHECKING:
    from genscore_core.scorer import GenerativeScorer


@dataclass
class SystemReport:
    """What one system (the first stage, or a model reranking it) achieved."""

    system: str
    metrics: dict[str, float]
    pairs: int = 0
    """(query, document) pairs scored; 0 for the first stage, which genscore does not time."""
    seconds: float = 0.0
    """Time of the scoring calls, summed."""
    latencies: list[float] = field(default_factory=list, repr=False)
    """Each query's scoring call, in seconds."""

    def as_dict(self) -> dict[str, Any]:
        """One object of ``genscore eval --format json``."""
        row: dict[str, Any] = {"system": self.system, **self.metrics}
        if self.pairs:
            row["pairs"] = self.pairs
            row["pairs/s"] = self.pairs / self.seconds if self.seconds > 0 else None
            row["latency_p50_ms"] = 1000 * _quantile(self.latencies, 0.5)
            row["latency_p95_ms"] = 1000 * _quantile(self.latencies, 0.95)
        return row


def _quantile(values: Sequence[float], share: float) -> float:
    """The nearest-rank quantile (the value that ``share`` of the values are at most)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def first_stage(data: JudgedData, depth: int) -> Run:
    """Each evaluated query's ``depth`` best candidates: from the run given, else from BM25."""
    queries = evaluated_queries(data.qrels)
    if data.run is not None:
        return {q: dict(ranked(data.run[q])[:depth]) for q in queries if q in data.run}
    index = BM25(data.corpus)
    return {q: index.search(data.queries[q], depth) for q in queries}


def system_name(model: str, taken: Sequence[str] = ()) -> str:
    """A file-safe name for a model's row and results file, unique among ``taken``."""
    base = re.sub(r"[^\w.-]+", "_", model.rstrip("/").split("/")[-1] or model).strip("_") or "model"
    name, number = base, 2
    while name in taken or name == "first-stage":
        name, number = f"{base}-{number}", number + 1
    return name


class _Results:
    """The per-query results file of one system: what is there, and what gets added."""

    def __init__(self, path: Path, scorer: GenerativeScorer, restart: bool) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        settings = scorer.settings()
        if path.exists() and not restart:
            self._read(scorer)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"settings": settings}) + "\n", encoding="utf-8")

    def _read(self, scorer: GenerativeScorer) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = strict_json.loads(lines[0]) if lines else None
            saved = header["settings"]  # type: ignore[index]
        except (ValueError, TypeError, KeyError):
            raise InputError(
                f"{self.path}: not a genscore eval results file; remove it or pass --restart"
            ) from None
        differing = scorer.differing_settings(saved)
        if differing:
            raise InputError(
                f"{self.path} was written with other settings ({', '.join(differing)}); pass --restart "
                "to score again"
            )
        kept = [lines[0]]
        for line in lines[1:]:
            try:
                record = strict_json.loads(line)
            except ValueError:
                break  # the line being written when the run was killed: scored again
            self.done[record["query"]] = record
            kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def add(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
        self.done[record["query"]] = record


def rerank_run(
    scorer: GenerativeScorer,
    data: JudgedData,
    candidates: Mapping[str, Mapping[str, float]],
    *,
    system: str,
    recall_depth: int,
    results_dir: Path | None = None,
    restart: bool = False,
    progress: bool = False,
) -> tuple[SystemReport, Run]:
    """The candidates of each query reranked by ``scorer``, measured against ``data.qrels``, and the run."""
    from tqdm import tqdm

    results = _Results(results_dir / f"{system}.jsonl", scorer, restart) if results_dir is not None else None
    run: Run = {}
    report = SystemReport(system, {})
    todo: list[tuple[str, list[str]]] = []
    for query, first in candidates.items():
        docs = [doc for doc, _ in ranked(first)]
        kept = results.done.get(query) if results is not None else None
        if kept is not None and kept.get("docs") == docs:
            _count(report, run, query, docs, kept["scores"], kept["seconds"])
        elif docs:
            todo.append((query, docs))
    if todo:
        # One untimed call first: the first call of a model pays for allocations and compilation.
        scorer.score_documents(data.queries[todo[0][0]], [data.corpus[todo[0][1][0]]])
    total = sum(len(docs) for _, docs in todo)
    with tqdm(
        total=total, disable=not progress, file=sys.stderr, desc=system, unit="pair", mininterval=0.2
    ) as bar:
        for query, docs in todo:
            start = time.perf_counter()
            scores = scorer.score_documents(data.queries[query], [data.corpus[doc] for doc in docs])
            seconds = time.perf_counter() - start
            if results is not None:
                results.add({"query": query, "docs": docs, "scores": scores, "seconds": seconds})
            _count(report, run, query, docs, scores, seconds)
            bar.update(len(docs))
    report.metrics = evaluate(run, data.qrels, recall_depth)
    return report, run


def _count(
    report: SystemReport, run: Run, query: str, docs: list[str], scores: Sequence[float], seconds: float
) -> None:
    run[query] = dict(zip(docs, scores))
    report.pairs += len(docs)
    report.seconds += seconds
    report.latencies.append(seconds)
