"""LangChain adapters on the tiny random Qwen3: mapping, contracts, async, and real retrieval pipelines.

Random weights carry no relevance signal, so every expected score and order comes from the official
Qwen3-Reranker recipe (tests/helpers/reference_recipe.py) run on a copy of the model loaded with transformers,
never from genscore's own output (see tests/helpers/recipe_ranking.py).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import itertools
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager, Callbacks
from langchain_core.cross_encoders import BaseCrossEncoder
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import PrivateAttr

import genscore_integrations.langchain as lc
from genscore_core import GenerativeScorer, InvalidRequestError, ScorerConfig, scorer_setting_names
from genscore_integrations.langchain import GenerativeCrossEncoder, GenerativeReranker
from tests.helpers.model_gate import ModelGate
from tests.helpers.recipe_ranking import (
    NEAR_TIE,
    RIVER_QUERY,
    RIVER_TEXTS,
    SCORE_TOLERANCE,
    SCORING_ENTRY_POINTS,
    RecipeReference,
    assert_order_like_recipe,
    assert_ranked_like_recipe,
    expected_indices,
    spied,
    threshold_between,
)
from tests.helpers.uncopyable import uncopyable_values

QUERY = RIVER_QUERY

TEXTS = [
    *RIVER_TEXTS,
    "Croissants are a staple of French bakeries.",
    "The Rhône rises in the Swiss Alps and flows into the Mediterranean.",
]


@pytest.fixture
def docs() -> list[Document]:
    return [
        Document(
            page_content=text,
            id=f"doc-{i}",
            metadata={"source": f"wiki/{i}", "tags": ["geo", str(i)], "nested": {"rank": i}},
        )
        for i, text in enumerate(TEXTS)
    ]


@pytest.fixture
def recipe(tiny_model_dir: Path) -> RecipeReference:
    return RecipeReference(tiny_model_dir)


def ids(documents: Iterable[Document]) -> list[str | None]:
    return [d.id for d in documents]


def recipe_scores(recipe: RecipeReference, documents: Sequence[Document], **options: Any) -> list[float]:
    """The official recipe's score of each document's text for QUERY, in input order."""
    return recipe.scores(QUERY, [d.page_content for d in documents], **options)


def input_indices(out: Sequence[Document], documents: Sequence[Document]) -> list[int]:
    """Where each returned document was in the input (the inputs' ids are distinct)."""
    index_of = {d.id: i for i, d in enumerate(documents)}
    assert len(index_of) == len(documents), "give the inputs distinct ids"
    return [index_of[d.id] for d in out]


def assert_reranked_like_recipe(
    out: Sequence[Document], documents: Sequence[Document], scores: list[float], **options: Any
) -> None:
    """``out`` keeps what the recipe's ``scores`` keep under ``options`` (top_n, score_threshold), in
    its order, each with the recipe's score as ``relevance_score``."""
    got = zip(input_indices(out, documents), (d.metadata["relevance_score"] for d in out))
    assert_ranked_like_recipe(list(got), scores, **options)


# -- public surface and construction -----------------------------------------------------------------


def test_public_api() -> None:
    assert lc.__all__ == [
        "RELEVANCE_SCORE_KEY",
        "TRUNCATED_KEY",
        "WINDOW_KEY",
        "GenerativeCrossEncoder",
        "GenerativeReranker",
    ]
    assert issubclass(GenerativeReranker, BaseDocumentCompressor)
    assert issubclass(GenerativeCrossEncoder, BaseCrossEncoder)
    assert GenerativeReranker.model_fields["top_n"].default == 3
    assert GenerativeReranker.model_fields["score_threshold"].default is None


def test_missing_langchain_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "langchain_core" or n.startswith("langchain_core.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "genscore_integrations.langchain")
    with pytest.raises(ImportError, match=r'pip install "genscore\[langchain\]"') as info:
        importlib.import_module("genscore_integrations.langchain")
    assert isinstance(info.value.__cause__, ImportError)


def test_package_import_does_not_load_frameworks() -> None:
    code = "import sys, genscore_integrations; print(sorted(m for m in sys.modules if m.startswith('langchain')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def forwarded(config: ScorerConfig) -> dict[str, Any]:
    """The settings that the adapters' tests pass, as the scorer's config holds them."""
    return {
        "model": config.model,
        "instruction": config.prompt.instruction,
        "device": config.run.device,
        "dtype": config.run.dtype,
        "max_length": config.prompt.max_length,
    }


def test_built_from_model_settings(
    tiny_model_dir: Path, recipe: RecipeReference, docs: list[Document]
) -> None:
    instruction = "Given a question, find passages that answer it"
    settings: dict[str, Any] = {
        "model": str(tiny_model_dir),
        "instruction": instruction,
        "device": "cpu",
        "dtype": "float32",
    }
    reranker = GenerativeReranker(template="qwen3-reranker", max_length=512, top_n=2, **settings)
    config = reranker.scorer.config
    assert config.prompt.template == "qwen3-reranker"
    assert forwarded(config) == {**settings, "max_length": 512}
    out = reranker.compress_documents(docs, QUERY)
    # The instruction reached the prompt: the recipe scores with it (and not with the card's default).
    scores = recipe_scores(recipe, docs, instruction=instruction)
    assert_reranked_like_recipe(out, docs, scores, top_n=2)
    assert recipe_scores(recipe, docs) != pytest.approx(scores, abs=SCORE_TOLERANCE)


@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
def test_settings_are_forwarded_to_the_scorer(cls: Any, tiny_model_dir: Path) -> None:
    import torch

    settings: dict[str, Any] = {
        "model": str(tiny_model_dir),
        "instruction": "Judge it",
        "device": "cpu",
        "dtype": "bfloat16",
    }
    adapter = cls(max_length=64, **settings)
    assert isinstance(adapter.scorer, GenerativeScorer)
    assert forwarded(adapter.scorer.config) == {**settings, "max_length": 64}
    # Taken up, not only recorded: the weights were loaded in bfloat16 and prompts are cut at 64.
    assert adapter.scorer.model.dtype == torch.bfloat16
    assert adapter.scorer.max_length == 64


@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
def test_every_scorer_setting_is_accepted(cls: Any, tiny_model_dir: Path) -> None:
    """Settings come from ScorerConfig, so new ones (e.g. the server settings) need no adapter change."""
    settings = {"server_url": "http://127.0.0.1:8000", "server_kind": "vllm", "query_share": 0.5}
    assert set(settings) <= set(scorer_setting_names())
    # A scorer with server_url loads only the tokenizer and reaches the server when it scores, so
    # building one needs no server.
    adapter = cls(model=str(tiny_model_dir), **settings)
    assert {name: adapter.scorer.config.to_settings()[name] for name in settings} == settings
    # Each landed in its typed part.
    assert (adapter.scorer.config.server.url, adapter.scorer.config.prompt.query_share) == (
        settings["server_url"],
        0.5,
    )
    assert adapter.scorer.config.model == str(tiny_model_dir)


def test_config_is_forwarded_to_the_scorer(
    tiny_model_dir: Path, recipe: RecipeReference, docs: list[Document]
) -> None:
    config = ScorerConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)
    reranker = GenerativeReranker(config=config, top_n=None)
    assert reranker.scorer.config == config
    out = reranker.compress_documents(docs, QUERY)
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs))


