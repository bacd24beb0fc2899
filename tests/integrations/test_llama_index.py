"""GenerativeRerank, the LlamaIndex node postprocessor, on the tiny random Qwen3.

The weights are random, so instead of expecting relevant documents first every score and order is
checked against the official Qwen3-Reranker recipe (tests/helpers/reference_recipe.py) run on the same texts
with a copy of the model loaded by transformers, never against genscore's own output (see
tests/helpers/recipe_ranking.py).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import pickle
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import root_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import IndexNode, MetadataMode, NodeWithScore, QueryBundle, TextNode
from pydantic import Field, ValidationError

import genscore_integrations.llama_index as li
from genscore_core import GenerativeScorer, InvalidRequestError, ScorerConfig
from genscore_integrations.llama_index import RETRIEVAL_SCORE_KEY, GenerativeRerank
from tests.helpers.model_gate import ModelGate
from tests.helpers.recipe_ranking import (
    SCORING_ENTRY_POINTS,
    RecipeReference,
    assert_ranked_like_recipe,
    spied,
    threshold_between,
)
from tests.helpers.uncopyable import uncopyable_values

QUERY = "How do generative rerankers score documents?"
TEXTS = [
    "A generative reranker reads the query and document, then the probability of 'yes' is the score.",
    "Paris is the capital of France and sits on the Seine.",
    "Cross-encoders put a classification head on top of a bidirectional encoder.",
    "The recipe for pancakes needs flour, eggs, milk and a pinch of salt.",
    "Qwen3-Reranker compares the logits of the yes and no tokens at the last position.",
    "Vector stores return the nearest neighbours of the query embedding.",
]


def make_nodes() -> list[NodeWithScore]:
    """Retrieved nodes with metadata (one key hidden from embeddings) and retrieval scores."""
    nodes = []
    for i, text in enumerate(TEXTS):
        node = TextNode(
            text=text,
            id_=f"node-{i}",
            metadata={"source": f"doc{i}.md", "secret": f"internal-{i}"},
            excluded_embed_metadata_keys=["secret"],
        )
        nodes.append(NodeWithScore(node=node, score=round(0.9 - 0.1 * i, 2)))
    return nodes


@pytest.fixture
def recipe(tiny_model_dir: Path) -> RecipeReference:
    return RecipeReference(tiny_model_dir)


def recipe_scores(
    recipe: RecipeReference, nodes: Sequence[NodeWithScore], mode: MetadataMode = MetadataMode.EMBED
) -> list[float]:
    """The official recipe's score of each node's text (read with ``mode``) for QUERY, in input order."""
    return recipe.scores(QUERY, [n.node.get_content(metadata_mode=mode) for n in nodes])


async def postprocess(rerank: GenerativeRerank, nodes: list[Any], use_async: bool) -> list[NodeWithScore]:
    """``rerank``'s sync or async entry point on ``nodes`` for :data:`QUERY`."""
    if use_async:
        return await rerank.apostprocess_nodes(nodes, query_str=QUERY)
    return rerank.postprocess_nodes(nodes, query_str=QUERY)


def ids_scores(nodes: Sequence[NodeWithScore]) -> list[tuple[str, float | None]]:
    return [(n.node.node_id, n.score) for n in nodes]


def assert_reranked_like_recipe(
    got: Sequence[NodeWithScore], nodes: Sequence[NodeWithScore], scores: list[float], **options: Any
) -> None:
    """``got`` keeps what the recipe's ``scores`` of ``nodes`` keep under ``options`` (top_n,
    score_threshold), in its order, each with the recipe's score."""
    index_of = {n.node.node_id: i for i, n in enumerate(nodes)}
    assert len(index_of) == len(nodes), "give the nodes distinct ids"
    assert_ranked_like_recipe(
        [(index_of[node_id], score) for node_id, score in ids_scores(got)], scores, **options
    )


def scoring_calls(calls: dict[str, Any]) -> dict[str, list[Any]]:
    """The calls each spied scorer method received."""
    return {name: spy.mock_calls for name, spy in calls.items() if spy.mock_calls}


