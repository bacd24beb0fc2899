"""long_documents="chunk" and max_tokens_per_doc, against a window-by-window reference built on the
official Qwen3-Reranker recipe."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    official_qwen3_scores,
)
from tests.server._support import TEST_LIMITS, serve_in_thread

MAX_LENGTH = 160
OVERLAP = 16
WORDS = "paris france capital river seine museum louvre berlin wall history london thames bridge".split()


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def chunking(scorer: GenerativeScorer) -> GenerativeScorer:
    return GenerativeScorer.from_model(
        scorer.model,
        scorer.tokenizer,
        max_length=MAX_LENGTH,
        long_documents="chunk",
        chunk_overlap=OVERLAP,
    )


def _document(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def reference_windows(tokenizer: object, query: str, document: str) -> list[tuple[int, int]]:
    """The documented rule, written out: the room is what the official prompt with an empty document
    leaves of max_length; windows of that many of the document's own tokens, each starting
    room - overlap tokens after the last, the last one ending at the document's end."""
    empty = (
        tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)  # type: ignore[attr-defined]
        + tokenizer.encode(  # type: ignore[attr-defined]
            f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: ", add_special_tokens=False
        )
        + tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)  # type: ignore[attr-defined]
    )
    room = MAX_LENGTH - len(empty)
    offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]  # type: ignore[operator]
    if len(offsets) <= room:
        return [(0, len(document))]
    windows, start = [], 0
    while True:
        end = min(start + room, len(offsets))
        windows.append((offsets[start][0], offsets[end - 1][1]))
        if end == len(offsets):
            return windows
        start += room - OVERLAP


def test_chunked_documents_get_their_best_window(
    chunking: GenerativeScorer, reference: tuple[object, object]
) -> None:
    model, tokenizer = reference
    rng = random.Random(2)
    query = "Which river flows through Paris?"
    documents = [_document(rng, n) for n in (5, 60, 150, 400)]
    ranked = chunking.rerank(query, documents)
    by_index = {r.index: r for r in ranked}
    for index, document in enumerate(documents):
        spans = reference_windows(tokenizer, query, document)
        window_scores = official_qwen3_scores(
            model, tokenizer, [(query, document[a:b]) for a, b in spans], max_length=MAX_LENGTH
        )
        best = max(range(len(spans)), key=lambda i: window_scores[i])
        result = by_index[index]
        assert result.windows == len(spans)
        assert result.score == pytest.approx(window_scores[best], abs=1e-5)
        if len(spans) == 1:
            assert result.window == (0, len(document)) and not result.truncated
        else:
            assert result.window == spans[best]
    assert max(r.windows for r in ranked) >= 4, "the long document must span several windows"


def test_other_aggregations(chunking: GenerativeScorer, reference: tuple[object, object]) -> None:
    model, tokenizer = reference
    query = "museum history"
    document = _document(random.Random(8), 300)
    spans = reference_windows(tokenizer, query, document)
    window_scores = official_qwen3_scores(
        model, tokenizer, [(query, document[a:b]) for a, b in spans], max_length=MAX_LENGTH
    )
    assert len(spans) >= 3
    for aggregation, expected in (
        ("mean", sum(window_scores) / len(window_scores)),
        ("first", window_scores[0]),
        ("last", window_scores[-1]),
    ):
        scorer = GenerativeScorer.from_model(
            chunking.model,
            chunking.tokenizer,
            max_length=MAX_LENGTH,
            long_documents="chunk",
            chunk_overlap=OVERLAP,
            chunk_aggregation=aggregation,
        )
        [result] = scorer.rerank(query, [document])
        assert result.score == pytest.approx(expected, abs=1e-5), aggregation


def test_max_tokens_per_doc_cuts_each_document(
    scorer: GenerativeScorer, reference: tuple[object, object]
) -> None:
    model, tokenizer = reference
    query = "capital of France"
    documents = [_document(random.Random(5), 40), "Paris."]
    cut = tokenizer(documents[0], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][9][
        1
    ]  # type: ignore[operator]
    expected = official_qwen3_scores(
        model, tokenizer, [(query, documents[0][:cut]), (query, documents[1])], max_length=scorer.max_length
    )
    ranked = scorer.rerank(query, documents, max_tokens_per_doc=10)
    by_index = {r.index: r for r in ranked}
    assert by_index[0].score == pytest.approx(expected[0], abs=1e-5) and by_index[0].truncated
    assert by_index[1].score == pytest.approx(expected[1], abs=1e-5) and not by_index[1].truncated
    with pytest.raises(ValueError, match="max_tokens_per_doc must be a positive integer"):
        scorer.rerank(query, documents, max_tokens_per_doc=0)


def test_rerank_endpoints_take_max_tokens_per_doc_and_name_windows(chunking: GenerativeScorer) -> None:
    query = "Which river flows through Paris?"
    documents = [_document(random.Random(3), n) for n in (4, 300)]
    with (
        serve_in_thread(create_app(chunking, TEST_LIMITS)) as live,
        httpx.Client(base_url=live.url, timeout=120.0) as client,
    ):
        for path in ("/v1/rerank", "/v2/rerank"):
            body = {"query": query, "documents": documents, "max_tokens_per_doc": 200}
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            expected = chunking.rerank(query, documents, max_tokens_per_doc=200)
            got = response.json()["results"]
            assert [(r["index"], r["relevance_score"]) for r in got] == [(r.index, r.score) for r in expected]
            assert [r["window"] for r in got] == [list(r.window) for r in expected if r.window is not None]
            # Without the cap the long document has more windows: the cap applied before chunking.
            uncapped = chunking.rerank(query, documents)
            assert max(r.windows for r in uncapped) > max(r.windows for r in expected) >= 2
        bad = client.post(
            "/v1/rerank", json={"query": query, "documents": documents, "max_tokens_per_doc": 0}
        )
        assert bad.status_code == 422


def test_adapters_put_the_best_window_in_metadata(chunking: GenerativeScorer) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from genscore_integrations.langchain import WINDOW_KEY, GenerativeReranker
    from genscore_integrations.llama_index import GenerativeRerank

    query = "Which river flows through Paris?"
    texts = [_document(random.Random(6), n) for n in (6, 250)]
    expected = {r.index: r for r in chunking.rerank(query, texts)}
    assert expected[1].windows > 1

    compressed = GenerativeReranker(scorer=chunking, top_n=None).compress_documents(
        [Document(page_content=t, metadata={"source": i}) for i, t in enumerate(texts)], query
    )
    for document in compressed:
        result = expected[document.metadata["source"]]
        assert document.metadata[WINDOW_KEY] == list(result.window)  # type: ignore[arg-type]
        assert document.metadata["relevance_score"] == result.score

    nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.5) for i, t in enumerate(texts)]
    reranked = GenerativeRerank(scorer=chunking, top_n=2).postprocess_nodes(nodes, query_str=query)
    for node in reranked:
        result = expected[int(node.node.node_id)]
        assert node.node.metadata[WINDOW_KEY] == list(result.window)  # type: ignore[arg-type]
        assert WINDOW_KEY in node.node.excluded_llm_metadata_keys
        assert node.score == result.score
    assert all(WINDOW_KEY not in n.node.metadata for n in nodes), "inputs stay untouched"