def test_one_scorer_shared_by_several_adapters(scorer: GenerativeScorer) -> None:
    first = GenerativeReranker(scorer=scorer)
    second = GenerativeReranker(scorer=scorer, top_n=None, score_threshold=0.1)
    encoder = GenerativeCrossEncoder(scorer=scorer)
    assert first.scorer is second.scorer is encoder.scorer is scorer


@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
def test_scorer_and_model_settings_together_are_rejected(cls: Any, scorer: GenerativeScorer) -> None:
    with pytest.raises(TypeError, match=r"either a ready scorer= or the settings.*max_length differ"):
        cls(scorer=scorer, max_length=128)
    with pytest.raises(TypeError, match="model differ"):
        cls("another/model", scorer=scorer)
    # Settings that agree with the scorer's are no conflict (a dump reloads onto a shared scorer).
    assert cls(scorer.config.model, scorer=scorer, device="cpu").scorer is scorer


@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
@pytest.mark.parametrize("with_scorer", [True, False])
def test_unknown_fields_are_rejected_before_loading(
    cls: Any, with_scorer: bool, scorer: GenerativeScorer
) -> None:
    given: dict[str, Any] = {"scorer": scorer} if with_scorer else {"model": "some/model"}
    with spied(lc, "GenerativeScorer") as calls:
        with pytest.raises(TypeError, match=r"unexpected keyword argument.*'topn'"):
            cls(**given, topn=3)
    calls["GenerativeScorer"].assert_not_called()


