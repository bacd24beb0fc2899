"""LlamaIndex node postprocessor that reranks retrieved nodes with a :class:`GenerativeScorer`.

The adapter is thin: it reads each node's text, asks the engine to rerank, and returns copies of the
nodes with ``score`` set to the generative score. All scoring happens in :mod:`genscore_core`.

Example:
    >>> from genscore_integrations.llama_index import GenerativeRerank
    >>> rerank = GenerativeRerank("Qwen/Qwen3-Reranker-0.6B", top_n=3)  # doctest: +SKIP
    >>> engine = index.as_query_engine(node_postprocessors=[rerank])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

try:
    from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, Field, PrivateAttr
    from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
except ImportError as exc:
    raise ImportError(
        "genscore_integrations.llama_index needs llama-index-core; install it with: "
        'pip install "genscore[llama-index]"'
    ) from exc

from genscore_core import (
    DEFAULT_MODEL,
    GenerativeScorer,
    InvalidRequestError,
    RankedResults,
    ScorerConfig,
    check_rank_options,
)
from genscore_integrations._scorer_args import (
    check_model,
    check_names,
    plain_rank_options,
    scorer_for,
    threshold_mode,
)

__all__ = ["RETRIEVAL_SCORE_KEY", "WINDOW_KEY", "GenerativeRerank"]

RETRIEVAL_SCORE_KEY = "retrieval_score"
"""Metadata key that holds a node's retrieval score when ``keep_retrieval_score`` is on."""
WINDOW_KEY = "genscore_window"
"""Metadata key of ``[start, end)``, the character span of the window whose score was reported, present when
the scorer chunks long documents (``long_documents="chunk"``; hidden from embedders and LLMs)."""

dispatcher = get_dispatcher(__name__)
logger = logging.getLogger(__name__)

# The constructor's own parameters; every other keyword must be a scorer setting.
_OWN_PARAMETERS = (
    "model",
    "scorer",
    "config",
    "top_n",
    "score_threshold",
    "keep_retrieval_score",
    "metadata_mode",
    "callback_manager",
)


