"""The adapters with odd inputs: metadata that cannot be deep-copied, invalid text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_integrations.langchain import GenerativeCrossEncoder, GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank

QUERY = "capital of France"
TEXTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]


def _numbers() -> Iterator[int]:
    yield 1


@pytest.fixture
def odd_metadata(tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    with open(tmp_path / "notes.txt", "w") as handle:
        yield [
            {"lock": threading.Lock(), "source": "a"},
            {"generator": _numbers(), "source": "b"},
            {"file": handle, "nested": {"ok": [1, 2]}},
        ]


def test_langchain_keeps_documents_whose_metadata_cannot_be_deep_copied(
    scorer: GenerativeScorer, odd_metadata: list[dict[str, Any]]
) -> None:
    documents = [Document(page_content=t, metadata=m) for t, m in zip(TEXTS, odd_metadata)]
    expected = scorer.rerank(QUERY, TEXTS)
    reranked = GenerativeReranker(scorer=scorer, top_n=None).compress_documents(documents, QUERY)
    assert [d.page_content for d in reranked] == [TEXTS[r.index] for r in expected]
    for document, result in zip(reranked, expected):
        original = odd_metadata[result.index]
        assert document.metadata["relevance_score"] == pytest.approx(result.score, abs=1e-6)
        assert all(document.metadata[key] is value for key, value in original.items())  # shallow
        assert "relevance_score" not in original  # the input is untouched


async def test_langchain_async_keeps_them_too(
    scorer: GenerativeScorer, odd_metadata: list[dict[str, Any]]
) -> None:
    documents = [Document(page_content=t, metadata=m) for t, m in zip(TEXTS, odd_metadata)]
    reranked = await GenerativeReranker(scorer=scorer, top_n=2).acompress_documents(documents, QUERY)
    assert len(reranked) == 2


def test_llama_index_keeps_nodes_whose_metadata_cannot_be_deep_copied(
    scorer: GenerativeScorer, odd_metadata: list[dict[str, Any]]
) -> None:
    nodes = [NodeWithScore(node=TextNode(text=t, metadata=m), score=0.3) for t, m in zip(TEXTS, odd_metadata)]
    rerank = GenerativeRerank(scorer=scorer, top_n=None, keep_retrieval_score=True, metadata_mode="none")
    reranked = rerank.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    expected = scorer.rerank(QUERY, TEXTS)
    assert [n.node.get_content() for n in reranked] == [TEXTS[r.index] for r in expected]
    for node, result in zip(reranked, expected):
        assert node.score == pytest.approx(result.score, abs=1e-6)
        assert node.node.metadata["retrieval_score"] == 0.3
        assert "retrieval_score" not in odd_metadata[result.index]
        assert "retrieval_score" not in nodes[result.index].node.excluded_llm_metadata_keys


BAD = "text with a lone \udc80 surrogate"


def test_langchain_refuses_invalid_text_naming_the_document(scorer: GenerativeScorer) -> None:
    documents = [Document(page_content=TEXTS[0]), Document(page_content=BAD)]
    with pytest.raises(InvalidRequestError) as caught:
        GenerativeReranker(scorer=scorer).compress_documents(documents, QUERY)
    assert (caught.value.param, caught.value.index) == ("documents", 1)
    with pytest.raises(InvalidRequestError) as caught:
        GenerativeCrossEncoder(scorer=scorer).score([(QUERY, TEXTS[0]), (QUERY, BAD)])
    # The cross-encoder takes pairs: the bad text is named as its caller passed it (since b93e0ff).
    assert (caught.value.param, caught.value.index) == ("pairs", 1)
    assert "pairs[1][1] (the document)" in caught.value.message


async def test_llama_index_refuses_invalid_text_naming_the_node(scorer: GenerativeScorer) -> None:
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in (TEXTS[0], TEXTS[1], BAD)]
    rerank = GenerativeRerank(scorer=scorer, metadata_mode="none")
    with pytest.raises(InvalidRequestError) as caught:
        rerank.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert (caught.value.param, caught.value.index) == ("documents", 2)
    with pytest.raises(InvalidRequestError) as caught:
        await rerank.apostprocess_nodes(nodes, query_bundle=QueryBundle(BAD))
    assert caught.value.param == "query"