@pytest.mark.parametrize(
    "options",
    [
        {"top_n": 0},
        {"top_n": -1},
        {"top_n": True},
        {"top_n": 2.5},
        {"score_threshold": 1.5},
        {"score_threshold": -0.1},
    ],
)
def test_invalid_options_are_rejected(options: dict[str, Any], scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        GenerativeReranker(scorer=scorer, **options)
    assert raised.value.param == next(iter(options))
    # Checked before the weights are loaded: a model folder that does not exist is never reached.
    with pytest.raises(InvalidRequestError):
        GenerativeReranker(model="./no-such-model-folder", **options)


@pytest.mark.parametrize("cls", [GenerativeReranker, GenerativeCrossEncoder])
def test_a_scorer_given_as_the_model_is_refused_saying_scorer(cls: Any, scorer: GenerativeScorer) -> None:
    # Adapter(scorer) reads naturally, but the first argument is the model name: say where it goes.
    message = r"got a GenerativeScorer as its model; pass a ready scorer as scorer="
    with spied(lc, "GenerativeScorer") as calls:
        with pytest.raises(TypeError, match=message):
            cls(scorer)
        with pytest.raises(TypeError, match=message):
            cls(model=scorer, top_n=2) if cls is GenerativeReranker else cls(model=scorer)
    calls["GenerativeScorer"].assert_not_called()  # refused before any scorer is built


async def test_numpy_options_are_taken_as_the_scorer_takes_them(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document]
) -> None:
    import numpy as np

    scores = recipe_scores(recipe, docs)
    threshold = threshold_between(scores, kept=3)  # strictly between two scores: exactly 3 pass
    reranker = GenerativeReranker(scorer=scorer, top_n=np.int64(2), score_threshold=np.float32(threshold))
    assert (type(reranker.top_n), type(reranker.score_threshold)) == (int, float)
    for out in (reranker.compress_documents(docs, QUERY), await reranker.acompress_documents(docs, QUERY)):
        assert_reranked_like_recipe(out, docs, scores, top_n=2, score_threshold=float(np.float32(threshold)))
    assert GenerativeReranker.model_validate({"scorer": scorer, "top_n": np.int64(5)}).top_n == 5
    assert reranker.model_dump()["top_n"] == 2  # the dump stays plain JSON
    with pytest.raises(InvalidRequestError) as raised:
        GenerativeReranker(scorer=scorer, top_n=np.int64(0))
    assert raised.value.param == "top_n"


def test_wrong_scorer_type_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"must be a genscore_core\.GenerativeScorer"):
        GenerativeReranker(scorer="Qwen/Qwen3-Reranker-0.6B")  # type: ignore[arg-type]


# -- compress_documents ---------------------------------------------------------------------------------


@pytest.mark.parametrize("top_n", [None, 1, 3, 50])
def test_matches_the_official_recipe_ranking(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document], top_n: int | None
) -> None:
    out = GenerativeReranker(scorer=scorer, top_n=top_n).compress_documents(docs, QUERY)
    assert len(out) == min(top_n or len(docs), len(docs))
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs), top_n=top_n)
    assert [d.page_content for d in out] == [docs[i].page_content for i in input_indices(out, docs)]
    scores = [d.metadata["relevance_score"] for d in out]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_score_threshold_with_and_without_top_n(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document]
) -> None:
    scores = recipe_scores(recipe, docs)
    threshold = threshold_between(scores, kept=4)  # strictly between two scores: exactly 4 pass
    out = GenerativeReranker(scorer=scorer, top_n=None, score_threshold=threshold).compress_documents(
        docs, QUERY
    )
    assert len(out) == 4
    assert all(d.metadata["relevance_score"] >= threshold for d in out)
    assert_reranked_like_recipe(out, docs, scores, score_threshold=threshold)
    capped = GenerativeReranker(scorer=scorer, top_n=2, score_threshold=threshold).compress_documents(
        docs, QUERY
    )
    assert ids(capped) == ids(out)[:2]
    assert_reranked_like_recipe(capped, docs, scores, top_n=2, score_threshold=threshold)
    assert GenerativeReranker(scorer=scorer, score_threshold=1.0).compress_documents(docs, QUERY) == []


