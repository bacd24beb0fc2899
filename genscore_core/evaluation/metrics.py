"""Ranking metrics as trec_eval defines them (so pytrec_eval and ir-measures give the same numbers).

For one query, with its documents ranked best first (ties: the larger document id first, as
trec_eval breaks them), ``rel(d)`` the judged relevance (0 when unjudged) and ``R`` the number of
judged documents with ``rel >= 1``:

* ``nDCG@k = DCG@k / IDCG@k``, ``DCG@k = sum over ranks i <= k of rel(d_i) / log2(i + 1)`` (graded
  gains, linear), ``IDCG@k`` the same sum over the judged relevances sorted best first;
* ``MRR@k``: ``1 / i`` for the first rank ``i <= k`` holding a relevant document, else 0;
* ``MAP@k``: the average precision of the top ``k``, ``sum over relevant d_i, i <= k of
  (relevant documents in the top i) / i``, divided by ``R`` (relevant documents never retrieved count
  as precision 0);
* ``Recall@k``: relevant documents in the top ``k``, divided by ``R``.

Each is averaged over the queries that have at least one relevant judgement; a query without any
would score 0 everywhere whatever the ranking, and is left out (trec_eval leaves out queries with no
judgements at all). A judged query that the ranking has no documents for counts as 0 (trec_eval's
``-c``): a first stage that finds nothing for it is not rewarded by its absence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from genscore_core.evaluation.data import ranked

MEASURES = ("ndcg@10", "mrr@10", "map@100")
"""The measures reported for every system, with ``recall@k`` for the depth ``k`` reranked."""


def ndcg(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    gains = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:k]
    ideal = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))
    if ideal == 0:
        return 0.0
    dcg = sum(
        max(judged.get(doc, 0), 0) / math.log2(rank + 1) for rank, doc in enumerate(ranking[:k], start=1)
    )
    return dcg / ideal


def reciprocal_rank(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for rank, doc in enumerate(ranking[:k], start=1):
        if judged.get(doc, 0) >= 1:
            return 1.0 / rank
    return 0.0


def average_precision(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = sum(1 for rel in judged.values() if rel >= 1)
    if relevant == 0:
        return 0.0
    found = 0
    total = 0.0
    for rank, doc in enumerate(ranking[:k], start=1):
        if judged.get(doc, 0) >= 1:
            found += 1
            total += found / rank
    return total / relevant


def recall(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = sum(1 for rel in judged.values() if rel >= 1)
    if relevant == 0:
        return 0.0
    return sum(1 for doc in ranking[:k] if judged.get(doc, 0) >= 1) / relevant


def evaluated_queries(qrels: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The queries the measures average over: those with at least one relevant judgement."""
    return [query for query, judged in qrels.items() if any(rel >= 1 for rel in judged.values())]


def per_query(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]], recall_depth: int
) -> dict[str, dict[str, float]]:
    """Every measure of every evaluated query: ``{query: {"ndcg@10": ..., "recall@k": ...}}``."""
    results: dict[str, dict[str, float]] = {}
    for query in evaluated_queries(qrels):
        ranking = [doc for doc, _ in ranked(run.get(query, {}))]
        judged = qrels[query]
        results[query] = {
            "ndcg@10": ndcg(ranking, judged, 10),
            "mrr@10": reciprocal_rank(ranking, judged, 10),
            "map@100": average_precision(ranking, judged, 100),
            f"recall@{recall_depth}": recall(ranking, judged, recall_depth),
        }
    return results


def evaluate(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]], recall_depth: int
) -> dict[str, float]:
    """The mean of each measure over the evaluated queries (:func:`per_query`)."""
    rows = per_query(run, qrels, recall_depth)
    if not rows:
        raise ValueError("no query has a relevant judgement (relevance >= 1): nothing to evaluate")
    names = next(iter(rows.values()))
    return {name: sum(row[name] for row in rows.values()) / len(rows) for name in names}
