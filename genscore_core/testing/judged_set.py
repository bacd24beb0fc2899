"""A synthetic judged set in BEIR's layout, built offline, on which the demo reranker has work to do.

Each query asks about 2 to 3 content words (single-token words of the Qwen3 vocabulary that the demo
model was trained on). Its documents, written like the demo model's training sentences:

* one fully relevant document (relevance 2) holding every query word;
* one or two partly relevant documents (relevance 1) holding one query word fewer;
* unjudged distractors holding none of them, as many as it takes to fill ``candidates`` slots.

``first_stage.run`` (a TREC run) is a weak first stage given with the set: each query's candidates
(its judged documents and its distractors) in a seeded random order, the way a poor retriever hands
over a pool whose top is no better than the rest. The demo reranker, which scores word overlap,
should put the judged documents first; BM25 over the corpus would too (it is lexical as well), which
is why the set ships its own first stage.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from genscore_core.testing.demo_model import _FILLERS, _QUESTION_WORDS, content_words, held_out_words

FIRST_STAGE_RUN = "first_stage.run"


def _sentence(rng: random.Random, first: str, words: list[str], end: str) -> str:
    text = [first]
    for word in words:
        text += [*rng.sample(_FILLERS, rng.randint(0, 2)), word]
    return " ".join(text) + end


def make_judged_set(out: str | Path, *, queries: int = 30, candidates: int = 20, seed: int = 0) -> Path:
    """Write ``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv`` and :data:`FIRST_STAGE_RUN` into ``out``.

    ``candidates`` is each query's number of first-stage documents (at least 4). Deterministic for a
    given seed (Python's ``random``, no torch).
    """
    from transformers import AutoTokenizer

    from genscore_core.testing.tiny_model import qwen3_tokenizer_dir

    if candidates < 4:
        raise ValueError(
            f"candidates must be at least 4 (judged documents and a distractor), got {candidates}"
        )
    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    unseen = set(held_out_words(tokenizer))
    words = [word for word in content_words(tokenizer) if word not in unseen]
    rng = random.Random(seed)
    folder = Path(out)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    corpus: list[dict[str, str]] = []
    query_lines: list[dict[str, str]] = []
    qrels: list[tuple[str, str, int]] = []
    run: list[tuple[str, list[str]]] = []
    for number in range(queries):
        query_id = f"q{number}"
        size = rng.randint(2, 3)
        asked = rng.sample(words, size)
        query_lines.append({"_id": query_id, "text": _sentence(rng, rng.choice(_QUESTION_WORDS), asked, "?")})
        others = [word for word in rng.sample(words, candidates * (size + 2) + size) if word not in asked]
        # The fully relevant document, one or two partly relevant ones, then unjudged distractors.
        held: list[tuple[list[str], int | None]] = [(list(asked), 2)]
        held += [(rng.sample(asked, size - 1), 1) for _ in range(rng.randint(1, 2))]
        held += [([], None)] * (candidates - len(held))
        pool: list[str] = []
        for words_held, grade in held:
            doc_id = f"d{len(corpus)}"
            # Every document of a query holds as many content words: length says nothing of relevance.
            picked = words_held + [others.pop() for _ in range(size + 2 - len(words_held))]
            rng.shuffle(picked)
            corpus.append({"_id": doc_id, "title": "", "text": _sentence(rng, "The", picked, ".")})
            pool.append(doc_id)
            if grade is not None:
                qrels.append((query_id, doc_id, grade))
        rng.shuffle(pool)
        run.append((query_id, pool))
    _write_jsonl(folder / "corpus.jsonl", corpus)
    _write_jsonl(folder / "queries.jsonl", query_lines)
    with open(folder / "qrels" / "test.tsv", "w", encoding="utf-8") as tsv:
        tsv.write("query-id\tcorpus-id\tscore\n")
        tsv.writelines(f"{q}\t{d}\t{grade}\n" for q, d, grade in qrels)
    with open(folder / FIRST_STAGE_RUN, "w", encoding="utf-8") as trec:
        for query_id, pool in run:
            for rank, doc_id in enumerate(pool, start=1):
                trec.write(f"{query_id} Q0 {doc_id} {rank} {len(pool) - rank + 1} random\n")
    return folder


def _write_jsonl(path: Path, records: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
