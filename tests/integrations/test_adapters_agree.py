"""The LangChain and LlamaIndex adapters agree: defaults, the model given first, errors, saving.

Both are built the same ways and fail the same way on the same bad input, and a saved adapter
(LlamaIndex ``to_dict``/``from_dict``, LangChain ``model_dump``) reloads with every setting, so
that it scores exactly as the original on the tiny model.
"""

from __future__ import annotations

import copy
import json
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_classic.retrievers.document_compressors import DocumentCompressorPipeline
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core.schema import NodeWithScore, TextNode

import genscore_core.scorer as scorer_module
from genscore_core import GenerativeScorer, InvalidRequestError, ModelNotFoundError, ScorerConfig
from genscore_integrations.langchain import GenerativeCrossEncoder, GenerativeReranker
from genscore_integrations.llama_index import GenerativeRerank
from tests.helpers.recipe_ranking import RIVER_QUERY, RIVER_TEXTS, RecipeReference, spied

QUERY, TEXTS = RIVER_QUERY, RIVER_TEXTS
ADAPTERS = [GenerativeReranker, GenerativeCrossEncoder, GenerativeRerank]


def non_default_settings(tiny_model_dir: Path) -> dict[str, Any]:
    """Settings that each change the scores or the prompts, so a lost one shows."""
    return {
        "template": "qwen3-reranker",
        "instruction": "Judge whether the passage names the river",
        "max_length": 80,  # short enough that the longer documents are chunked
        "score_mode": "logit",
        "long_documents": "chunk",
        "chunk_overlap": 4,
        "chunk_aggregation": "mean",
        "query_share": 0.5,
        "device": "cpu",
        "dtype": "bfloat16",
        "max_batch_size": 3,
        "forward": "padded",
    }


def test_top_n_default_is_the_same() -> None:
    # 3, as LangChain's CrossEncoderReranker (LlamaIndex's own rerankers cut by default too).
    assert GenerativeReranker.model_fields["top_n"].default == 3
    assert GenerativeRerank.model_fields["top_n"].default == 3


@pytest.mark.parametrize("cls", ADAPTERS)
def test_the_model_may_come_first(cls: Any, tiny_model_dir: Path) -> None:
    adapter = cls(str(tiny_model_dir), device="cpu", dtype="float32", max_length=256)
    config = adapter.scorer.config
    assert (config.model, config.prompt.max_length, config.run.dtype) == (str(tiny_model_dir), 256, "float32")


@pytest.mark.parametrize("cls", ADAPTERS)
def test_the_model_given_twice_is_a_type_error(cls: Any) -> None:
    with pytest.raises(TypeError):
        cls("some/model", model="other/model")


BAD_INPUT: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("unknown name", {"model": "./no-such-folder", "topn": 3}, TypeError, "unexpected keyword argument.*'topn'"),
    ("not a scorer", {"scorer": "Qwen/Qwen3-Reranker-0.6B"}, TypeError, "must be a genscore_core.GenerativeScorer"),
    ("scorer with other settings", {"scorer": None, "max_length": 64}, TypeError, "max_length differ"),
    ("scorer with another model", {"scorer": None, "model": "other/model"}, TypeError, "model differ"),
    ("top_n 0", {"model": "./no-such-folder", "top_n": 0}, InvalidRequestError, "top_n"),
    ("top_n not an int", {"model": "./no-such-folder", "top_n": 2.5}, InvalidRequestError, "top_n"),
    ("threshold above 1", {"model": "./no-such-folder", "score_threshold": 1.5}, InvalidRequestError, "score_threshold"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "arguments", "error", "message"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeRerank])
def test_the_same_bad_input_raises_the_same_error(
    cls: Any,
    case: str,
    arguments: dict[str, Any],
    error: type[Exception],
    message: str,
    scorer: GenerativeScorer,
) -> None:
    arguments = {key: scorer if value is None else value for key, value in arguments.items()}
    # The model folder does not exist: every error is raised before anything is loaded.
    with pytest.raises(error, match=message) as raised:
        cls(**arguments)
    assert type(raised.value) is error


def _nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(text=text, id_=f"n{i}"), score=0.5) for i, text in enumerate(TEXTS)]


def _node_scores(rerank: GenerativeRerank) -> list[tuple[str, float | None]]:
    return [(n.node.node_id, n.score) for n in rerank.postprocess_nodes(_nodes(), query_str=QUERY)]