def test_metadata_and_ids_kept_inputs_untouched(scorer: GenerativeScorer, docs: list[Document]) -> None:
    snapshot = copy.deepcopy(docs)
    out = GenerativeReranker(scorer=scorer, top_n=None).compress_documents(docs, QUERY)
    assert docs == snapshot  # no relevance_score leaked into the inputs
    by_id = {d.id: d for d in docs}
    for result in out:
        original = by_id[result.id]
        assert result is not original
        assert result.page_content == original.page_content
        assert result.metadata == {
            **original.metadata,
            "relevance_score": result.metadata["relevance_score"],
            "genscore_truncated": False,
        }
        # A new dict, one level deep: the values are the input's own, as LangChain's CrossEncoderReranker
        # returns the input documents themselves.
        assert result.metadata is not original.metadata
        assert result.metadata["nested"] is original.metadata["nested"]
    out[0].metadata["source"] = "edited"
    del out[0].metadata["tags"]
    assert docs == snapshot


async def test_metadata_values_are_never_copied(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    # Neither value that deepcopy refuses may cost the caller the scored document.
    not_a_leaf, deep = uncopyable_values()
    payload = list(range(10**5))
    docs = [
        Document(page_content=TEXTS[0], id="tensor", metadata={"emb": not_a_leaf}),
        Document(page_content=TEXTS[1], id="deep", metadata={"tree": deep, "payload": payload}),
    ]
    scores = recipe_scores(recipe, docs)
    reranker = GenerativeReranker(scorer=scorer, top_n=None)
    for out in (reranker.compress_documents(docs, QUERY), await reranker.acompress_documents(docs, QUERY)):
        assert_reranked_like_recipe(out, docs, scores)
        by_id = {d.id: d for d in out}
        assert by_id["tensor"].metadata["emb"] is not_a_leaf
        assert by_id["deep"].metadata["tree"] is deep and by_id["deep"].metadata["payload"] is payload
    assert all(set(d.metadata) <= {"emb", "tree", "payload"} for d in docs)


def test_document_subclass_and_existing_score_are_handled(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    class MyDocument(Document):
        pass

    docs = [MyDocument(page_content=t, metadata={"relevance_score": 42.0}) for t in TEXTS[:3]]
    out = GenerativeReranker(scorer=scorer, top_n=None).compress_documents(docs, QUERY)
    assert all(type(d) is MyDocument and d.id is None for d in out)
    # The new score replaces the old one.
    want = dict(zip(TEXTS[:3], recipe_scores(recipe, docs)))
    assert {d.page_content: d.metadata["relevance_score"] for d in out} == pytest.approx(
        want, abs=SCORE_TOLERANCE
    )
    assert all(d.metadata["relevance_score"] == 42.0 for d in docs)


async def test_a_window_left_by_an_earlier_reranking_is_removed(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    # Reranked before by a chunking scorer: its window describes a score this reranking replaces.
    earlier = {"relevance_score": 0.9, "genscore_window": [0, 12], "source": "a.md"}
    docs = [
        Document(page_content=TEXTS[0], id="seen", metadata=dict(earlier)),
        Document(page_content=TEXTS[1], id="new"),
    ]
    scores = recipe_scores(recipe, docs)
    reranker = GenerativeReranker(scorer=scorer, top_n=None)  # truncates: reports no window
    for out in (reranker.compress_documents(docs, QUERY), await reranker.acompress_documents(docs, QUERY)):
        assert_reranked_like_recipe(out, docs, scores)
        assert all("genscore_window" not in d.metadata for d in out)
        assert {d.id: d.metadata.get("source") for d in out} == {"seen": "a.md", "new": None}
    assert docs[0].metadata == earlier  # the input is left as it was


def test_truncated_flag(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    short = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, device="cpu", dtype="float32", max_length=96
    )
    docs = [
        Document(page_content="The Seine flows through Paris.", id="short"),
        Document(page_content=" ".join(["The Seine flows through Paris."] * 40), id="long"),
    ]
    out = GenerativeReranker(scorer=short, top_n=None).compress_documents(docs, QUERY)
    flags = {d.id: d.metadata["genscore_truncated"] for d in out}
    assert flags == {"short": False, "long": True}
    # The recipe's prompts agree: only the long one is over 96 tokens; and the long one is scored as
    # the recipe scores it, cut to 96.
    assert {d.id: recipe.is_cut(QUERY, d.page_content, max_length=96) for d in docs} == flags
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs, max_length=96))


def test_ties_keep_input_order(scorer: GenerativeScorer) -> None:
    docs = [Document(page_content=TEXTS[i % 2], id=str(i)) for i in range(6)]  # three copies of two texts
    out = GenerativeReranker(scorer=scorer, top_n=None).compress_documents(docs, QUERY)
    scores = [d.metadata["relevance_score"] for d in out]
    assert scores[0] == scores[1] == scores[2] and scores[3] == scores[4] == scores[5]
    order = [int(d.id or "") for d in out]
    assert order[:3] == sorted(order[:3]) and order[3:] == sorted(order[3:])


async def test_empty_input_gives_empty_list_without_scoring(scorer: GenerativeScorer) -> None:
    reranker = GenerativeReranker(scorer=scorer)
    encoder = GenerativeCrossEncoder(scorer=scorer)
    with spied(scorer, *SCORING_ENTRY_POINTS) as calls:
        assert reranker.compress_documents([], QUERY) == []
        assert await reranker.acompress_documents([], QUERY) == []
        assert encoder.score([]) == []
        assert await encoder.ascore([]) == []
    assert {name: spy.mock_calls for name, spy in calls.items()} == {name: [] for name in calls}


def test_options_and_texts_are_forwarded(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    docs = [Document(page_content=text, id=f"doc-{i}") for i, text in enumerate(TEXTS)]
    scores = recipe_scores(recipe, docs)
    threshold = threshold_between(scores, kept=3)
    reranker = GenerativeReranker(scorer=scorer, top_n=1, score_threshold=threshold)
    with spied(scorer, "rerank") as calls:
        out = reranker.compress_documents(tuple(docs), QUERY)
    calls["rerank"].assert_called_once_with(QUERY, TEXTS, top_n=1, score_threshold=threshold)
    [best] = expected_indices(scores, top_n=1, score_threshold=threshold)
    assert [(d.id, d.metadata) for d in out] == [
        (
            docs[best].id,
            {
                "relevance_score": pytest.approx(scores[best], abs=SCORE_TOLERANCE),
                "genscore_truncated": False,
            },
        )
    ]


async def test_an_item_that_is_not_a_document_is_named_before_scoring(scorer: GenerativeScorer) -> None:
    reranker = GenerativeReranker(scorer=scorer, top_n=None)
    bad = [Document(page_content=TEXTS[0]), TEXTS[1], Document(page_content=TEXTS[2])]
    with ModelGate(scorer) as gate:
        for call in (reranker.compress_documents, reranker.acompress_documents):
            with pytest.raises(
                InvalidRequestError, match=r"documents\[1\] must be a .*Document, got str"
            ) as raised:
                out = call(bad, QUERY)  # type: ignore[arg-type]
                if asyncio.iscoroutine(out):
                    await out
            assert (raised.value.param, raised.value.index) == ("documents", 1)
    assert not gate.thread_ids  # nothing reached the model


def test_engine_errors_reach_the_caller(scorer: GenerativeScorer, docs: list[Document]) -> None:
    with pytest.raises(InvalidRequestError, match="query must be a string"):
        GenerativeReranker(scorer=scorer).compress_documents(docs, 123)  # type: ignore[arg-type]


# -- async ------------------------------------------------------------------------------------------------


async def test_acompress_matches_sync(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document]
) -> None:
    reranker = GenerativeReranker(scorer=scorer, top_n=4)
    out = await reranker.acompress_documents(docs, QUERY)
    assert out == reranker.compress_documents(docs, QUERY)
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs), top_n=4)


