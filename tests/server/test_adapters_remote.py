"""The LangChain and LlamaIndex adapters, built with a server URL instead of a model, against a live server."""

from __future__ import annotations

from pathlib import Path

import pytest

from genscore_core import GenerativeScorer

from ._support import LiveServer

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode

from genscore_integrations.langchain import GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank

QUERY = "What is the capital of France?"
TEXTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is in Paris.",
    "Lyon is known for its cuisine.",
]


def _documents() -> list[Document]:
    return [Document(page_content=text, metadata={"n": i}, id=f"doc-{i}") for i, text in enumerate(TEXTS)]


def _nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=text, id_=f"node-{i}"), score=0.5) for i, text in enumerate(TEXTS)
    ]


async def test_langchain_reranker_scores_through_the_server(
    tiny_model_dir: Path, live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    remote = GenerativeReranker(
        model=str(tiny_model_dir), server_url=live_server.url, max_length=512, top_n=2
    )
    assert remote.scorer.config.server_url == live_server.url
    assert not hasattr(remote.scorer, "model")
    local = GenerativeReranker(scorer=scorer, top_n=2)
    want = [(d.id, d.metadata) for d in local.compress_documents(_documents(), QUERY)]
    assert [(d.id, d.metadata) for d in remote.compress_documents(_documents(), QUERY)] == want
    assert [(d.id, d.metadata) for d in await remote.acompress_documents(_documents(), QUERY)] == want


async def test_llama_index_rerank_scores_through_the_server(
    tiny_model_dir: Path, live_server: LiveServer, scorer: GenerativeScorer
) -> None:
    remote = GenerativeRerank(
        model=str(tiny_model_dir), server_url=live_server.url, server_kind="vllm", max_length=512, top_n=2
    )
    assert remote.scorer.config.server_kind == "vllm"
    local = GenerativeRerank(scorer=scorer, top_n=2)
    want = [(n.node.node_id, n.score) for n in local.postprocess_nodes(_nodes(), query_str=QUERY)]
    assert [(n.node.node_id, n.score) for n in remote.postprocess_nodes(_nodes(), query_str=QUERY)] == want
    got = await remote.apostprocess_nodes(_nodes(), query_str=QUERY)
    assert [(n.node.node_id, n.score) for n in got] == want
