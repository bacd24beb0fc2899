"""LangChain adapters: rerank retrieved documents with a causal-LM reranker (Qwen3-Reranker style).

* :class:`GenerativeReranker` is a ``BaseDocumentCompressor``: put it in a
  ``ContextualCompressionRetriever`` (``langchain-classic``) behind any retriever.
* :class:`GenerativeCrossEncoder` is a ``BaseCrossEncoder``, for LangChain's own ``CrossEncoderReranker``.

Both are thin: they turn documents into strings, call a :class:`~genscore_core.GenerativeScorer`
and copy the documents with the scores attached. All scoring happens in ``genscore_core``.

Example:
    >>> from langchain_classic.retrievers import ContextualCompressionRetriever  # doctest: +SKIP
    >>> reranker = GenerativeReranker("Qwen/Qwen3-Reranker-0.6B", top_n=3)  # doctest: +SKIP
    >>> retriever = ContextualCompressionRetriever(
    ...     base_compressor=reranker, base_retriever=vector_store.as_retriever(search_kwargs={"k": 20})
    ... )  # doctest: +SKIP
    >>> retriever.invoke("What is the capital of France?")[0].metadata["relevance_score"]  # doctest: +SKIP
    0.97...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from genscore_core import (
    GenerativeScorer,
    InvalidRequestError,
    RankedResult,
    RankedResults,
    ScorerConfig,
    check_rank_options,
)
from genscore_integrations._scorer_args import (
    SCORER_SETTINGS,
    check_model,
    check_names,
    plain_rank_options,
    scorer_for,
    threshold_mode,
)

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.cross_encoders import BaseCrossEncoder
    from langchain_core.documents import BaseDocumentCompressor, Document
except ImportError as exc:
    raise ImportError(
        "genscore_integrations.langchain needs langchain-core; install it with: "
        'pip install "genscore[langchain]"'
    ) from exc

__all__ = [
    "RELEVANCE_SCORE_KEY",
    "TRUNCATED_KEY",
    "WINDOW_KEY",
    "GenerativeCrossEncoder",
    "GenerativeReranker",
]

RELEVANCE_SCORE_KEY = "relevance_score"
"""Metadata key of the score (LangChain's convention for rerankers): a probability in [0, 1], or the
raw logit with ``score_mode="logit"``."""
TRUNCATED_KEY = "genscore_truncated"
"""Metadata key of the flag telling whether the document was shortened to fit the prompt length."""
WINDOW_KEY = "genscore_window"
"""Metadata key of ``[start, end)``, the character span of the window whose score was reported, present when
the scorer chunks long documents (``long_documents="chunk"``), and removed otherwise (it described an earlier
score)."""


def _constructor_input(owner: type[BaseModel], model: str | None, data: Any) -> Any:
    """The pydantic input of an adapter: its own options and a ``scorer``, built from the model settings
    when none was given. Unknown names and contradictory arguments fail here, before any loading."""
    if not isinstance(data, dict):
        return data
    check_names(owner.__name__, data, owner.model_fields)
    if model is not None:
        if "model" in data:
            raise TypeError(f"{owner.__name__} got the model twice: positionally and as model=")
        data = {**data, "model": model}
    check_model(owner.__name__, data.get("model"))
    settings = {key: value for key, value in data.items() if key in SCORER_SETTINGS}
    rest = {key: value for key, value in data.items() if key not in SCORER_SETTINGS}
    # The scorer class is looked up here, at call time, so that tests can stand in for it.
    rest["scorer"] = scorer_for(owner.__name__, rest.get("scorer"), settings, build=GenerativeScorer)
    if rest.get("score_threshold") is not None:  # now a score of a known mode: the scorer's
        check_rank_options(None, rest["score_threshold"], score_mode=threshold_mode(rest["scorer"], {}))
    return rest


def _saved(
    adapter: GenerativeReranker | GenerativeCrossEncoder, handler: SerializerFunctionWrapHandler
) -> dict[str, Any]:
    """The adapter's options and every setting of its scorer: the arguments that rebuild it."""
    return {**adapter.scorer.settings(), **handler(adapter)}


class GenerativeReranker(BaseDocumentCompressor):
    """Reranks documents by a causal LM's probability of the "yes" label (Qwen3-Reranker style).

    Build it from a ready :class:`~genscore_core.GenerativeScorer`, so that several adapters share
    one loaded model, or from the settings a scorer takes (the model, first or as ``model=``, and
    ``template``, ``instruction``, ``device``, ``dtype``, ``max_length``, ... or ``config``). An
    unknown name, or a scorer together with settings that differ from its own, raises ``TypeError``
    (as :class:`~genscore_integrations.llama_index.GenerativeRerank` does), and so does a scorer given
    as the model (``GenerativeReranker(scorer)``); a bad ``top_n`` or ``score_threshold`` raises
    :class:`~genscore_core.InvalidRequestError`. All before any loading.

    ``model_dump()`` records the options and every setting of the scorer (not the weights), so
    ``GenerativeReranker(**reranker.model_dump())`` scores as ``reranker`` does;
    ``GenerativeReranker(**data, scorer=scorer)`` reuses a loaded scorer whose settings agree. A
    pickle holds the same (the scorer pickles as its settings: unpickling loads the model again, once
    for all the adapters of the pickle that share it); ``copy.deepcopy`` shares the scorer.

    The returned documents are copies, best first (ties keep input order). Each keeps its ``id``
    and gets a new metadata dict holding the input's entries (their values are the input's own
    objects, never copied), plus ``metadata["relevance_score"]`` (a probability in [0, 1]; the raw logit
    with ``score_mode="logit"``) and
    ``metadata["genscore_truncated"]`` (whether the document was shortened to fit ``max_length``).
    The input documents are never changed.

    Example:
        >>> from genscore_core import GenerativeScorer  # doctest: +SKIP
        >>> scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B", device="cuda")  # doctest: +SKIP
        >>> reranker = GenerativeReranker(scorer=scorer, top_n=2)  # doctest: +SKIP
        >>> from langchain_core.documents import Document
        >>> docs = [Document("Berlin is in Germany."), Document("Paris is the capital of France.")]
        >>> best = reranker.compress_documents(docs, "capital of France")  # doctest: +SKIP
        >>> best[0].page_content, round(best[0].metadata["relevance_score"], 2)  # doctest: +SKIP
        ('Paris is the capital of France.', 0.99)
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    scorer: GenerativeScorer = Field(exclude=True)
    """The engine that scores; built from the model settings when not given. A dump records its
    settings instead (see :meth:`model_dump`)."""
    top_n: Annotated[int, Field(ge=1, strict=True)] | None = 3
    """Most documents to return (3, as in LangChain's rerankers); ``None`` keeps them all."""
    score_threshold: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """Drop documents scoring below this; ``None`` keeps every score. A score of the scorer's mode:
    within [0, 1], or any finite logit with ``score_mode="logit"``."""

    if TYPE_CHECKING:  # the signature type checkers see: a scorer, or the settings to build one

        def __init__(
            self,
            model: str | None = None,
            /,
            *,
            scorer: GenerativeScorer = ...,
            top_n: int | None = 3,
            score_threshold: float | None = None,
            config: ScorerConfig | None = None,
            **settings: Any,
        ) -> None: ...

    else:

        def __init__(self, model: str | None = None, /, **data: Any) -> None:
            # The reranker's own options first, outside pydantic (which would wrap the error), so a
            # bad top_n fails at once with the same InvalidRequestError as GenerativeRerank's, before
            # any weights are loaded; the scorer is built here too, so its errors are not wrapped.
            check_rank_options(
                data.get("top_n"),
                data.get("score_threshold"),
                score_mode=threshold_mode(data.get("scorer"), data),
            )
            super().__init__(**_constructor_input(type(self), model, data))

    @model_validator(mode="before")
    @classmethod
    def _scorer_from_settings(cls, data: Any) -> Any:
        return _constructor_input(cls, None, plain_rank_options(data))

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _saved(self, handler)

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> list[Document]:
        """Rerank ``documents`` for ``query``.

        Args:
            documents: The retrieved documents; their ``page_content`` is scored.
            query: The query to score the documents against.
            callbacks: Accepted for LangChain's interface; the reranker emits no events of its own
                (a ``ContextualCompressionRetriever`` reports the run around it).

        Returns:
            Copies of at most ``top_n`` documents scoring at least ``score_threshold``, best first.

        Raises:
            InvalidRequestError: An item is not a ``Document`` (``param`` ``"documents"``, ``index``
                its place), before anything is scored.
        """
        documents = _checked_documents(documents)
        if not documents:
            return []
        ranked = self.scorer.rerank(
            query,
            [doc.page_content for doc in documents],
            top_n=self.top_n,
            score_threshold=self.score_threshold,
        )
        return _ranked_documents(documents, ranked)

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> list[Document]:
        """Async :meth:`compress_documents`: scoring runs off the event loop, which keeps running."""
        documents = _checked_documents(documents)
        if not documents:
            return []
        ranked = await self.scorer.arerank(
            query,
            [doc.page_content for doc in documents],
            top_n=self.top_n,
            score_threshold=self.score_threshold,
        )
        return _ranked_documents(documents, ranked)


def _checked_documents(documents: Sequence[Document]) -> list[Document]:
    """The documents as a list, each checked to be a ``Document`` before anything is scored: another
    item would otherwise fail as a bare ``AttributeError`` that names neither it nor its place."""
    documents = list(documents)
    for index, document in enumerate(documents):
        if not isinstance(document, Document):
            raise InvalidRequestError(
                f"documents[{index}] must be a langchain_core.documents.Document, got "
                f"{type(document).__name__}",
                param="documents",
                index=index,
            )
    return documents


def _ranked_documents(documents: list[Document], ranked: RankedResults) -> list[Document]:
    return [_with_score(documents[result.index], result) for result in ranked]


def _with_score(document: Document, result: RankedResult) -> Document:
    """A copy of ``document`` (same class, ``id`` and fields) with a new, annotated metadata dict.

    The dict is copied one level deep: the input's dict is left as it was, and its values are shared,
    never copied, so no value (a tensor in a graph, a lock, a deeply nested tree, a large payload) can
    fail or slow the call after the scoring is done.
    """
    metadata = dict(document.metadata)
    metadata[RELEVANCE_SCORE_KEY] = result.score
    metadata[TRUNCATED_KEY] = result.truncated
    if result.window is not None:
        metadata[WINDOW_KEY] = list(result.window)
    else:  # a window left by an earlier, chunked reranking would describe a score no longer there
        metadata.pop(WINDOW_KEY, None)
    return document.model_copy(update={"metadata": metadata})


class GenerativeCrossEncoder(BaseCrossEncoder, BaseModel):
    """A causal-LM reranker behind LangChain's ``BaseCrossEncoder`` interface.

    Takes a ready ``scorer=`` or the settings to build one (the model may come first), and dumps
    its scorer's settings, like :class:`GenerativeReranker`.

    Example:
        >>> from langchain_classic.retrievers.document_compressors import (  # doctest: +SKIP
        ...     CrossEncoderReranker,
        ... )
        >>> encoder = GenerativeCrossEncoder("Qwen/Qwen3-Reranker-0.6B")  # doctest: +SKIP
        >>> encoder.score([("capital of France", "Paris is the capital of France.")])  # doctest: +SKIP
        [0.99...]
        >>> reranker = CrossEncoderReranker(model=encoder, top_n=3)  # doctest: +SKIP
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    scorer: GenerativeScorer = Field(exclude=True)
    """The engine that scores; built from the model settings when not given."""

    if TYPE_CHECKING:  # the signature type checkers see: a scorer, or the settings to build one

        def __init__(
            self,
            model: str | None = None,
            /,
            *,
            scorer: GenerativeScorer = ...,
            config: ScorerConfig | None = None,
            **settings: Any,
        ) -> None: ...

    else:

        def __init__(self, model: str | None = None, /, **data: Any) -> None:
            super().__init__(**_constructor_input(type(self), model, data))

    @model_validator(mode="before")
    @classmethod
    def _scorer_from_settings(cls, data: Any) -> Any:
        return _constructor_input(cls, None, data)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _saved(self, handler)

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        """Each (query, document) pair's relevance, in input order: a probability in [0, 1], or the
        raw logit with ``score_mode="logit"``."""
        if not text_pairs:
            return []
        return self.scorer.score_pairs(text_pairs)

    async def ascore(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        """Async :meth:`score`: scoring runs off the event loop."""
        if not text_pairs:
            return []
        return await self.scorer.ascore_pairs(text_pairs)