@pytest.mark.slow
def test_llama_index_round_trip_keeps_every_setting_and_the_scores(tiny_model_dir: Path) -> None:
    settings = non_default_settings(tiny_model_dir)
    original = GenerativeRerank(str(tiny_model_dir), top_n=None, score_threshold=0.0, **settings)
    data = json.loads(original.to_json())  # through JSON, as a docstore keeps it
    for name, value in settings.items():
        assert data[name] == value, name
    reloaded = GenerativeRerank.from_dict(data)
    assert reloaded.scorer is not original.scorer
    assert reloaded.scorer.config == original.scorer.config
    assert (reloaded.top_n, reloaded.score_threshold) == (None, 0.0)
    want = _node_scores(original)
    assert _node_scores(reloaded) == want
    # The settings matter: the same model with default settings ranks differently.
    plain = GenerativeRerank(str(tiny_model_dir), top_n=None, device="cpu", dtype="float32")
    assert _node_scores(plain) != want
    # Reloading onto the loaded scorer: the saved settings agree with it.
    shared = GenerativeRerank.from_dict(data, scorer=original.scorer)
    assert shared.scorer is original.scorer and _node_scores(shared) == want


def test_a_custom_template_survives_the_round_trip(tiny_model_dir: Path) -> None:
    from genscore_core import QWEN3_RERANKER

    template = QWEN3_RERANKER.model_copy(
        update={"name": "custom", "default_instruction": "Is it about rivers?"}
    )
    original = GenerativeRerank(str(tiny_model_dir), template=template, device="cpu", dtype="float32")
    reloaded = GenerativeRerank.from_json(original.to_json())
    assert reloaded.scorer.template == template
    assert _node_scores(reloaded) == _node_scores(original)