class Collector(BaseEventHandler):
    """Instrumentation handler that keeps every rerank event it sees."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
            self.events.append(event)


@pytest.fixture
def collector() -> Iterator[Collector]:
    handler = Collector()
    root_dispatcher.add_event_handler(handler)
    try:
        yield handler
    finally:
        root_dispatcher.event_handlers.remove(handler)


@pytest.fixture
def no_model_loading() -> Iterator[None]:
    """Fail if a test loads a model through the adapter (the real constructor is only watched)."""
    with spied(li, "GenerativeScorer") as calls:
        yield
    calls["GenerativeScorer"].assert_not_called()


# -- packaging --------------------------------------------------------------------------------------


def test_missing_llama_index_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name == "llama_index" or name.startswith("llama_index.")]:
        monkeypatch.setitem(sys.modules, name, None)  # makes "import llama_index..." fail
    monkeypatch.delitem(sys.modules, "genscore_integrations.llama_index")
    with pytest.raises(ImportError, match=re.escape('pip install "genscore[llama-index]"')) as info:
        importlib.import_module("genscore_integrations.llama_index")
    assert isinstance(info.value.__cause__, ImportError)


# -- 1. construction ----------------------------------------------------------------------------------


def test_is_a_node_postprocessor_built_from_a_ready_scorer(scorer: GenerativeScorer) -> None:
    rerank = GenerativeRerank(scorer=scorer, top_n=2)
    assert isinstance(rerank, BaseNodePostprocessor)
    assert rerank.scorer is scorer
    assert rerank.model == scorer.config.model
    assert GenerativeRerank.class_name() == "GenerativeRerank"
    assert rerank.to_dict()["class_name"] == "GenerativeRerank"
    assert (rerank.top_n, rerank.score_threshold, rerank.keep_retrieval_score, rerank.metadata_mode) == (
        2,
        None,
        False,
        MetadataMode.EMBED,
    )


def test_built_from_model_settings(
    tiny_model_dir: Any, scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    rerank = GenerativeRerank(
        str(tiny_model_dir), device="cpu", dtype="float32", max_length=512, instruction=None, top_n=3
    )
    assert isinstance(rerank.scorer, GenerativeScorer)
    assert rerank.scorer is not scorer
    assert rerank.scorer.config.model == rerank.model == str(tiny_model_dir)
    assert rerank.scorer.max_length == 512
    nodes = make_nodes()
    out = rerank.postprocess_nodes(nodes, query_str=QUERY)
    assert_reranked_like_recipe(out, nodes, recipe_scores(recipe, nodes), top_n=3)


def test_settings_and_config_are_forwarded(tiny_model_dir: Path, recipe: RecipeReference) -> None:
    from_settings = GenerativeRerank(str(tiny_model_dir), device="cpu", max_batch_size=4, top_n=None)
    assert from_settings.model == from_settings.scorer.config.model == str(tiny_model_dir)
    assert (from_settings.scorer.config.run.device, from_settings.scorer.config.run.max_batch_size) == (
        "cpu",
        4,
    )
    config = ScorerConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)
    from_config = GenerativeRerank(config=config, top_n=None)
    assert from_config.scorer.config == config
    assert from_config.model == str(tiny_model_dir)
    nodes = make_nodes()
    scores = recipe_scores(recipe, nodes)
    for rerank in (from_settings, from_config):
        assert_reranked_like_recipe(rerank.postprocess_nodes(nodes, query_str=QUERY), nodes, scores)


@pytest.mark.usefixtures("no_model_loading")
def test_scorer_and_model_settings_conflict(scorer: GenerativeScorer) -> None:
    with pytest.raises(TypeError, match=r"either a ready scorer= or the settings.*max_length differ"):
        GenerativeRerank(scorer=scorer, max_length=128)
    with pytest.raises(TypeError, match=r"either a ready scorer= or the settings.*config differ"):
        GenerativeRerank(scorer=scorer, config=ScorerConfig())
    with pytest.raises(TypeError, match="model differ"):
        GenerativeRerank("another/model", scorer=scorer)
    # Settings that agree with the scorer's are no conflict.
    assert GenerativeRerank(scorer=scorer, device="cpu", max_length=512).scorer is scorer
    # The scorer's own model name is no conflict (this is how from_dict(..., scorer=...) round-trips).
    data = GenerativeRerank(scorer=scorer, top_n=2).to_dict()
    again = GenerativeRerank.from_dict(data, scorer=scorer)
    assert again.scorer is scorer and again.top_n == 2


@pytest.mark.usefixtures("no_model_loading")
def test_unknown_arguments_and_bad_values_are_rejected_before_loading(scorer: GenerativeScorer) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*'topn'"):
        GenerativeRerank(scorer=scorer, topn=3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*'topn'"):
        GenerativeRerank("some/model", topn=3)
    with pytest.raises(TypeError, match=r"must be a genscore_core\.GenerativeScorer"):
        GenerativeRerank(scorer="not a scorer")  # type: ignore[arg-type]
    for bad in ({"top_n": 0}, {"top_n": True}, {"top_n": 2.5}, {"score_threshold": 1.5}):
        with pytest.raises(InvalidRequestError) as raised:
            GenerativeRerank("./no-such-model-folder", **bad)
        assert raised.value.param == next(iter(bad))
    with pytest.raises(ValidationError):
        GenerativeRerank(scorer=scorer, metadata_mode="everything")


# -- 1. reranking -------------------------------------------------------------------------------------


def test_scores_and_order_match_the_official_recipe(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nodes = make_nodes()
    out = GenerativeRerank(scorer=scorer, top_n=None).postprocess_nodes(nodes, query_str=QUERY)
    assert len(out) == len(nodes)  # top_n=None keeps all (the default keeps 3)
    assert_reranked_like_recipe(out, nodes, recipe_scores(recipe, nodes))
    assert all(isinstance(n.score, float) and 0.0 <= n.score <= 1.0 for n in out)


async def test_nodes_from_a_generator_are_all_ranked(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nodes = make_nodes()
    scores = recipe_scores(recipe, nodes)
    rerank = GenerativeRerank(scorer=scorer, top_n=None)
    for out in (
        rerank.postprocess_nodes((n for n in nodes), query_str=QUERY),  # type: ignore[arg-type]
        await rerank.apostprocess_nodes((n for n in nodes), query_str=QUERY),  # type: ignore[arg-type]
    ):
        assert_reranked_like_recipe(out, nodes, scores)


def test_top_n_and_score_threshold(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    nodes = make_nodes()
    scores = recipe_scores(recipe, nodes)
    threshold = threshold_between(scores, kept=3)  # between two scores: exactly 3 pass
    for options in ({"top_n": 2}, {"score_threshold": threshold}, {"top_n": 1, "score_threshold": threshold}):
        out = GenerativeRerank(scorer=scorer, **{"top_n": None, **options}).postprocess_nodes(
            nodes, query_str=QUERY
        )
        assert_reranked_like_recipe(out, nodes, scores, **options)
    out = GenerativeRerank(scorer=scorer, top_n=None, score_threshold=threshold).postprocess_nodes(
        nodes, query_str=QUERY
    )
    assert len(out) == 3
    assert all(n.score is not None and n.score >= threshold for n in out)
    # A score equal to the threshold passes. Only the comparison is under test here, so the threshold
    # is the third score as the postprocessor itself reported it (the recipe's differs by float noise).
    third = out[2].score
    assert third is not None
    at_third = GenerativeRerank(scorer=scorer, top_n=None, score_threshold=third).postprocess_nodes(
        nodes, query_str=QUERY
    )
    assert ids_scores(at_third) == ids_scores(out)


async def test_numpy_options_are_taken_as_the_scorer_takes_them(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    import numpy as np

    nodes = make_nodes()
    scores = recipe_scores(recipe, nodes)
    threshold = threshold_between(scores, kept=3)  # strictly between two scores: exactly 3 pass
    rerank = GenerativeRerank(scorer=scorer, top_n=np.int64(2), score_threshold=np.float32(threshold))
    assert (type(rerank.top_n), type(rerank.score_threshold)) == (int, float)
    for out in (
        rerank.postprocess_nodes(nodes, query_str=QUERY),
        await rerank.apostprocess_nodes(nodes, query_str=QUERY),
    ):
        assert_reranked_like_recipe(out, nodes, scores, top_n=2, score_threshold=float(np.float32(threshold)))
    assert rerank.to_dict()["top_n"] == 2  # the saved form stays plain JSON
    with pytest.raises(InvalidRequestError) as raised:
        GenerativeRerank(scorer=scorer, top_n=np.int64(0))
    assert raised.value.param == "top_n"


def test_a_scorer_given_as_the_model_is_refused_saying_scorer(scorer: GenerativeScorer) -> None:
    # GenerativeRerank(scorer) reads naturally, but the first argument is the model name.
    message = r"got a GenerativeScorer as its model; pass a ready scorer as scorer="
    with spied(li, "GenerativeScorer") as calls:
        with pytest.raises(TypeError, match=message):
            GenerativeRerank(scorer)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=message):
            GenerativeRerank(model=scorer, top_n=2)  # type: ignore[arg-type]
    calls["GenerativeScorer"].assert_not_called()  # refused before any scorer is built


async def test_a_window_left_by_an_earlier_reranking_is_removed(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    # Reranked before by a chunking scorer: its window describes a score this reranking replaces.
    earlier = {"source": "a.md", "genscore_window": [0, 12]}
    seen = TextNode(text=TEXTS[0], id_="seen", metadata=dict(earlier))
    nodes = [NodeWithScore(node=seen, score=0.9), NodeWithScore(node=TextNode(text=TEXTS[1], id_="new"))]
    # The recipe scores the text the adapter reads (metadata included, as the default mode embeds it).
    scores = recipe_scores(recipe, nodes)
    rerank = GenerativeRerank(scorer=scorer, top_n=None)  # truncates: reports no window
    for out in (
        rerank.postprocess_nodes(nodes, query_str=QUERY),
        await rerank.apostprocess_nodes(nodes, query_str=QUERY),
    ):
        assert_reranked_like_recipe(out, nodes, scores)
        assert all("genscore_window" not in n.node.metadata for n in out)
        assert {n.node.node_id: n.node.metadata.get("source") for n in out} == {"seen": "a.md", "new": None}
    assert seen.metadata == earlier  # the input is left as it was


def test_query_bundle_is_accepted(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    nodes = make_nodes()
    out = GenerativeRerank(scorer=scorer, top_n=3).postprocess_nodes(nodes, QueryBundle(QUERY))
    assert_reranked_like_recipe(out, nodes, recipe_scores(recipe, nodes), top_n=3)


@pytest.mark.parametrize("mode", list(MetadataMode))
def test_metadata_mode_chooses_the_scored_text(
    mode: MetadataMode, scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nodes = make_nodes()
    rerank = GenerativeRerank(scorer=scorer, top_n=None, metadata_mode=mode)
    with spied(scorer, "rerank") as calls:
        out = rerank.postprocess_nodes(nodes, query_str=QUERY)
    [call] = calls["rerank"].call_args_list
    assert call.args == (QUERY, [n.node.get_content(metadata_mode=mode) for n in nodes])
    # And the scores are those of that text.
    assert_reranked_like_recipe(out, nodes, recipe_scores(recipe, nodes, mode))


def test_default_mode_is_embed_which_hides_excluded_metadata(scorer: GenerativeScorer) -> None:
    with spied(scorer, "rerank") as calls:
        GenerativeRerank(scorer=scorer).postprocess_nodes(make_nodes(), query_str=QUERY)
    documents = calls["rerank"].call_args.args[1]
    assert "source: doc0.md" in documents[0] and "internal-0" not in documents[0]


def test_keep_retrieval_score(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    nodes = make_nodes()
    retrieval = {n.node.node_id: n.score for n in nodes}
    out = GenerativeRerank(scorer=scorer, top_n=None, keep_retrieval_score=True).postprocess_nodes(
        nodes, query_str=QUERY
    )
    assert_reranked_like_recipe(out, nodes, recipe_scores(recipe, nodes))
    for node in out:
        assert node.node.metadata[RETRIEVAL_SCORE_KEY] == retrieval[node.node.node_id]
        # Bookkeeping stays out of what embedders and the LLM read.
        assert RETRIEVAL_SCORE_KEY not in node.node.get_content(metadata_mode=MetadataMode.LLM)
        assert RETRIEVAL_SCORE_KEY not in node.node.get_content(metadata_mode=MetadataMode.EMBED)
    plain = GenerativeRerank(scorer=scorer).postprocess_nodes(nodes, query_str=QUERY)
    assert all(RETRIEVAL_SCORE_KEY not in n.node.metadata for n in plain)


async def test_inputs_are_never_mutated(scorer: GenerativeScorer) -> None:
    nodes = make_nodes()
    before = copy.deepcopy(nodes)
    rerank = GenerativeRerank(scorer=scorer, top_n=4, keep_retrieval_score=True)
    outputs = [
        rerank.postprocess_nodes(nodes, query_str=QUERY),
        await rerank.apostprocess_nodes(nodes, query_str=QUERY),
    ]
    assert [n.model_dump() for n in nodes] == [n.model_dump() for n in before]
    inputs = {id(n) for n in nodes} | {id(n.node) for n in nodes}
    for out in outputs:
        assert all(id(n) not in inputs and id(n.node) not in inputs for n in out)
        # Ids, text and metadata survive on the copies; editing a copy leaves the input alone.
        by_id = {n.node.node_id: n for n in nodes}
        for n in out:
            source = by_id[n.node.node_id].node
            assert n.node.get_content() == source.get_content()
            assert {k: v for k, v in n.node.metadata.items() if k != RETRIEVAL_SCORE_KEY} == source.metadata
            n.node.metadata["edited"] = True
    assert [n.model_dump() for n in nodes] == [n.model_dump() for n in before]


async def test_node_objects_and_metadata_values_are_shared_not_copied(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    # An IndexNode's obj is what the node points to (here a whole index): LlamaIndex's own rerankers
    # return it as it is, and so must this one. Metadata values that deepcopy refuses (a tensor that is
    # not a graph leaf, a very deep tree) must not cost the caller the scored node either.
    index = VectorStoreIndex([TextNode(text=t) for t in TEXTS], embed_model=MockEmbedding(embed_dim=8))
    not_a_leaf, deep = uncopyable_values()
    nodes = [
        NodeWithScore(node=IndexNode(text=TEXTS[0], id_="index", index_id="i", obj=index), score=0.3),
        NodeWithScore(node=TextNode(text=TEXTS[1], id_="tensor", metadata={"emb": not_a_leaf}), score=0.2),
        NodeWithScore(
            node=TextNode(
                text=TEXTS[2],
                id_="deep",
                metadata={"tree": deep},
                excluded_embed_metadata_keys=["tree"],
                excluded_llm_metadata_keys=["tree"],
            ),
            score=0.1,
        ),
    ]
    scores = recipe_scores(recipe, nodes)
    rerank = GenerativeRerank(scorer=scorer, top_n=None, keep_retrieval_score=True)
    for out in (
        rerank.postprocess_nodes(nodes, query_str=QUERY),
        await rerank.apostprocess_nodes(nodes, query_str=QUERY),
    ):
        assert_reranked_like_recipe(out, nodes, scores)
        by_id = {n.node.node_id: n.node for n in out}
        assert isinstance(by_id["index"], IndexNode) and by_id["index"].obj is index
        assert by_id["tensor"].metadata["emb"] is not_a_leaf
        assert by_id["deep"].metadata["tree"] is deep
        for n in nodes:  # the inputs' own dict and lists were left alone
            assert n.node is not by_id[n.node.node_id]
            assert RETRIEVAL_SCORE_KEY not in n.node.metadata
            assert RETRIEVAL_SCORE_KEY not in n.node.excluded_llm_metadata_keys


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_item_that_is_not_a_node_with_score_is_named(
    use_async: bool, scorer: GenerativeScorer, collector: Collector
) -> None:
    nodes = make_nodes()
    bad: list[Any] = [nodes[0], nodes[1].node, nodes[2]]  # a bare TextNode where a NodeWithScore goes
    rerank = GenerativeRerank(scorer=scorer, top_n=None)
    with pytest.raises(
        InvalidRequestError, match=r"nodes\[1\] must be a .*NodeWithScore, got TextNode.*wrap"
    ) as raised:
        await postprocess(rerank, bad, use_async)
    assert (raised.value.param, raised.value.index) == ("nodes", 1)
    assert collector.events == []  # raised before the start event, so before any scoring
    with pytest.raises(InvalidRequestError, match=r"nodes\[0\] must be a .*NodeWithScore, got str$"):
        rerank.postprocess_nodes(["raw text"], query_str=QUERY)  # type: ignore[list-item]


async def test_empty_input_gives_empty_output(scorer: GenerativeScorer, collector: Collector) -> None:
    rerank = GenerativeRerank(scorer=scorer, top_n=3)
    with spied(scorer, *SCORING_ENTRY_POINTS) as calls:
        assert rerank.postprocess_nodes([], query_str=QUERY) == []
        assert await rerank.apostprocess_nodes([], query_str=QUERY) == []
    assert scoring_calls(calls) == {} and collector.events == []


async def test_missing_query_is_a_clear_error(scorer: GenerativeScorer, collector: Collector) -> None:
    cb = LlamaDebugHandler()
    rerank = GenerativeRerank(scorer=scorer, callback_manager=CallbackManager([cb]))
    with spied(scorer, *SCORING_ENTRY_POINTS) as calls:
        for nodes in (make_nodes(), []):
            with pytest.raises(InvalidRequestError, match=r"needs the query.*query_str=") as info:
                rerank.postprocess_nodes(nodes)
            assert isinstance(info.value, ValueError) and info.value.param == "query"
            with pytest.raises(InvalidRequestError, match="needs the query"):
                await rerank.apostprocess_nodes(nodes)
    # Checked before anything happens: no scoring, no events of either kind.
    assert scoring_calls(calls) == {} and collector.events == []
    assert cb.get_event_pairs(CBEventType.RERANKING) == []


async def test_an_image_query_without_text_is_a_clear_error(
    scorer: GenerativeScorer, collector: Collector
) -> None:
    rerank = GenerativeRerank(scorer=scorer)
    image_query = QueryBundle(query_str="", image_path="/photos/eiffel.jpg")
    with spied(scorer, *SCORING_ENTRY_POINTS) as calls:
        with pytest.raises(
            InvalidRequestError, match=r"image query \(image_path='/photos/eiffel.jpg'\) with no text"
        ):
            rerank.postprocess_nodes(make_nodes(), image_query)
        with pytest.raises(InvalidRequestError, match="image query") as info:
            await rerank.apostprocess_nodes(make_nodes(), image_query)
    assert info.value.param == "query"
    assert scoring_calls(calls) == {} and collector.events == []


@pytest.mark.parametrize(
    "bundle",
    [
        QueryBundle(query_str=None),  # type: ignore[arg-type]
        QueryBundle(query_str=None, image_path="/photos/eiffel.jpg"),  # type: ignore[arg-type]
        QueryBundle(query_str=["Which", "river"]),  # type: ignore[arg-type]
    ],
    ids=["none", "none-with-image", "list"],
)
async def test_a_query_bundle_without_a_text_query_is_refused_before_any_event(
    bundle: QueryBundle, scorer: GenerativeScorer, collector: Collector
) -> None:
    # QueryBundle is a dataclass and checks nothing: None or a list reached the events (a start without
    # a query), and with an image_path failed as a bare AttributeError ('NoneType' ... 'strip').
    cb = LlamaDebugHandler()
    rerank = GenerativeRerank(scorer=scorer, callback_manager=CallbackManager([cb]))
    with spied(scorer, *SCORING_ENTRY_POINTS) as calls:
        with pytest.raises(
            InvalidRequestError, match=r"query_str must be a string, got (NoneType|list)"
        ) as info:
            rerank.postprocess_nodes(make_nodes(), bundle)
        assert info.value.param == "query"
        with pytest.raises(InvalidRequestError, match="query_str must be a string"):
            await rerank.apostprocess_nodes(make_nodes(), bundle)
    assert scoring_calls(calls) == {} and collector.events == []
    assert cb.get_event_pairs(CBEventType.RERANKING) == []


# -- 2. events ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_instrumentation_events(
    use_async: bool, scorer: GenerativeScorer, collector: Collector
) -> None:
    nodes = make_nodes()
    rerank = GenerativeRerank(scorer=scorer, top_n=2)
    out = await postprocess(rerank, nodes, use_async)
    start, end = collector.events
    assert isinstance(start, ReRankStartEvent) and isinstance(end, ReRankEndEvent)
    assert isinstance(start.query, QueryBundle) and start.query.query_str == QUERY
    assert ids_scores(start.nodes) == ids_scores(nodes)
    assert start.top_n == 2 and start.model_name == scorer.config.model
    assert ids_scores(end.nodes) == ids_scores(out)
    # Both inside the postprocessor's own span (the async path is decorated, the sync one by the mixin).
    method = "_apostprocess_nodes" if use_async else "_postprocess_nodes"
    assert start.span_id is not None and start.span_id.startswith(f"GenerativeRerank.{method}-")
    assert end.span_id == start.span_id


def test_start_event_reports_all_nodes_kept_when_top_n_is_none(
    scorer: GenerativeScorer, collector: Collector
) -> None:
    GenerativeRerank(scorer=scorer, top_n=None).postprocess_nodes(make_nodes(), query_str=QUERY)
    start, _ = collector.events
    assert isinstance(start, ReRankStartEvent) and start.top_n == len(TEXTS)


@pytest.mark.parametrize("use_async", [False, True])
async def test_legacy_reranking_callback_event(use_async: bool, scorer: GenerativeScorer) -> None:
    handler = LlamaDebugHandler()
    rerank = GenerativeRerank(scorer=scorer, top_n=3, callback_manager=CallbackManager([handler]))
    nodes = make_nodes()
    out = await postprocess(rerank, nodes, use_async)
    [(start, end)] = handler.get_event_pairs(CBEventType.RERANKING)
    assert start.payload is not None and end.payload is not None
    assert start.payload[EventPayload.QUERY_STR] == QUERY
    assert start.payload[EventPayload.MODEL_NAME] == scorer.config.model
    assert start.payload[EventPayload.TOP_K] == 3
    assert ids_scores(start.payload[EventPayload.NODES]) == ids_scores(nodes)
    assert ids_scores(end.payload[EventPayload.NODES]) == ids_scores(out)


class LockedHandler(LlamaDebugHandler):
    """A callback handler that cannot be pickled, as tracing handlers that hold a lock or a client."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_a_callback_manager_that_does_not_pickle_is_left_out_of_the_pickle(
    tiny_model_dir: Path, recipe: RecipeReference, caplog: pytest.LogCaptureFixture
) -> None:
    # Query engines set their callback manager on every postprocessor; LlamaIndex's own postprocessors
    # pickle without one that does not pickle (logging a warning), so a query engine traced by such a
    # handler still goes to a Ray or multiprocessing worker. GenerativeRerank raised TypeError instead.
    handler = LockedHandler()
    rerank = GenerativeRerank(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        top_n=None,
        callback_manager=CallbackManager([handler]),
    )
    with caplog.at_level("WARNING"):
        reloaded = pickle.loads(pickle.dumps(rerank))
    assert "callback_manager" in caplog.text
    assert reloaded.callback_manager.handlers == []
    assert rerank.callback_manager.handlers == [handler]  # the original keeps its handler
    nodes = make_nodes()
    assert_reranked_like_recipe(
        reloaded.postprocess_nodes(nodes, query_str=QUERY), nodes, recipe_scores(recipe, nodes)
    )


