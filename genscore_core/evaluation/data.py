"""Judged data as users keep it: a BEIR folder, TREC runs and qrels.

A BEIR folder holds ``corpus.jsonl`` (``{"_id", "title", "text"}``), ``queries.jsonl``
(``{"_id", "text"}``) and ``qrels/<split>.tsv`` (a ``query-id corpus-id score`` header, then one
judgement a line). A TREC run has lines ``qid Q0 docid rank score tag``; TREC qrels
``qid iteration docid relevance``. Every reader names the file and line of what it refuses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from genscore_core import strict_json
from genscore_core.errors import InputError

Qrels = dict[str, dict[str, int]]
"""Relevance of each judged document of each query: ``qrels[query_id][doc_id]``."""
Run = dict[str, dict[str, float]]
"""A ranking's score of each candidate of each query: ``run[query_id][doc_id]``."""


@dataclass
class JudgedData:
    """Texts and judgements of one evaluation set, and, when given, the first stage's run."""

    queries: dict[str, str]
    corpus: dict[str, str]
    """Each document's text: BEIR's title and text joined by a space (the title alone when it is all)."""
    qrels: Qrels
    run: Run | None = None
    sources: dict[str, str] = field(default_factory=dict)
    """Which file each part came from, for messages."""


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as stream:
            for number, raw in enumerate(stream, start=1):
                line = raw.rstrip("\r\n")
                if number == 1:
                    line = line.removeprefix("\ufeff")
                if line.strip():
                    yield number, line
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None


def _records(path: Path) -> Iterator[tuple[str, dict[str, object]]]:
    """The JSON objects of a JSON lines file, each with where it is."""
    for number, line in _lines(path):
        where = f"{path}, line {number}"
        try:
            record = strict_json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{where}: invalid JSON ({error.msg})") from None
        except strict_json.StrictJSONError as error:
            raise InputError(f"{where}: {error}") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}: expected a JSON object")
        yield where, record


def _identifier(record: Mapping[str, object], where: str) -> str:
    value = record.get("_id")
    # BEIR's own files hold ids as strings; a number is read as its text, as pytrec_eval does.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: expected an '_id' string")
    return str(value)


def _text(record: Mapping[str, object], key: str, where: str) -> str:
    value = record.get(key, "")
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a string {key!r} field")
    return value


def _texts_by_id(
    path: Path, kind: str, plural: str, text_of: Callable[[Mapping[str, object], str, str], str]
) -> dict[str, str]:
    """The text of each record of a BEIR JSON lines file by its ``_id``, read by ``text_of(record,
    identifier, where)``; an id given twice or a file without records is refused."""
    texts: dict[str, str] = {}
    for where, record in _records(path):
        identifier = _identifier(record, where)
        if identifier in texts:
            raise InputError(f"{where}: {kind} {identifier!r} given twice")
        texts[identifier] = text_of(record, identifier, where)
    if not texts:
        raise InputError(f"{path}: no {plural}")
    return texts


def _document_text(record: Mapping[str, object], identifier: str, where: str) -> str:
    title, text = _text(record, "title", where), _text(record, "text", where)
    return f"{title} {text}" if title and text else title or text


def _query_text(record: Mapping[str, object], identifier: str, where: str) -> str:
    text = _text(record, "text", where)
    if not text.strip():
        raise InputError(f"{where}: query {identifier!r} has no text")
    return text


def read_corpus(path: Path) -> dict[str, str]:
    """``corpus.jsonl``: each document's title and text, joined by a space."""
    return _texts_by_id(path, "document", "documents", _document_text)


def read_queries(path: Path) -> dict[str, str]:
    """``queries.jsonl``: each query's text."""
    return _texts_by_id(path, "query", "queries", _query_text)