def test_the_real_dtype_is_saved_when_the_scorer_left_it_to_the_device(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    scorer = GenerativeScorer.from_model(lm, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert scorer.config.run.dtype is None
    data = GenerativeRerank(scorer=scorer).to_dict()
    assert data["dtype"] == "bfloat16" and data["model"] == str(tiny_model_dir)
    assert _node_scores(GenerativeRerank.from_dict(data)) == _node_scores(GenerativeRerank(scorer=scorer))


def test_a_secret_is_not_saved(tiny_model_dir: Path) -> None:
    # A server-backed scorer (not contacted here): the API key stays out of what is written.
    scorer = GenerativeScorer.from_server("http://127.0.0.1:9", str(tiny_model_dir), server_api_key="s3cret")
    for data in (
        GenerativeRerank(scorer=scorer).to_json(),
        GenerativeReranker(scorer=scorer).model_dump_json(),
    ):
        assert "s3cret" not in data and "server_api_key" not in data


@pytest.mark.slow
@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
def test_langchain_dump_keeps_every_setting_and_the_scores(cls: Any, tiny_model_dir: Path) -> None:
    settings = non_default_settings(tiny_model_dir)
    original = cls(str(tiny_model_dir), **settings)
    data = json.loads(original.model_dump_json())
    for name, value in settings.items():
        assert data[name] == value, name
    documents = [Document(page_content=text, id=f"d{i}") for i, text in enumerate(TEXTS)]

    def scores(adapter: Any) -> Any:
        if isinstance(adapter, GenerativeReranker):
            out = adapter.compress_documents(documents, QUERY)
            return [(d.id, d.metadata["relevance_score"]) for d in out]
        return adapter.score([(QUERY, text) for text in TEXTS])

    want = scores(original)
    for reloaded in (cls(**data), cls.model_validate(data)):
        assert reloaded.scorer is not original.scorer
        assert reloaded.scorer.config == original.scorer.config
        assert scores(reloaded) == want
    shared = cls(**data, scorer=original.scorer)
    assert shared.scorer is original.scorer


def test_settings_given_as_config_are_saved_too(tiny_model_dir: Path) -> None:
    config = ScorerConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_length=100)
    data = GenerativeReranker(config=config).model_dump()
    assert (data["model"], data["max_length"], data["top_n"]) == (str(tiny_model_dir), 100, 3)
    assert GenerativeRerank(config=config).to_dict()["max_length"] == 100


def _scores(adapter: Any) -> Any:
    if isinstance(adapter, GenerativeRerank):
        return _node_scores(adapter)
    if isinstance(adapter, GenerativeReranker):
        documents = [Document(page_content=text, id=f"d{i}") for i, text in enumerate(TEXTS)]
        return [(d.id, d.metadata["relevance_score"]) for d in adapter.compress_documents(documents, QUERY)]
    return adapter.score([(QUERY, text) for text in TEXTS])


def _saved(adapter: Any) -> dict[str, Any]:
    return adapter.to_dict() if isinstance(adapter, GenerativeRerank) else adapter.model_dump()


@pytest.mark.parametrize("cls", ADAPTERS)
def test_pickle_reloads_the_scorer_and_deepcopy_shares_it(cls: Any, tiny_model_dir: Path) -> None:
    options = {} if cls is GenerativeCrossEncoder else {"top_n": 4, "score_threshold": 0.0}
    original = cls(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=90, score_mode="logit", **options
    )
    want = _scores(original)
    # A pickle holds the options and the scorer's settings; loading it loads a scorer like the original.
    reloaded = pickle.loads(pickle.dumps(original))
    assert type(reloaded) is cls and _saved(reloaded) == _saved(original)
    assert reloaded.scorer is not original.scorer
    assert reloaded.scorer.config == original.scorer.config
    assert _scores(reloaded) == want
    # A deep copy copies the options and shares the loaded scorer.
    copied = copy.deepcopy(original)
    assert type(copied) is cls and copied is not original and _saved(copied) == _saved(original)
    assert copied.scorer is original.scorer
    assert _scores(copied) == want


@pytest.mark.parametrize("cls", ADAPTERS)
def test_unpickling_raises_the_error_that_stops_the_scorer_loading(
    cls: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A pickle sent to a worker where the model folder is missing: the load error must reach the
    # caller. LlamaIndex's BaseComponent.__setstate__ swallows any error of __init__ and falls back
    # to pydantic's, which left a GenerativeRerank without a scorer, failing on first use with
    # AttributeError '_scorer' that names neither the model nor the folder.
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    original = cls(str(folder), device="cpu", dtype="float32")
    data = pickle.dumps(original)
    shutil.rmtree(folder)
    with pytest.raises(ModelNotFoundError, match=re.escape(str(folder))):
        pickle.loads(data)


def test_adapters_sharing_a_scorer_share_one_again_after_unpickling(tiny_model_dir: Path) -> None:
    # The docs' setup: one model serving a LangChain retriever and a LlamaIndex query engine. A pickle of
    # them (Ray, multiprocessing) loaded one model per adapter: three models in memory where the
    # pickled objects held one.
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=90)
    reranker = GenerativeReranker(scorer=scorer, top_n=None)
    retriever = ContextualCompressionRetriever(
        base_compressor=DocumentCompressorPipeline(transformers=[reranker]),
        base_retriever=InMemoryVectorStore.from_texts(
            TEXTS, DeterministicFakeEmbedding(size=16)
        ).as_retriever(search_kwargs={"k": len(TEXTS)}),
    )
    encoder = GenerativeCrossEncoder(scorer=scorer)
    rerank = GenerativeRerank(scorer=scorer, top_n=None, metadata_mode="none")
    data = pickle.dumps({"retriever": retriever, "encoder": encoder, "rerank": rerank})
    with spied(scorer_module, "_load") as loads:  # the scorer pickles as its settings: loaded once
        loaded = pickle.loads(data)
    assert loads["_load"].call_count == 1
    [copied_reranker] = loaded["retriever"].base_compressor.transformers
    shared = copied_reranker.scorer
    assert shared is not scorer and shared.config == scorer.config
    assert loaded["encoder"].scorer is shared and loaded["rerank"].scorer is shared
    # A second load is a second, independent copy, with its own scorer.
    assert pickle.loads(data)["rerank"].scorer is not shared
    want = RecipeReference(tiny_model_dir).scores(QUERY, TEXTS, max_length=90)
    got = {d.page_content: d.metadata["relevance_score"] for d in loaded["retriever"].invoke(QUERY)}
    assert [got[text] for text in TEXTS] == pytest.approx(want, abs=1e-5)
    assert loaded["encoder"].score([(QUERY, text) for text in TEXTS]) == pytest.approx(want, abs=1e-5)
    by_id = {n.node.node_id: n.score for n in loaded["rerank"].postprocess_nodes(_nodes(), query_str=QUERY)}
    assert [by_id[f"n{i}"] for i in range(len(TEXTS))] == pytest.approx(want, abs=1e-5)