# -- 3. async -----------------------------------------------------------------------------------------


async def test_async_path_uses_the_engines_async_method(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nodes = make_nodes()
    scores = recipe_scores(recipe, nodes)
    threshold = threshold_between(scores, kept=2)
    rerank = GenerativeRerank(scorer=scorer, top_n=1, score_threshold=threshold)
    with spied(scorer, "rerank", "arerank") as calls:
        out = await rerank.apostprocess_nodes(nodes, query_str=QUERY)
    calls["rerank"].assert_not_called()
    texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
    calls["arerank"].assert_awaited_once_with(QUERY, texts, top_n=1, score_threshold=threshold)
    assert_reranked_like_recipe(out, nodes, scores, top_n=1, score_threshold=threshold)


async def test_async_does_not_block_the_event_loop(scorer: GenerativeScorer) -> None:
    nodes = [
        NodeWithScore(node=TextNode(text=f"{TEXTS[i % len(TEXTS)]} Passage {i}. " * 3, id_=f"n{i}"))
        for i in range(24)
    ]
    rerank = GenerativeRerank(scorer=scorer, top_n=None)
    with ModelGate(scorer) as gate:
        out, _ = await asyncio.wait_for(
            asyncio.gather(rerank.apostprocess_nodes(nodes, query_str=QUERY), gate.open_once_entered()),
            timeout=120,
        )
    assert gate.thread_ids and threading.get_ident() not in gate.thread_ids
    assert len(out) == len(nodes)


# -- 4. query engines, and one scorer shared with the LangChain adapter ---------------------------------


def make_query_engine(rerank: GenerativeRerank) -> Any:
    index = VectorStoreIndex([n.node for n in make_nodes()], embed_model=MockEmbedding(embed_dim=8))
    return index.as_query_engine(llm=MockLLM(), similarity_top_k=len(TEXTS), node_postprocessors=[rerank])


@pytest.mark.parametrize("use_async", [False, True])
async def test_query_engine_postprocessing(
    use_async: bool,
    scorer: GenerativeScorer,
    recipe: RecipeReference,
    collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = LlamaDebugHandler()
    monkeypatch.setattr(Settings, "callback_manager", CallbackManager([handler]))
    engine = make_query_engine(GenerativeRerank(scorer=scorer, top_n=3))
    response = await engine.aquery(QUERY) if use_async else engine.query(QUERY)
    nodes = make_nodes()  # what the index holds
    assert_reranked_like_recipe(response.source_nodes, nodes, recipe_scores(recipe, nodes), top_n=3)
    # The mock LLM echoes its prompt: the context is the reranked nodes, best first.
    positions = [response.response.index(n.node.get_content()) for n in response.source_nodes]
    assert positions == sorted(positions)
    assert [type(e) for e in collector.events] == [ReRankStartEvent, ReRankEndEvent]
    assert len(handler.get_event_pairs(CBEventType.RERANKING)) == 1


async def test_one_scorer_serves_both_frameworks_at_once(
    scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    from langchain_core.documents import Document

    from genscore_integrations.langchain import GenerativeReranker

    nodes = make_nodes()
    documents = [Document(page_content=n.node.get_content(metadata_mode=MetadataMode.EMBED)) for n in nodes]
    llama = GenerativeRerank(scorer=scorer, top_n=None)
    chain = GenerativeReranker(scorer=scorer, top_n=None)
    assert llama.scorer is chain.scorer is scorer
    scores = recipe_scores(recipe, nodes)
    index_of_text = {d.page_content: i for i, d in enumerate(documents)}
    assert len(index_of_text) == len(documents)

    def check_llama(out: Sequence[NodeWithScore]) -> None:
        assert_reranked_like_recipe(out, nodes, scores)

    def check_chain(out: Sequence[Document]) -> None:
        got = [(index_of_text[d.page_content], d.metadata["relevance_score"]) for d in out]
        assert_ranked_like_recipe(got, scores)

    # From threads: both adapters, several calls each, at the same time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        llama_runs = [pool.submit(llama.postprocess_nodes, nodes, None, QUERY) for _ in range(2)]
        chain_runs = [pool.submit(chain.compress_documents, documents, QUERY) for _ in range(2)]
        for llama_run in llama_runs:
            check_llama(llama_run.result())
        for chain_run in chain_runs:
            check_chain(chain_run.result())
    # From one event loop: both async paths interleaved.
    llama_out, chain_out = await asyncio.gather(
        llama.apostprocess_nodes(nodes, query_str=QUERY), chain.acompress_documents(documents, QUERY)
    )
    check_llama(llama_out)
    check_chain(chain_out)


def test_threads_share_one_postprocessor(scorer: GenerativeScorer, recipe: RecipeReference) -> None:
    nodes = make_nodes()
    rerank = GenerativeRerank(scorer=scorer, top_n=2)
    scores = recipe_scores(recipe, nodes)
    with ThreadPoolExecutor(max_workers=3) as pool:
        for out in pool.map(lambda _: rerank.postprocess_nodes(nodes, query_str=QUERY), range(3)):
            assert_reranked_like_recipe(out, nodes, scores, top_n=2)


# -- 5. node classes: every node with text is scored on it; media without text is refused ----------------


def _mixed_nodes() -> list[NodeWithScore]:
    """One node of each class a retriever returns, no metadata (the scored text is the node's text),
    carrying retrieval scores (one None) and one duplicate text."""
    from llama_index.core.schema import Document as LlamaDocument
    from llama_index.core.schema import ImageNode, MediaResource, Node

    return [
        NodeWithScore(node=TextNode(text=TEXTS[1], id_="text"), score=0.9),
        NodeWithScore(node=LlamaDocument(text=TEXTS[0], id_="document"), score=0.8),
        NodeWithScore(node=IndexNode(text=TEXTS[4], index_id="sub-index", id_="index"), score=None),
        NodeWithScore(node=ImageNode(text=TEXTS[3], image_url="http://x/cat.png", id_="image"), score=0.7),
        NodeWithScore(node=Node(text_resource=MediaResource(text=TEXTS[5]), id_="node"), score=0.6),
        NodeWithScore(node=TextNode(text=TEXTS[1], id_="text-again"), score=0.5),
    ]


@pytest.mark.parametrize("use_async", [False, True])
async def test_every_node_class_with_text_is_scored_like_the_official_recipe(
    use_async: bool, scorer: GenerativeScorer, recipe: RecipeReference
) -> None:
    nodes = _mixed_nodes()
    texts = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
    reference = recipe.scores(QUERY, texts)
    best_first = sorted(range(len(nodes)), key=lambda i: -reference[i])
    rerank = GenerativeRerank(scorer=scorer, top_n=len(nodes) + 5, keep_retrieval_score=True)
    query = QueryBundle(QUERY)
    out = (
        await rerank.apostprocess_nodes(nodes, query) if use_async else rerank.postprocess_nodes(nodes, query)
    )
    # Nothing dropped (top_n above the count), nothing merged (the duplicate text stays two nodes).
    assert [n.node.node_id for n in out] == [nodes[i].node.node_id for i in best_first]
    for got, i in zip(out, best_first):
        assert type(got.node) is type(nodes[i].node)
        assert got.score == pytest.approx(reference[i], abs=1e-5)
        assert got.node.metadata[RETRIEVAL_SCORE_KEY] == nodes[i].score


@pytest.mark.parametrize("use_async", [False, True])
async def test_media_without_text_is_refused_by_name_before_scoring(
    use_async: bool, scorer: GenerativeScorer, collector: Collector
) -> None:
    from llama_index.core.schema import ImageNode, MediaResource, Node

    rerank = GenerativeRerank(scorer=scorer, top_n=3)
    media = [
        (ImageNode(image_url="http://x/cat.png"), "ImageNode holding an image"),
        (ImageNode(image="aGVsbG8=", metadata={"file_name": "cat.png"}), "ImageNode holding an image"),
        (Node(image_resource=MediaResource(url="http://x/cat.png")), "Node holding an image"),
        (Node(audio_resource=MediaResource(url="http://x/talk.mp3")), "Node holding audio"),
        (Node(video_resource=MediaResource(url="http://x/clip.mp4")), "Node holding a video"),
    ]
    for node, named in media:
        nodes = [*_mixed_nodes()[:2], NodeWithScore(node=node, score=0.4)]
        with pytest.raises(InvalidRequestError, match=rf"nodes\[2\] is a {named} and no text") as raised:
            await postprocess(rerank, nodes, use_async)
        assert (raised.value.param, raised.value.index) == ("nodes", 2)
    assert collector.events == []  # refused before the start event, so before any scoring
