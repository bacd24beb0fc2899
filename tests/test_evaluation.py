"""The evaluation's parts checked against independent references: the metrics against ir-measures
(pytrec_eval, trec_eval's own code), BM25 against its formula written out here, the readers against
the files they refuse."""

from __future__ import annotations

import math
import random
from pathlib import Path

import ir_measures
import pytest
import pytrec_eval
from ir_measures import AP, RR, R, nDCG

from genscore_core.errors import InputError
from genscore_core.evaluation.bm25 import BM25
from genscore_core.evaluation.data import ranked, read_judged_data, read_qrels, read_trec_run, write_trec_run
from genscore_core.evaluation.metrics import evaluate, evaluated_queries, per_query, reciprocal_rank


def _random_case(seed: int) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """Graded qrels and a run with tied scores, unjudged documents, relevant documents not retrieved
    and a retrieved query with no judgements."""
    rng = random.Random(seed)
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(12):
        docs = [f"d{rng.randint(0, 300)}" for _ in range(rng.randint(5, 150))]
        query = f"q{q}"
        judged = {doc: rng.choice([0, 0, 1, 2, 3]) for doc in rng.sample(docs, min(len(docs), 8))}
        judged[f"missing{q}"] = 1  # never retrieved: counts in MAP's and Recall's denominators
        qrels[query] = judged
        # Scores from a small set: many ties, which trec_eval breaks by document id.
        run[query] = {doc: float(rng.randint(0, 6)) for doc in docs}
    run["unjudged"] = {"d1": 1.0}
    return qrels, run


@pytest.mark.parametrize("seed", range(4))
def test_metrics_equal_ir_measures(seed: int, tmp_path: Path) -> None:
    qrels, run = _random_case(seed)
    depth = 20
    ours = evaluate(run, qrels, recall_depth=depth)
    # nDCG, AP and R come from pytrec_eval (trec_eval's code), ties broken as trec_eval does.
    reference = ir_measures.calc_aggregate([nDCG @ 10, AP @ 100, R @ depth], qrels, run)
    assert {key: ours[key] for key in ("ndcg@10", "map@100", f"recall@{depth}")} == pytest.approx(
        {
            "ndcg@10": reference[nDCG @ 10],
            "map@100": reference[AP @ 100],
            f"recall@{depth}": reference[R @ depth],
        },
        abs=1e-9,
    )
    # RR@10 comes from MS MARCO's script, which breaks ties its own way: compared on a run without
    # ties; the tie order of the reciprocal rank is checked against trec_eval's recip_rank below.
    untied = {
        q: {doc: score + rank * 1e-6 for rank, (doc, score) in enumerate(docs.items())}
        for q, docs in run.items()
    }
    mrr = ir_measures.calc_aggregate([RR @ 10], qrels, untied)[RR @ 10]
    assert evaluate(untied, qrels, recall_depth=depth)["mrr@10"] == pytest.approx(mrr, abs=1e-9)
    # The same numbers from the run as written to a TREC file and read back.
    write_trec_run(run, tmp_path / "run.txt")
    assert evaluate(read_trec_run(tmp_path / "run.txt"), qrels, recall_depth=depth) == pytest.approx(ours)


def test_reciprocal_rank_breaks_ties_as_trec_eval() -> None:
    qrels, run = _random_case(3)
    trec_eval = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)
    for query in evaluated_queries(qrels):
        ranking = [doc for doc, _ in ranked(run[query])]
        assert reciprocal_rank(ranking, qrels[query], 10**6) == pytest.approx(trec_eval[query]["recip_rank"])


def test_per_query_values_equal_ir_measures() -> None:
    qrels, run = _random_case(7)
    ours = per_query(run, qrels, recall_depth=10)
    for metric in ir_measures.iter_calc([nDCG @ 10, AP @ 100], qrels, run):
        key = "ndcg@10" if metric.measure == nDCG @ 10 else "map@100"
        assert ours[metric.query_id][key] == pytest.approx(metric.value, abs=1e-9)