async def test_acompress_awaits_the_scorer_async_api(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    docs = [Document(page_content=TEXTS[2], id="loire"), Document(page_content=TEXTS[0], id="seine")]
    with spied(scorer, "rerank", "arerank") as calls:
        out = await GenerativeReranker(scorer=scorer, top_n=1).acompress_documents(docs, QUERY)
    calls["arerank"].assert_awaited_once_with(QUERY, [TEXTS[2], TEXTS[0]], top_n=1, score_threshold=None)
    calls["rerank"].assert_not_called()
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs), top_n=1)


async def test_acompress_does_not_block_the_event_loop(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document]
) -> None:
    reranker = GenerativeReranker(scorer=scorer, top_n=3)
    with ModelGate(scorer) as gate:
        out, _ = await asyncio.wait_for(
            asyncio.gather(reranker.acompress_documents(docs, QUERY), gate.open_once_entered()), timeout=120
        )
    assert gate.thread_ids and threading.get_ident() not in gate.thread_ids
    assert_reranked_like_recipe(out, docs, recipe_scores(recipe, docs), top_n=3)


# -- cross encoder ----------------------------------------------------------------------------------------


async def test_cross_encoder_scores_match_the_official_recipe(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    pairs = [(QUERY, TEXTS[0]), ("Where is Berlin?", TEXTS[1]), (QUERY, TEXTS[2])]
    encoder = GenerativeCrossEncoder(scorer=scorer)
    want = recipe.pair_scores(pairs)
    assert encoder.score(pairs) == pytest.approx(want, abs=SCORE_TOLERANCE)
    assert await encoder.ascore(pairs) == pytest.approx(want, abs=SCORE_TOLERANCE)


def test_cross_encoder_reranker(
    scorer: GenerativeScorer, recipe: RecipeReference, docs: list[Document]
) -> None:
    reranker = CrossEncoderReranker(model=GenerativeCrossEncoder(scorer=scorer), top_n=3)
    out = reranker.compress_documents(docs, QUERY)
    # LangChain's CrossEncoderReranker writes no score into the documents: the order is what is checked.
    assert_order_like_recipe(input_indices(out, docs), recipe_scores(recipe, docs), top_n=3)


# -- real pipelines: vector store retriever, ContextualCompressionRetriever, LCEL, callbacks -------------


@pytest.fixture
def base_retriever(docs: list[Document]) -> Any:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
    store.add_documents(docs)
    return store.as_retriever(search_kwargs={"k": 5})


def pipeline_candidates(base_retriever: Any) -> list[Document]:
    """What the vector store hands the reranker (the store is deterministic)."""
    candidates = base_retriever.invoke(QUERY)
    assert len(candidates) == 5
    return list(candidates)


def pipeline_expectation(recipe: RecipeReference, base_retriever: Any, top_n: int) -> list[str | None]:
    """The ids the recipe puts first among the store's candidates, for pipelines whose output has no
    score to check (used where the recipe's top scores are clearly apart; see the assertion)."""
    candidates = pipeline_candidates(base_retriever)
    scores = recipe_scores(recipe, candidates)
    top = sorted(scores, reverse=True)[: top_n + 1]
    assert all(a - b > 2 * NEAR_TIE for a, b in itertools.pairwise(top)), (
        f"near-ties in the recipe's top {top}"
    )
    return [candidates[i].id for i in expected_indices(scores, top_n=top_n)]


@pytest.mark.parametrize("flavour", ["reranker", "cross-encoder"])
async def test_contextual_compression_retriever(
    scorer: GenerativeScorer, recipe: RecipeReference, base_retriever: Any, docs: list[Document], flavour: str
) -> None:
    compressor: BaseDocumentCompressor = (
        GenerativeReranker(scorer=scorer, top_n=3)
        if flavour == "reranker"
        else CrossEncoderReranker(model=GenerativeCrossEncoder(scorer=scorer), top_n=3)
    )
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base_retriever)
    candidates = pipeline_candidates(base_retriever)
    scores = recipe_scores(recipe, candidates)
    assert_order_like_recipe(input_indices(retriever.invoke(QUERY), candidates), scores, top_n=3)
    out = await retriever.ainvoke(QUERY)
    assert_order_like_recipe(input_indices(out, candidates), scores, top_n=3)
    originals = {d.id: d for d in docs}
    for doc in out:  # what the vector store returned, with the score beside the original metadata
        assert doc.page_content == originals[doc.id].page_content
        assert doc.metadata.items() >= originals[doc.id].metadata.items()
    if flavour == "reranker":
        assert_reranked_like_recipe(out, candidates, scores, top_n=3)