class GenerativeRerank(BaseNodePostprocessor):
    """Rerank nodes by a causal LM's probability that a document answers the query (Qwen3-Reranker style).

    Build it from a loaded :class:`~genscore_core.GenerativeScorer` (which can serve several adapters at
    once) or from model settings, which load one. The returned nodes are copies, best first, with
    ``score`` set to the generative score in [0, 1]; the input nodes are never changed.

    Example:
        >>> from genscore_core import GenerativeScorer
        >>> scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B")  # doctest: +SKIP
        >>> rerank = GenerativeRerank(scorer=scorer, top_n=3, score_threshold=0.2)  # doctest: +SKIP
        >>> engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])  # doctest: +SKIP
        >>> rerank.postprocess_nodes(nodes, query_str="what is genscore?")  # doctest: +SKIP

    Args:
        model: Hub id or local folder of the model to load; recorded from the scorer when ``scorer`` is
            given.
        scorer: A ready scorer to use instead of loading one.
        config: A ready :class:`~genscore_core.ScorerConfig` to load a scorer from.
        top_n: Keep at most this many nodes (default 3, as the LangChain adapter); ``None`` keeps all.
        score_threshold: Drop nodes whose generative score is below this value (in [0, 1]; with
            ``score_mode="logit"``, a logit: any finite number).
        keep_retrieval_score: Store each node's incoming score in ``metadata["retrieval_score"]``.
        metadata_mode: Which metadata goes into the text that is scored (default: what embeddings see).
        callback_manager: Legacy callback manager; query engines set their own.
        **settings: Fields of :class:`~genscore_core.ScorerConfig` (``device``, ``dtype``,
            ``max_length``, ``instruction``, ...) used to load the scorer. Unknown names are rejected.

    Raises:
        TypeError: On unknown settings, a ``scorer`` that is not one, or a ``scorer`` combined with
            settings that differ from its own (settings that agree are accepted: ``from_dict(data,
            scorer=scorer)`` reloads onto a shared scorer).
        InvalidRequestError: On a bad ``top_n`` or ``score_threshold``.

    ``to_dict()`` records the options and every setting of the scorer, so ``from_dict`` rebuilds a
    postprocessor that scores the same.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Hub id or local folder of the scoring model.")
    """Hub id or local folder of the scoring model (what ``to_dict`` records)."""
    top_n: Annotated[int, Field(ge=1, strict=True)] | None = Field(
        default=3, description="Number of nodes to keep; None keeps all."
    )
    """Number of nodes to keep, best first (3, as GenerativeReranker's); ``None`` keeps all."""
    score_threshold: float | None = Field(
        default=None, allow_inf_nan=False, description="Nodes scoring below this are dropped."
    )
    """Nodes whose generative score is below this are dropped; ``None`` keeps all. A score of the
    scorer's mode: within [0, 1], or any finite logit with ``score_mode="logit"``."""
    keep_retrieval_score: bool = Field(
        default=False, description="Whether to keep the retrieval score in metadata."
    )
    """Store the incoming (retrieval) score in ``metadata["retrieval_score"]`` of the returned nodes."""
    metadata_mode: MetadataMode = Field(
        default=MetadataMode.EMBED, description="Metadata mode of the node text that is scored."
    )
    """Metadata mode used to read each node's text (``node.get_content(metadata_mode=...)``)."""

    _scorer: GenerativeScorer = PrivateAttr()

    def __init__(
        self,
        model: str | None = None,
        *,
        scorer: GenerativeScorer | None = None,
        config: ScorerConfig | None = None,
        top_n: int | None = 3,
        score_threshold: float | None = None,
        keep_retrieval_score: bool = False,
        metadata_mode: MetadataMode | str = MetadataMode.EMBED,
        callback_manager: CallbackManager | None = None,
        **settings: Any,
    ) -> None:
        # Bad options fail before anything is loaded, with the same errors as GenerativeReranker's;
        # NumPy numbers, which rerank takes, become Python's for the strict fields.
        check_model("GenerativeRerank", model)
        options = plain_rank_options(
            {
                "top_n": top_n,
                "score_threshold": score_threshold,
                "scorer": scorer,
                "config": config,
                **settings,
            }
        )
        top_n, score_threshold = options["top_n"], options["score_threshold"]
        check_names("GenerativeRerank", settings, _OWN_PARAMETERS)
        if scorer is not None:
            scorer_settings = dict(settings)
            if model is not None:
                scorer_settings["model"] = model
            if config is not None:
                scorer_settings["config"] = config
            scorer = scorer_for("GenerativeRerank", scorer, scorer_settings)
            name = _model_name(scorer)
        else:
            name = model or (config.model if config is not None else DEFAULT_MODEL)
        fields: dict[str, Any] = {
            "model": name,
            "top_n": top_n,
            "score_threshold": score_threshold,
            "keep_retrieval_score": keep_retrieval_score,
            "metadata_mode": metadata_mode,
        }
        if callback_manager is not None:
            fields["callback_manager"] = callback_manager
        super().__init__(**fields)  # validates the cheap fields before a model is loaded
        if scorer is None:
            scorer = GenerativeScorer(model, config=config, **settings)
            # Settings that did not tell the mode: the threshold is a score of the one loaded.
            check_rank_options(None, score_threshold, score_mode=threshold_mode(scorer, {}))
        self._scorer = scorer

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The options and every setting of the scorer (not the weights): ``from_dict`` rebuilds a
        postprocessor that scores the same, loading the model again unless ``scorer=`` is passed.

        A ``server_api_key`` is not written; pass it to ``from_dict`` again.
        """
        data = super().to_dict(**kwargs)
        settings = self._scorer.settings() if callable(getattr(self._scorer, "settings", None)) else {}
        settings.pop("model", None)  # the field already holds the scorer's model name
        return {**settings, **data}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options and the scorer, which pickles as its settings (the API key too): unpickling
        loads a scorer that scores the same, once for all the adapters of the pickle that shared one."""
        # pydantic's state, not LlamaIndex's: that one test-pickles every attribute, the model included.
        state: dict[str, Any] = BaseModel.__getstate__(self)
        fields = dict(state["__dict__"])
        # As LlamaIndex's own components do: a field that does not pickle (a callback manager whose
        # handler holds a lock or a client; query engines set theirs on every postprocessor) is left
        # out, with a warning, and the unpickled copy gets the default.
        for key, value in list(fields.items()):
            if not _pickles(value):
                logger.warning("GenerativeRerank pickled without its %s, which does not pickle", key)
                del fields[key]
        state["__dict__"] = fields
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild from the pickled options and the scorer pickle has loaded (an error loading it, the
        model folder missing on this machine, say, reached the caller then). LlamaIndex's
        ``__setstate__`` would fall back to pydantic's and keep a callback manager left out."""
        scorer = (state.get("__pydantic_private__") or {})["_scorer"]
        GenerativeRerank.__init__(self, scorer=scorer, **state["__dict__"])

    @classmethod
    def class_name(cls) -> str:
        return "GenerativeRerank"

    @property
    def scorer(self) -> GenerativeScorer:
        """The scorer this postprocessor ranks with (shareable with other adapters)."""
        return self._scorer

    # -- LlamaIndex hooks ---------------------------------------------------------------------------

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        """Rerank ``nodes`` for the query (called by ``postprocess_nodes``).

        Args:
            nodes: The retrieved nodes; their text is read with ``metadata_mode``.
            query_bundle: The query; required.

        Returns:
            Copies of at most ``top_n`` nodes scoring at least ``score_threshold``, best first, with
            ``score`` set to the generative score.

        Raises:
            InvalidRequestError: No query was given, a ``query_str`` that is not a string, or an image
                query with no text (``param`` ``"query"``); an item is not a ``NodeWithScore``, or a node holds an image, audio or a
                video and no text (``param`` ``"nodes"``, ``index`` its place). Raised before any
                event is emitted.
        """
        query, nodes, texts = self._begin(nodes, query_bundle)
        if not nodes:
            return []
        with self._reranking_event(nodes, query) as event:
            ranked = self._scorer.rerank(query, texts, top_n=self.top_n, score_threshold=self.score_threshold)
            reranked = self._ended(nodes, ranked, event)
        dispatcher.event(ReRankEndEvent(nodes=reranked))
        return reranked

    @dispatcher.span
    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        """Async :meth:`_postprocess_nodes`: scoring runs in a worker thread, the event loop keeps running."""
        query, nodes, texts = self._begin(nodes, query_bundle)
        if not nodes:
            return []
        with self._reranking_event(nodes, query) as event:
            ranked = await self._scorer.arerank(
                query, texts, top_n=self.top_n, score_threshold=self.score_threshold
            )
            reranked = self._ended(nodes, ranked, event)
        dispatcher.event(ReRankEndEvent(nodes=reranked))
        return reranked

    # -- helpers ------------------------------------------------------------------------------------

    def _begin(
        self, nodes: Iterable[Any], query_bundle: QueryBundle | None
    ) -> tuple[str, list[NodeWithScore], list[str]]:
        """What both entry points do before scoring: the query and the nodes checked (raised before
        any event), their texts and, when there are nodes, the start event."""
        query = _require_query(query_bundle)
        checked = _checked_nodes(nodes)
        texts = self._texts(checked)
        if checked:
            self._emit_start(checked, query_bundle)
        return query, checked, texts

    def _reranking_event(self, nodes: Sequence[NodeWithScore], query: str) -> Any:
        """The legacy callback manager's reranking event, opened as a context manager."""
        return self.callback_manager.event(
            CBEventType.RERANKING, payload=self._callback_payload(nodes, query)
        )

    def _ended(
        self, nodes: Sequence[NodeWithScore], ranked: RankedResults, event: Any
    ) -> list[NodeWithScore]:
        """The reranked copies, handed to the callback event as its end payload."""
        reranked = self._reranked_nodes(nodes, ranked)
        event.on_end(payload={EventPayload.NODES: reranked})
        return reranked

    def _texts(self, nodes: Sequence[NodeWithScore]) -> list[str]:
        return [n.node.get_content(metadata_mode=self.metadata_mode) for n in nodes]

    def _emit_start(self, nodes: Sequence[NodeWithScore], query_bundle: QueryBundle | None) -> None:
        dispatcher.event(
            ReRankStartEvent(
                query=query_bundle,
                nodes=list(nodes),
                top_n=self._effective_top_n(nodes),
                model_name=self.model,
            )
        )

    def _effective_top_n(self, nodes: Sequence[NodeWithScore]) -> int:
        return self.top_n if self.top_n is not None else len(nodes)

    def _callback_payload(self, nodes: Sequence[NodeWithScore], query: str) -> dict[str, Any]:
        return {
            EventPayload.NODES: nodes,
            EventPayload.MODEL_NAME: self.model,
            EventPayload.QUERY_STR: query,
            EventPayload.TOP_K: self._effective_top_n(nodes),
        }

    def _reranked_nodes(self, nodes: Sequence[NodeWithScore], ranked: RankedResults) -> list[NodeWithScore]:
        """Copies of the ranked nodes, best first, scored; the inputs stay as they were."""
        reranked = []
        for result in ranked:
            source = nodes[result.index]
            node = _copy_node(source.node)
            if self.keep_retrieval_score:
                node.metadata[RETRIEVAL_SCORE_KEY] = source.score
                _hide_from_models(node, RETRIEVAL_SCORE_KEY)
            if result.window is not None:
                node.metadata[WINDOW_KEY] = list(result.window)
                _hide_from_models(node, WINDOW_KEY)
            else:  # a window left by an earlier, chunked reranking would describe a score no longer there
                node.metadata.pop(WINDOW_KEY, None)
            reranked.append(NodeWithScore(node=node, score=result.score))
        return reranked


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _copy_node(node: Any) -> Any:
    """A shallow copy of ``node`` with its own metadata dict and excluded-key lists: the only parts the
    adapter writes to. Everything else (text, relationships, an ``IndexNode``'s ``obj``, the metadata
    values) is shared with the input, as LlamaIndex's own rerankers return the node itself: copying an
    ``obj`` would clone an index or a query engine, and a value that refuses to be copied must not cost
    the caller a scored node."""
    return node.model_copy(
        update={
            "metadata": dict(node.metadata),
            "excluded_embed_metadata_keys": list(node.excluded_embed_metadata_keys),
            "excluded_llm_metadata_keys": list(node.excluded_llm_metadata_keys),
        }
    )


def _hide_from_models(node: Any, key: str) -> None:
    """Bookkeeping, not content: keep ``key`` out of the text embedders and LLMs see."""
    for excluded in (node.excluded_embed_metadata_keys, node.excluded_llm_metadata_keys):
        if key not in excluded:
            excluded.append(key)


def _checked_nodes(nodes: Iterable[Any]) -> list[NodeWithScore]:
    """The nodes as a list, each a ``NodeWithScore``, checked before any event or scoring: another
    item would otherwise fail as a bare ``AttributeError`` that names neither it nor its place. Read
    once into a list: a generator of nodes, consumed by the check, reached the scorer empty."""
    nodes = list(nodes)
    for index, item in enumerate(nodes):
        if not isinstance(item, NodeWithScore):
            hint = "; wrap it: NodeWithScore(node=node)" if isinstance(item, BaseNode) else ""
            raise InvalidRequestError(
                f"nodes[{index}] must be a llama_index NodeWithScore, got {type(item).__name__}{hint}",
                param="nodes",
                index=index,
            )
        media = _media_without_text(item.node)
        if media is not None:
            # Scored as an empty text, an image would rank with the worst and top_n would drop it unseen.
            raise InvalidRequestError(
                f"nodes[{index}] is a {type(item.node).__name__} holding {media} and no text: a text "
                "reranker cannot read it. Give it a text (a caption, a transcript), or rerank the text "
                "nodes alone and keep media nodes beside them",
                param="nodes",
                index=index,
            )
    return nodes


def _media_without_text(node: BaseNode) -> str | None:
    """``"an image"`` (or audio, a video) when the node carries media and no text of its own, else None."""
    if node.get_content(metadata_mode=MetadataMode.NONE).strip():
        return None
    if any(getattr(node, name, None) for name in ("image", "image_path", "image_url", "image_resource")):
        return "an image"
    if getattr(node, "audio_resource", None) is not None:
        return "audio"
    if getattr(node, "video_resource", None) is not None:
        return "a video"
    return None


def _require_query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise InvalidRequestError(
            "GenerativeRerank needs the query: call postprocess_nodes(nodes, query_str=...) or pass "
            "query_bundle=QueryBundle(...)",
            param="query",
        )
    if not isinstance(query_bundle.query_str, str):
        # QueryBundle is a dataclass that checks nothing; refused here, before any event reports the call.
        raise InvalidRequestError(
            f"GenerativeRerank needs a text query: query_bundle.query_str must be a string, got "
            f"{type(query_bundle.query_str).__name__}",
            param="query",
        )
    if query_bundle.image_path is not None and not query_bundle.query_str.strip():
        # An image query (a multi-modal retriever's): scored against an empty text, the order would be
        # the documents' own, unrelated to the image.
        raise InvalidRequestError(
            f"GenerativeRerank got an image query (image_path={query_bundle.image_path!r}) with no text; "
            "a text reranker cannot read it: give the QueryBundle a query_str, or leave image queries "
            "unreranked",
            param="query",
        )
    return query_bundle.query_str


def _model_name(scorer: object) -> str:
    name = getattr(getattr(scorer, "config", None), "model", None)
    return name if isinstance(name, str) else type(scorer).__name__