def test_queries_without_relevant_judgements_and_unretrieved_queries() -> None:
    qrels = {"a": {"x": 1}, "b": {"y": 0}, "c": {"z": 2}}
    run = {"a": {"x": 1.0, "w": 2.0}, "b": {"y": 1.0}}
    # "b" has nothing relevant and is left out; "c" is judged but not retrieved and counts as 0.
    scores = evaluate(run, qrels, recall_depth=10)
    assert scores["mrr@10"] == pytest.approx((1 / 2 + 0) / 2)
    assert scores["ndcg@10"] == pytest.approx((1 / math.log2(3)) / 2)
    with pytest.raises(ValueError, match="no query has a relevant judgement"):
        evaluate(run, {"b": {"y": 0}}, recall_depth=10)


def test_bm25_is_its_formula() -> None:
    corpus = {"1": "the cat sat on the mat", "2": "a dog and a cat", "3": "dogs run", "4": "Cat, cat! CAT"}
    index = BM25(corpus)
    words = {doc: text.lower().replace(",", " ").replace("!", " ").split() for doc, text in corpus.items()}
    average = sum(len(w) for w in words.values()) / len(words)

    def expected(query: list[str], doc: str) -> float:
        total = 0.0
        for term in query:
            df = sum(1 for w in words.values() if term in w)
            idf = math.log(1 + (len(words) - df + 0.5) / (df + 0.5))
            tf = words[doc].count(term)
            total += idf * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * len(words[doc]) / average))
        return total

    scores = index.scores("cat dog")
    assert set(scores) == {"1", "2", "4"}  # "dogs" is not "dog": no stemming
    for doc, value in scores.items():
        assert value == pytest.approx(expected(["cat", "dog"], doc))
    assert list(index.search("cat dog", 2)) == ["2", "4"]


def _beir(folder: Path, corpus: str, queries: str, qrels: str) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (folder / "queries.jsonl").write_text(queries, encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return folder


def test_beir_folder_is_read(tmp_path: Path) -> None:
    folder = _beir(
        tmp_path / "set",
        '{"_id": "d1", "title": "Paris", "text": "is in France."}\n{"_id": "d2", "title": "", "text": "Rome"}\n',
        '{"_id": "q1", "text": "Where is Paris?"}\n',
        "query-id\tcorpus-id\tscore\nq1\td1\t2\n",
    )
    data = read_judged_data(folder)
    assert data.corpus == {"d1": "Paris is in France.", "d2": "Rome"}
    assert data.queries == {"q1": "Where is Paris?"}
    assert data.qrels == {"q1": {"d1": 2}}
    (tmp_path / "qrels.txt").write_text("q1 0 d2 1\n")
    assert read_qrels(tmp_path / "qrels.txt") == {"q1": {"d2": 1}}


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n', "corpus.jsonl, line 2: document 'd1' given twice"),
        ("corpus.jsonl", '{"_id": "d1", "text": 3}\n', "corpus.jsonl, line 1: expected a string 'text' field"),
        ("queries.jsonl", '{"text": "a"}\n', "queries.jsonl, line 1: expected an '_id' string"),
        ("queries.jsonl", "{bad\n", "queries.jsonl, line 1: invalid JSON"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n", "test.tsv, line 2: the relevance 'high'"),
        ("qrels/test.tsv", "q9\td1\t1\n", "query 'q9' is judged but has no text"),
    ],
)  # fmt: skip
def test_bad_files_are_named_with_their_line(tmp_path: Path, file: str, content: str, message: str) -> None:
    folder = _beir(
        tmp_path / "set", '{"_id": "d1", "text": "a"}\n', '{"_id": "q1", "text": "a"}\n', "q1\td1\t1\n"
    )
    (folder / file).write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        read_judged_data(folder)


def test_a_run_naming_an_unknown_document_is_refused(tmp_path: Path) -> None:
    folder = _beir(
        tmp_path / "set", '{"_id": "d1", "text": "a"}\n', '{"_id": "q1", "text": "a"}\n', "q1\td1\t1\n"
    )
    (tmp_path / "run").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d7 2 1.0 x\n")
    with pytest.raises(InputError, match=r"run: document 'd7' \(query 'q1'\) is not in"):
        read_judged_data(folder, run=tmp_path / "run")
    (tmp_path / "run").write_text("q1 Q0 d1 1 nan x\n")
    with pytest.raises(InputError, match="run, line 1: the score 'nan' is not finite"):
        read_judged_data(folder, run=tmp_path / "run")