def _relevance(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{where}: the relevance {text!r} is not an integer") from None


def read_qrels(path: Path) -> Qrels:
    """Judgements from a BEIR ``.tsv`` (``query-id corpus-id score``, header optional) or TREC
    qrels (``qid iteration docid relevance``), told apart by the number of columns."""
    qrels: Qrels = {}
    for number, line in _lines(path):
        where = f"{path}, line {number}"
        columns = line.split()
        if number == 1 and columns[:2] == ["query-id", "corpus-id"]:
            continue
        if len(columns) == 3:
            query, doc, relevance = columns
        elif len(columns) == 4:
            query, _, doc, relevance = columns
        else:
            raise InputError(
                f"{where}: expected 'query-id corpus-id score' (BEIR) or 'qid iteration docid "
                f"relevance' (TREC), got {len(columns)} columns"
            )
        judged = qrels.setdefault(query, {})
        if doc in judged:
            raise InputError(f"{where}: document {doc!r} of query {query!r} judged twice")
        judged[doc] = _relevance(relevance, where)
    if not qrels:
        raise InputError(f"{path}: no judgements")
    return qrels


def read_trec_run(path: Path) -> Run:
    """A TREC run (``qid Q0 docid rank score tag``): the score of each retrieved document. The
    order is the scores' (trec_eval ignores the rank column too)."""
    run: Run = {}
    for number, line in _lines(path):
        where = f"{path}, line {number}"
        columns = line.split()
        if len(columns) != 6:
            raise InputError(f"{where}: expected 'qid Q0 docid rank score tag', got {len(columns)} columns")
        query, _, doc, _, score_text, _ = columns
        try:
            score = float(score_text)
        except ValueError:
            raise InputError(f"{where}: the score {score_text!r} is not a number") from None
        if not math.isfinite(score):
            raise InputError(f"{where}: the score {score_text!r} is not finite")
        retrieved = run.setdefault(query, {})
        if doc in retrieved:
            raise InputError(f"{where}: document {doc!r} retrieved twice for query {query!r}")
        retrieved[doc] = score
    if not run:
        raise InputError(f"{path}: no retrieved documents")
    return run


def read_judged_data(
    folder: Path, *, split: str = "test", qrels: Path | None = None, run: Path | None = None
) -> JudgedData:
    """The BEIR folder ``folder`` (its ``qrels/<split>.tsv`` unless ``qrels`` names another file),
    with the TREC run ``run`` as first stage when given. Every judged query must have a text, and
    every document of the run a text in the corpus."""
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder; give a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    qrels_path = qrels if qrels is not None else folder / "qrels" / f"{split}.tsv"
    sources = {"corpus": str(folder / "corpus.jsonl"), "queries": str(folder / "queries.jsonl")}
    sources["qrels"] = str(qrels_path)
    data = JudgedData(
        queries=read_queries(folder / "queries.jsonl"),
        corpus=read_corpus(folder / "corpus.jsonl"),
        qrels=read_qrels(qrels_path),
        sources=sources,
    )
    missing = next((query for query in data.qrels if query not in data.queries), None)
    if missing is not None:
        raise InputError(f"{qrels_path}: query {missing!r} is judged but has no text in {sources['queries']}")
    if run is not None:
        data.run = read_trec_run(run)
        data.sources["run"] = str(run)
        for query, retrieved in data.run.items():
            unknown = next((doc for doc in retrieved if doc not in data.corpus), None)
            if unknown is not None:
                raise InputError(
                    f"{run}: document {unknown!r} (query {query!r}) is not in {sources['corpus']}"
                )
    return data


def write_trec_run(run: Mapping[str, Mapping[str, float]], path: Path, tag: str = "genscore") -> None:
    """``run`` as a TREC run file, each query's documents best first."""
    with open(path, "w", encoding="utf-8") as out:
        for query, scores in run.items():
            for rank, (doc, score) in enumerate(ranked(scores), start=1):
                out.write(f"{query} Q0 {doc} {rank} {score!r} {tag}\n")


def ranked(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """Documents best first, as trec_eval orders them: by score, a tie by document id, the larger
    first (so that every tool reading the run agrees on one order)."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)
