"""The LangChain and LlamaIndex adapters, built with a server URL instead of a model, against a live server."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genscore_core import GenerativeScorer, RemoteConfigurationError
from genscore_core.server import create_app
from tests.helpers.server import CAPITAL_DOCUMENTS as TEXTS
from tests.helpers.server import CAPITAL_QUERY as QUERY
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode

from genscore_integrations.langchain import GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank


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
    assert remote.scorer.config.run.url == live_server.url
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
    assert remote.scorer.config.run.kind == "vllm"
    local = GenerativeRerank(scorer=scorer, top_n=2)
    want = [(n.node.node_id, n.score) for n in local.postprocess_nodes(_nodes(), query_str=QUERY)]
    assert [(n.node.node_id, n.score) for n in remote.postprocess_nodes(_nodes(), query_str=QUERY)] == want
    got = await remote.apostprocess_nodes(_nodes(), query_str=QUERY)
    assert [(n.node.node_id, n.score) for n in got] == want


API_KEY = "s3cret-key"


def _requiring_key(app: Any, key: str) -> Any:
    """``app`` behind a bearer-key check, as a gateway in front of ``genscore serve`` (or vLLM's
    ``--api-key``) answers: 401 without the key, the app's own answer with it."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {key}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b'{"error": "invalid api key"}'})
                return
        await app(scope, receive, send)

    return guarded


@pytest.fixture(scope="module")
def keyed_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    with serve_in_thread(_requiring_key(create_app(scorer, TEST_LIMITS), API_KEY)) as live:
        yield live


def _pickled_adapters(model: Path, url: str) -> list[Any]:
    settings: dict[str, Any] = {"server_url": url, "server_api_key": API_KEY, "max_length": 512}
    return [
        GenerativeReranker(model=str(model), top_n=2, **settings),
        GenerativeRerank(model=str(model), top_n=2, **settings),
    ]


def _ranked_ids(adapter: Any) -> list[str]:
    if isinstance(adapter, GenerativeReranker):
        return [str(d.id) for d in adapter.compress_documents(_documents(), QUERY)]
    return [
        n.node.node_id.replace("node", "doc") for n in adapter.postprocess_nodes(_nodes(), query_str=QUERY)
    ]


def test_a_pickled_adapter_keeps_its_api_key_for_the_process_it_lands_in(
    tiny_model_dir: Path, keyed_server: LiveServer, scorer: GenerativeScorer
) -> None:
    # Ray and multiprocessing move adapters by pickle: the copy must reach a server that wants a key.
    local = GenerativeReranker(scorer=scorer, top_n=2)
    want = [str(d.id) for d in local.compress_documents(_documents(), QUERY)]
    for adapter in _pickled_adapters(tiny_model_dir, keyed_server.url):
        assert _ranked_ids(adapter) == want
        data = pickle.dumps(adapter)
        copy = pickle.loads(data)
        assert API_KEY not in repr(copy.scorer.config)
        assert _ranked_ids(copy) == want
        copy.scorer.close()
        adapter.scorer.close()


def test_a_saved_adapter_leaves_its_api_key_out(tiny_model_dir: Path, keyed_server: LiveServer) -> None:
    reranker, rerank = _pickled_adapters(tiny_model_dir, keyed_server.url)
    for text in (reranker.model_dump_json(), json.dumps(reranker.model_dump()), rerank.to_json()):
        assert API_KEY not in text and "server_api_key" not in text
    # Reloaded without the key, the server refuses it, naming the setting to check.
    reloaded = GenerativeRerank.from_dict(rerank.to_dict())
    with pytest.raises(RemoteConfigurationError, match=r"401.*server_api_key"):
        reloaded.postprocess_nodes(_nodes(), query_str=QUERY)
    for adapter in (reranker, rerank, reloaded):
        adapter.scorer.close()