def format_docs(documents: list[Document]) -> str:
    return "\n".join(f"[{d.id}] {d.page_content}" for d in documents)


async def test_lcel_chain(
    scorer: GenerativeScorer, recipe: RecipeReference, base_retriever: Any, docs: list[Document]
) -> None:
    retriever = ContextualCompressionRetriever(
        base_compressor=GenerativeReranker(scorer=scorer, top_n=2), base_retriever=base_retriever
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the context.\n{context}"), ("human", "{question}")]
    )
    chain = {"context": retriever | RunnableLambda(format_docs), "question": RunnablePassthrough()} | prompt
    by_id = {d.id: d for d in docs}
    context = format_docs([by_id[i] for i in pipeline_expectation(recipe, base_retriever, top_n=2)])
    for value in (chain.invoke(QUERY), await chain.ainvoke(QUERY)):
        system, human = value.to_messages()
        assert system.content == f"Answer from the context.\n{context}"
        assert human.content == QUERY


class SpyReranker(GenerativeReranker):
    """Records the ``callbacks`` each call receives."""

    _seen: list[Callbacks] = PrivateAttr(default_factory=list)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> list[Document]:
        self._seen.append(callbacks)
        return super().compress_documents(documents, query, callbacks)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> list[Document]:
        self._seen.append(callbacks)
        return await super().acompress_documents(documents, query, callbacks)


class RetrieverRuns(BaseCallbackHandler):
    """Records each retriever run as run id -> (parent run id, query)."""

    def __init__(self) -> None:
        self.runs: dict[UUID, tuple[UUID | None, str]] = {}
        self.ended: set[UUID] = set()

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.runs[run_id] = (parent_run_id, query)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.ended.add(run_id)


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "chain"])
async def test_callbacks_reach_the_reranker(scorer: GenerativeScorer, base_retriever: Any, how: str) -> None:
    reranker = SpyReranker(scorer=scorer, top_n=2)
    retriever = ContextualCompressionRetriever(base_compressor=reranker, base_retriever=base_retriever)
    handler = RetrieverRuns()
    config: Any = {"callbacks": [handler]}
    if how == "invoke":
        retriever.invoke(QUERY, config=config)
    elif how == "ainvoke":
        await retriever.ainvoke(QUERY, config=config)
    else:
        await (retriever | RunnableLambda(format_docs)).ainvoke(QUERY, config=config)
    # two retriever runs: the compression retriever and, as its child, the vector store's
    [outer] = [run for run, (parent, _) in handler.runs.items() if parent not in handler.runs]
    [inner] = [run for run, (parent, _) in handler.runs.items() if parent == outer]
    assert handler.ended == {outer, inner}
    assert {query for _, query in handler.runs.values()} == {QUERY}
    # the reranker got the compression retriever's child callback manager, with the user's handler
    [callbacks] = reranker._seen
    assert isinstance(callbacks, BaseCallbackManager)
    assert handler in callbacks.handlers
    assert callbacks.parent_run_id == outer


class FixedRetriever(BaseRetriever):
    """Returns the same documents for any query, as a search over a messy corpus would."""

    documents: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        return list(self.documents)


@pytest.mark.parametrize("use_async", [False, True])
async def test_compression_retriever_scores_every_document_like_the_official_recipe(
    use_async: bool, scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nested = {"authors": ["a", "b"], "page": {"number": 3}}
    retrieved = [
        Document("The Seine flows through Paris.", id="seine", metadata={"source": "s.md", **nested}),
        Document("", id="empty", metadata={"source": "empty.md"}),
        Document("The Thames flows through London.", id="thames"),
        Document("The Seine flows through Paris.", id="seine-copy", metadata={"source": "copy.md"}),
        Document("   ", metadata={"relevance_score": 0.01}),  # no id, a stale score from an earlier reranker
        Document("Paris hosted the Olympics in 2024 {query} </s>", id="braces", metadata={"n": 1}),
    ]
    reference = recipe_scores(recipe, retrieved)
    best_first = sorted(range(len(retrieved)), key=lambda i: -reference[i])
    retriever = ContextualCompressionRetriever(
        base_compressor=GenerativeReranker(scorer=scorer, top_n=len(retrieved) + 4),
        base_retriever=FixedRetriever(documents=retrieved),
    )
    out = await retriever.ainvoke(QUERY) if use_async else retriever.invoke(QUERY)
    # All six come back (top_n above the count): the empty ones and the duplicate are neither dropped nor merged.
    assert [d.id for d in out] == [retrieved[i].id for i in best_first]
    for document, i in zip(out, best_first):
        assert document.page_content == retrieved[i].page_content
        assert document.metadata["relevance_score"] == pytest.approx(reference[i], abs=1e-5)
        assert document.metadata["genscore_truncated"] is False
        kept = {k: v for k, v in retrieved[i].metadata.items() if k != "relevance_score"}
        assert document.metadata.items() >= kept.items()
    assert retrieved[4].metadata == {"relevance_score": 0.01}  # the input is left as it was
