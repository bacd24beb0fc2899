"""``GenerativeScorer``: a front end that builds scoring jobs, composed with one backend that scores them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

from pydantic import ValidationError
from tqdm import tqdm  # not tqdm.auto: notebooks without ipywidgets would warn on import

from genscore_core.backend import ProgressCallback, ScoringBackend, ScoringJob, in_worker_thread
from genscore_core.config import (
    DEFAULT_MODEL,
    LocalSettings,
    ScorerConfig,
    ServerSettings,
    setting_default,
    setting_value,
)
from genscore_core.errors import ConfigurationError, InvalidRequestError, ScoreRangeError
from genscore_core.frontend import (
    PairStream,
    ScoringFrontEnd,
    check_documents,
    check_pairs,
    check_token_count,
)
from genscore_core.loading import (
    check_causal_lm_config,
    check_loaded_causal_lm,
    check_max_length,
    load_causal_lm,
    load_tokenizer,
    model_max_length,
    resolve_device,
    resolve_dtype,
)
from genscore_core.long_documents import WindowedPairs
from genscore_core.prepared import PreparedPairs, PreparedScore
from genscore_core.prompts import EncodedPrompt, PromptInfo
from genscore_core.protocol import GenerativeScoringRequest, GenerativeScoringResponse, check_text
from genscore_core.recipes import Recipe
from genscore_core.result_cache import CachedCall, ResultCache
from genscore_core.results import RankedResults, check_rank_options, rank_results
from genscore_core.scoring import first_bad_score, score_range_words
from genscore_core.templates import PromptTemplate, ScoreMode

if TYPE_CHECKING:
    import torch

    from genscore_core.engine import ScoringEngine

RANKED_ON_THE_LOOP = 64
""":meth:`GenerativeScorer.arerank` ranks calls of up to this many documents on the event loop and
larger ones on a worker thread. Ranking takes about 4-5 us a result (0.07 ms for 20, 10 ms for 2,000
on the 2-core development machine), during which a server's other connections would wait; a hop to a
thread costs about 0.1 ms, which small calls would not win back."""


_T = TypeVar("_T")


class _FrontEndAttribute(Generic[_T]):
    """A read-only attribute of :class:`GenerativeScorer` that is its front end's attribute of the
    same name (what the scorer's parts know, without a property written out for each)."""

    def __init__(self, doc: str | None = None) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, scorer: None, owner: type) -> _FrontEndAttribute[_T]: ...

    @overload
    def __get__(self, scorer: GenerativeScorer, owner: type) -> _T: ...

    def __get__(self, scorer: GenerativeScorer | None, owner: type) -> _T | _FrontEndAttribute[_T]:
        if scorer is None:
            return self
        return cast(_T, getattr(scorer.front_end, self.name))

    def __set__(self, scorer: GenerativeScorer, value: object) -> None:
        raise AttributeError(f"property {self.name!r} of 'GenerativeScorer' object has no setter")


class GenerativeScorer:
    """Scores (query, document) pairs by a causal LM's next-token label probabilities.

    A scorer is a :class:`~genscore_core.frontend.ScoringFrontEnd` (templates, truncation, request
    checks) composed with one :class:`~genscore_core.backend.ScoringBackend` (the model here, or a
    server). Build it in one of three ways:

    * ``GenerativeScorer("Qwen/Qwen3-Reranker-0.6B", **settings)``: load a model by hub id or folder;
      with ``server_url=`` it loads only the tokenizer and scores through that server;
    * :meth:`from_model`: wrap a causal LM and tokenizer already loaded;
    * :meth:`from_server`: score through ``genscore serve``, vLLM, SGLang or a ``/v1/rerank`` server.

    ``GenerativeScorer(front_end=..., backend=...)`` composes parts built elsewhere.

    Example:
        >>> scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B")  # doctest: +SKIP
        >>> ranked = scorer.rerank("capital of France", ["Berlin is...", "Paris is..."], top_n=1)
        >>> ranked[0].index  # doctest: +SKIP
        1

    Args:
        model: Hub id or local folder (a string or a ``pathlib.Path``) of a causal LM (default
            ``Qwen/Qwen3-Reranker-0.6B``).
        config: A ready :class:`ScorerConfig`; or pass its settings as keyword arguments.
        front_end, backend: Ready parts, instead of a model name and settings.
        **settings: Settings of :class:`ScorerConfig` by their flat names (``template``,
            ``instruction``, ``max_length``, ``device``, ``dtype``, ``max_batch_tokens``, ``server_url``,
            ``server_kind``, ...), each routed into its part, or the typed parts ``prompt=`` and
            ``run=``. Unknown names are rejected.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        config: ScorerConfig | None = None,
        front_end: ScoringFrontEnd | None = None,
        backend: ScoringBackend | None = None,
        **settings: Any,
    ) -> None:
        if front_end is None and backend is None:
            front_end, backend = _load(_make_config(model, config, settings))
        elif front_end is None or backend is None:
            raise TypeError("pass front_end= and backend= together")
        elif model is not None or config is not None or settings:
            raise TypeError("pass either a model and its settings, or front_end= and backend=, not both")
        self.front_end: ScoringFrontEnd = front_end
        self.backend: ScoringBackend = backend
        cache_bytes = self.config.result_cache_bytes
        self.result_cache: ResultCache | None = ResultCache(cache_bytes) if cache_bytes else None
        """The scores of prompts scored before (``result_cache_bytes``; None: off). Assign another
        :class:`ResultCache` to share one between scorers: its keys hold each scorer's identity."""
        self._identity: str | None = None

    @classmethod
    def from_model(
        cls, causal_lm: Any, tokenizer: Any, *, config: ScorerConfig | None = None, **settings: Any
    ) -> GenerativeScorer:
        """Wrap a causal LM and tokenizer that are already loaded (no copy is made).

        The packed forward moves each layer's q/k/v weights and its gate/up weights into one tensor
        each and re-points the modules' parameters to views of it (same parameter objects and values,
        held once; ``PackedOptions.fused_projections``), so that a layer runs one GEMM for each.
        The scorer follows the model: cast, moved or given other parameters after this
        (``model.to("cuda")``, ``.half()``, ``load_state_dict(..., assign=True)``), the next call
        builds the forward and head again (:meth:`ScoringEngine.follow_model`; docs/concepts.md).

        ``settings`` are :class:`ScorerConfig` settings, or ``config`` a whole one; ``model`` only names
        the model in responses (default: the model's ``name_or_path``). ``device`` and ``dtype`` are those of ``causal_lm``:
        given, they must say the same (``ConfigurationError`` otherwise; move or cast the model first),
        and ``server_url`` is refused (:meth:`from_server` scores through a server).
        """
        if config is None:
            name = settings.pop("model", None) or getattr(causal_lm, "name_or_path", None) or DEFAULT_MODEL
            config = ScorerConfig(model=name, **settings)
        elif settings:
            raise TypeError("pass either config= or model settings, not both")
        check_causal_lm_config(causal_lm.config, config.model)
        check_loaded_causal_lm(causal_lm, None, config.model)
        local = _check_model_placement(causal_lm, config)
        front_end, engine = _local_parts(causal_lm.eval(), tokenizer, config, local)
        return cls(front_end=front_end, backend=engine)

    @classmethod
    def from_server(
        cls, server_url: str, model: str | os.PathLike[str] = DEFAULT_MODEL, **settings: Any
    ) -> GenerativeScorer:
        """Score through the server at ``server_url``; only the tokenizer of ``model`` is loaded here.

        Prompts are still built here (so scores equal local ones, ``docs/scaling.md``);
        ``server_kind`` picks the protocol and the other ``server_*`` settings the client's behaviour.
        """
        config = ScorerConfig(model=os.fspath(model), server_url=server_url, **settings)
        return cls(config=config)

    # -- what the parts know -------------------------------------------------------------------------

    config = _FrontEndAttribute[ScorerConfig]()
    tokenizer = _FrontEndAttribute[Any]()
    template = _FrontEndAttribute[PromptTemplate]()
    label_token_ids = _FrontEndAttribute[list[int]]()
    recipe = _FrontEndAttribute[Recipe]("The template in use and why it was picked (``recipe.source``).")
    score_mode = _FrontEndAttribute[ScoreMode](
        "How logits become scores here (``ScorerConfig.score_mode`` resolved)."
    )
    max_length = _FrontEndAttribute[int]()
    vocab_size = _FrontEndAttribute[int]()

    @property
    def engine(self) -> ScoringEngine:
        """The local engine: the backend, where it runs the model in this process (the contract's
        :attr:`~genscore_core.backend.ScoringBackend.local_model`, which only the local
        :class:`~genscore_core.engine.ScoringEngine` sets). A scorer whose backend is a server, or
        a queue in front of one, has none (see :attr:`backend`)."""
        if self.backend.local_model is None:
            raise AttributeError(
                f"this scorer scores through {self.backend!r}, not a local engine; use scorer.backend"
            )
        return cast("ScoringEngine", self.backend)

    @property
    def model(self) -> Any:
        """The loaded causal LM (:attr:`~genscore_core.backend.ScoringBackend.local_model`); a scorer
        whose backend is a server has no weights here."""
        model = self.backend.local_model
        if model is None:
            raise AttributeError(
                f"this scorer scores through {self.backend!r}: the model's weights stay on the server, "
                "so it has no .model; use scorer.config.model for the model's name"
            )
        return model

    # -- its settings: saved, compared, pickled ------------------------------------------------------

    def settings(self, *, mode: Literal["python", "json"] = "json", secrets: bool = False) -> dict[str, Any]:
        """Every setting a new scorer needs to score as this one does, by flat name:
        ``GenerativeScorer(**scorer.settings())`` loads one (the model is loaded again).

        ``dtype`` is the one the weights really have when the scorer left it to the device, so that a
        scorer built from a bfloat16 model reloads in bfloat16. The secret (``server_api_key``) is
        left out of what is saved (an adapter's dump); ``secrets=True`` adds it as a ``SecretStr``,
        which keeps its value in a pickle and shows it in no repr or log.
        """
        config = self.config
        data = config.to_settings(mode=mode, exclude={"server_api_key"})
        local = config.local
        if local is not None and local.dtype is None:
            try:
                weights = self.model
            except AttributeError:  # a backend with no weights here: their dtype is not ours to record
                weights = None
            if weights is not None:
                data["dtype"] = str(weights.dtype).removeprefix("torch.")
        server = config.server
        if secrets and server is not None and server.api_key is not None:
            data["server_api_key"] = server.api_key
        return data

    def differing_settings(self, settings: Mapping[str, Any]) -> list[str]:
        """The names in ``settings`` (scorer settings: ``model``, ``config``, ``prompt``, ``run`` or a
        flat setting) whose value is not this scorer's, sorted. A value is compared as the setting
        holds it (``dtype=torch.float32`` is ``"float32"``); one that is not valid differs."""
        config = self.config
        mine = self.settings(mode="python", secrets=True)
        differing = []
        for name, value in settings.items():
            try:
                if name == "config":
                    same = value == config
                elif name in ("prompt", "run"):  # a typed part, or the dict of one
                    same = getattr(ScorerConfig(**{name: value}), name) == getattr(config, name)
                else:
                    reference = mine.get(name, setting_default(name))
                    same = setting_value(name, value) == setting_value(name, reference)
            except (ValidationError, ConfigurationError, KeyError):  # a bad value or an unknown name
                same = False
            if not same:
                differing.append(name)
        return sorted(differing)

    def __reduce__(self) -> tuple[Callable[[dict[str, Any]], GenerativeScorer], tuple[dict[str, Any]]]:
        """A pickle holds the scorer's settings, taken when pickled (the model may have been cast since),
        the API key included: unpickling loads the model again. Pickle writes a scorer once however many
        objects hold it, so a pickle of several adapters on one scorer loads the model once."""
        return _scorer_from_settings, (self.settings(mode="python", secrets=True),)

    def __deepcopy__(self, memo: dict[int, Any]) -> GenerativeScorer:
        """The scorer itself: a copy of what holds a scorer shares it (one scorer serves any number of
        callers at once, and its loaded model and locks are not to be copied)."""
        return self

    # -- the protocol -------------------------------------------------------------------------------

    def score(self, request: GenerativeScoringRequest | Mapping[str, Any]) -> GenerativeScoringResponse:
        """Answer a generative scoring request (vLLM's ``/generative_scoring`` semantics).

        Raises:
            InvalidRequestError: What the protocol answers with HTTP 400 (``param``, ``index``).
            pydantic.ValidationError: A mapping that is not a request (HTTP 422).
            ScoreRangeError: A score the backend gave that is not a probability (``index``: the item).
        """
        prepared = self.prepare_score(request)
        [scores] = self._run([prepared.job], name=_items_named)
        return prepared.response(scores)

    async def ascore(
        self, request: GenerativeScoringRequest | Mapping[str, Any]
    ) -> GenerativeScoringResponse:
        """:meth:`score` without blocking the event loop."""
        prepared = await asyncio.to_thread(self.prepare_score, request)
        [scores] = await self._arun([prepared.job], name=_items_named)
        return prepared.response(scores)

    def prepare_score(self, request: GenerativeScoringRequest | Mapping[str, Any]) -> PreparedScore:
        """Check a request and build its prompts without scoring them (see :class:`ScoringFrontEnd`)."""
        return self.front_end.prepare_score(request)

    # -- reranking with the template ----------------------------------------------------------------

    def encode(self, query: str, documents: Iterable[str]) -> list[EncodedPrompt]:
        """The templated, truncated prompts that :meth:`rerank` scores."""
        return self.front_end.encode(query, _documents(documents))

    def prepare_pairs(self, pairs: Iterable[tuple[str, str]]) -> PreparedPairs:
        """Build the templated prompts of (query, document) pairs without scoring them."""
        return self.front_end.prepare_pairs(_listed(pairs, "pairs"))

    def score_documents(self, query: str, documents: Iterable[str]) -> list[float]:
        """Score of each document for ``query``, in input order (any iterable of texts, read once)."""
        check_text(query, "query")
        documents = _documents(documents)
        return [score for score, _ in self._score_texts([(query, document) for document in documents])]

    def score_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[float]:
        """Score of each (query, document) pair, in input order; pairs may mix queries (any iterable
        of pairs, read once: a generator, ``zip(queries, documents)``)."""
        return [score for score, _ in self._score_texts(_listed(pairs, "pairs"), param="pairs")]

    async def ascore_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[float]:
        """:meth:`score_pairs` without blocking the event loop."""
        pairs = _listed(pairs, "pairs")
        if self._streams(None):
            scored = await in_worker_thread(
                lambda progress: self._score_texts(pairs, also=progress, param="pairs")
            )
            return [score for score, _ in scored]
        prepared = await asyncio.to_thread(self.front_end.prepare_pairs, pairs)
        scores = await self._arun(prepared.jobs, name=_pairs_named(prepared, "pairs"))
        return [score for score, _ in prepared.assemble(scores)]

    def rerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = None,
        score_threshold: float | None = None,
        max_tokens_per_doc: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> RankedResults:
        """Documents best first (ties in input order), at most ``top_n``, none below ``score_threshold``.

        ``documents`` is any iterable of texts, read once, in iteration order: a list, a generator, a
        pandas Series (``index`` in the results is the position, not the Series' label).

        ``max_tokens_per_doc`` cuts each document after that many of its own tokens first (Cohere's and
        vLLM's rerank option); ``long_documents="chunk"`` then splits what still does not fit.
        ``max_prompt_tokens`` bounds the prompt tokens of the call's chunked documents, refusing a
        document that takes it past before the rest is tokenized (:meth:`ScoringFrontEnd.prepare_pairs`).

        Raises:
            InvalidRequestError: A bad option (``param`` names it) or document (``index`` says which).
            ScoreRangeError: A score the backend gave that is not finite or outside the score mode's
                range (``param`` and ``index`` name the document).
        """
        check_rank_options(top_n, score_threshold, score_mode=self.score_mode)
        check_token_count(max_prompt_tokens, "max_prompt_tokens")  # truncation never reads it: check it here
        check_text(query, "query")
        documents = _documents(documents)
        pairs = [(query, document) for document in documents]
        scored = self._score_texts(pairs, max_tokens_per_doc, max_prompt_tokens=max_prompt_tokens)
        return rank_results(
            query, documents, scored, top_n=top_n, score_threshold=score_threshold, score_mode=self.score_mode
        )

    async def arerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = None,
        score_threshold: float | None = None,
        max_tokens_per_doc: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> RankedResults:
        """:meth:`rerank` without blocking the event loop (prompts are built on a worker thread).

        ``genscore serve``'s ``/v1/rerank`` answers through this very method, with the server's
        batcher as the backend. ``max_prompt_tokens`` bounds the prompt tokens of the call's chunked
        documents (``long_documents="chunk"``), refusing a document that takes it past before the
        rest is tokenized (:meth:`ScoringFrontEnd.prepare_pairs`).
        """
        check_rank_options(top_n, score_threshold, score_mode=self.score_mode)
        check_token_count(max_prompt_tokens, "max_prompt_tokens")  # truncation never reads it: check it here
        check_text(query, "query")
        documents = _documents(documents)
        mode = self.score_mode

        def ranked(scored: Sequence[tuple[float, PromptInfo]]) -> RankedResults:
            return rank_results(
                query, documents, scored, top_n=top_n, score_threshold=score_threshold, score_mode=mode
            )

        if self._streams(max_tokens_per_doc):
            pairs = [(query, document) for document in documents]
            return await in_worker_thread(lambda progress: ranked(self._score_texts(pairs, also=progress)))
        prepared = await asyncio.to_thread(
            self.front_end.prepare_rerank,
            query,
            documents,
            max_tokens_per_doc=max_tokens_per_doc,
            max_prompt_tokens=max_prompt_tokens,
        )
        scores = await self._arun(prepared.jobs, name=_pairs_named(prepared, "documents"))
        if len(documents) <= RANKED_ON_THE_LOOP:
            return ranked(prepared.assemble(scores))
        return await asyncio.to_thread(lambda: ranked(prepared.assemble(scores)))

    # -- internals ----------------------------------------------------------------------------------

    def _streams(self, max_tokens_per_doc: int | None) -> bool:
        """Whether texts may go to the backend in parts: it streams (``backend.streams``), and the
        documents are scored whole (no cut per document, no windows), and no result cache is on."""
        return (
            self.backend.streams
            and self.result_cache is None  # the cache is looked up by whole prompts, before the call
            and max_tokens_per_doc is None
            and self.config.prompt.long_documents == "truncate"
        )

    def _score_texts(
        self,
        pairs: Sequence[tuple[str, str]],
        max_tokens_per_doc: int | None = None,
        *,
        max_prompt_tokens: int | None = None,
        also: ProgressCallback | None = None,
        param: str = "documents",
    ) -> Sequence[tuple[float, PromptInfo]]:
        """(score, prompt) of each pair in input order; ``also`` is called with the progress too.
        ``param`` names the pairs in errors about their scores; ``max_prompt_tokens`` bounds chunked
        documents (:meth:`ScoringFrontEnd.prepare_pairs`), which never stream.

        The one route of texts: the front end builds the call in the shape the backend takes, the
        backend scores it, the scores go back to their pairs. To a backend that streams, a large
        call goes in parts, tokenized on its producer thread while the GPU runs the batches already
        laid out (:mod:`genscore_core.streaming`); every other call is built whole, then scored.
        """
        stream = self.front_end.stream_pairs(pairs) if self._streams(max_tokens_per_doc) else None
        if stream is None or not stream.streams:
            prepared = self.front_end.prepare_pairs(
                pairs, max_tokens_per_doc=max_tokens_per_doc, max_prompt_tokens=max_prompt_tokens
            )
            return prepared.assemble(self._run(prepared.jobs, also, name=_pairs_named(prepared, param)))
        with self._progress(len(pairs), also) as progress, _engine_errors_named(_stream_named(stream, param)):
            scores = self.backend.score_stream(stream.jobs, stream.parts(), progress)
        return stream.assemble(scores)

    @contextmanager
    def _progress(self, total: int, also: ProgressCallback | None = None) -> Iterator[ProgressCallback]:
        """The callback a call reports its scored prompts to: the progress bar, then ``also``."""
        with tqdm(
            total=total, disable=not self.config.show_progress, file=sys.stderr, desc="scoring", unit="doc"
        ) as bar:
            if also is None:
                yield bar.update
                return

            def update(done: int) -> None:
                bar.update(done)
                also(done)

            yield update

    def _run(
        self, jobs: list[ScoringJob], also: ProgressCallback | None = None, *, name: ItemName
    ) -> list[list[float]]:
        """The scores of whole ``jobs``: those the result cache holds, the rest from the backend."""
        with self._progress(sum(len(job.prompts) for job in jobs), also) as progress:
            call = self._consult_cache(jobs)
            if call.hits:
                progress(call.hits)
            if call.answered:
                return call.complete([])
            with _engine_errors_named(call.named(name)):
                scored = self.backend.score_jobs(call.missing, on_progress=progress)
        return call.complete(self._checked(call.missing, scored, call.named(name)))

    async def _arun(self, jobs: list[ScoringJob], *, name: ItemName) -> list[list[float]]:
        """:meth:`_run` without blocking the event loop (the backend's ``ascore_jobs``)."""
        if sum(len(job.prompts) for job in jobs) <= RANKED_ON_THE_LOOP:
            call = self._consult_cache(jobs)
        else:  # hashing the prompts takes about 12 us each (500 tokens): off the loop for large calls
            call = await asyncio.to_thread(self._consult_cache, jobs)
        if call.answered:
            return call.complete([])
        with _engine_errors_named(call.named(name)):
            scored = await self.backend.ascore_jobs(call.missing)
        return call.complete(self._checked(call.missing, scored, call.named(name)))

    def _consult_cache(self, jobs: list[ScoringJob]) -> CachedCall:
        """The one place the result cache is read: ``jobs`` split into the scores it holds and the
        prompts the backend scores (all of them, without a cache)."""
        cache = self.result_cache
        if cache is None:
            return CachedCall(None, jobs)
        return cache.lookup(self.result_cache_identity(), jobs)

    def result_cache_identity(self) -> str:
        """What the result cache's keys hold of this scorer: the settings that can change a score
        (the model, the prompt settings, where and how it runs) and the weights' dtype and device as
        they are now (a model cast after the scorer was built scores anew). Prompts, labels and score
        mode are in the keys too (:mod:`genscore_core.result_cache`)."""
        if self._identity is None:
            settings = self.config.to_settings(mode="json", exclude=_SETTINGS_NO_SCORE_CHANGES)
            self._identity = json.dumps(settings, sort_keys=True, default=str)
        weights = self.backend.local_model
        if weights is None:
            return self._identity
        return f"{self._identity} {getattr(weights, 'dtype', None)} {getattr(weights, 'device', None)}"

    def _checked(
        self, jobs: Sequence[ScoringJob], scores: list[list[float]], name: ItemName
    ) -> list[list[float]]:
        """``scores`` as the backend returned them, once each is known to be a score of its job's
        mode: one list per job, one score per prompt. The local engine checks its own, but a
        backend may be anyone's (``GenerativeScorer(front_end=, backend=)``), and what leaves the
        scorer is a score or an error naming the input it belongs to."""
        counts = [len(job.prompts) for job in jobs]
        if len(scores) != len(jobs) or [len(values) for values in scores] != counts:
            raise RuntimeError(
                f"{self.backend!r} returned {[len(values) for values in scores]} scores for jobs of "
                f"{counts} prompts: one score per prompt is its contract (ScoringBackend.score_jobs)"
            )
        for job_index, (job, values) in enumerate(zip(jobs, scores)):
            bad = first_bad_score(values, job.mode)
            if bad is None:
                continue
            param, index, where = name(job_index, bad)
            raise ScoreRangeError(
                f"{where} was scored {values[bad]!r} by {self.backend!r}, not "
                f"{score_range_words(job.mode)} as score mode {job.mode!r} requires",
                param=param,
                index=index,
            )
        return scores

    def close(self) -> None:
        """Release what the backend holds (a server client's connections; nothing for a local model)."""
        self.backend.close()

    def __enter__(self) -> GenerativeScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GenerativeScorer(model={self.config.model!r}, template={self.template.name!r}, "
            f"max_length={self.max_length}, backend={self.backend!r})"
        )


_SETTINGS_NO_SCORE_CHANGES = frozenset(
    {"show_progress", "result_cache_bytes", "server_api_key", "server_timeout", "server_max_retries"}
)
"""Settings left out of :meth:`GenerativeScorer.result_cache_identity`: none changes a score."""


def _documents(documents: Iterable[str]) -> list[str]:
    """``documents`` listed and checked: its bad text is named ``documents[i]`` as its caller passed
    it, before the (query, document) pairs built from it are checked as pairs."""
    listed = _listed(documents, "documents")
    check_documents(listed)
    return listed


def _listed(items: Iterable[Any], param: str) -> list[Any]:
    """``items`` as a list, read once. The checks, the scoring and the results each go over the
    documents again, so a generator would reach the results empty, and a pandas Series indexed by
    position would read its labels (``series[i]``) and pair a score with another row's text."""
    if isinstance(items, list):
        return items
    if isinstance(items, (str, bytes)):  # one text, not a list of texts: refused as the checks word it
        if param == "documents":
            check_documents(items)  # type: ignore[arg-type]
        check_pairs(items)  # type: ignore[arg-type]
    if _iterates_column_names(items):
        # A pandas DataFrame iterates its column labels: ``"text"`` would be scored as the only document.
        fix = (
            "pass one column: frame['text']"
            if param == "documents"
            else "pass zip(frame['query'], frame['document'])"
        )
        raise InvalidRequestError(
            f"{param} must be a list, a tuple or another ordered iterable, got a DataFrame, which iterates "
            f"its column names; {fix}",
            param=param,
        )
    if isinstance(items, (Mapping, set, frozenset)):
        # A dict iterates its keys (ids would be scored as texts); a set has no order that ``index``
        # in the results could refer to.
        if not isinstance(items, Mapping):
            fix = "a set has no order"
        else:  # texts by id; or, for pairs, documents by query
            fix = "pass list(mapping.values())" if param == "documents" else "pass list(mapping.items())"
        raise InvalidRequestError(
            f"{param} must be a list, a tuple or another ordered iterable, got {type(items).__name__}; {fix}",
            param=param,
        )
    try:
        iterator = iter(items)
    except TypeError as error:
        raise InvalidRequestError(
            f"{param} must be an iterable (a list, a tuple, a generator), got {type(items).__name__}",
            param=param,
        ) from error
    return list(iterator)


def _iterates_column_names(items: object) -> bool:
    """Whether ``items`` is a data frame (pandas, or one like it): ``iter`` over it gives its column
    labels, not its rows. Read off the type, so that pandas is not imported for the check."""
    kind = type(items)
    return kind.__name__ == "DataFrame" and hasattr(items, "columns") and hasattr(items, "iloc")


ItemName = Callable[[int, int], tuple[str, int, str]]
"""``(job, prompt) -> (param, index, words)``: the input a prompt of a call was built from, named for
an error (``"documents", 3, "documents[3]"``)."""


def _items_named(job: int, prompt: int) -> tuple[str, int, str]:
    """A protocol request is one job; its prompts are its items."""
    return "items", prompt, f"items[{prompt}]"


@contextmanager
def _engine_errors_named(name: ItemName) -> Iterator[None]:
    """A :class:`ScoreRangeError` of the engine, which knows a bad score only as a prompt of a job,
    raised again naming the input that prompt was built from."""
    try:
        yield
    except ScoreRangeError as error:
        if error.param is not None or error.job is None or error.prompt is None:
            raise
        param, index, where = name(error.job, error.prompt)
        raise error.naming(where, param=param, index=index, job=error.job, prompt=error.prompt) from error


def _stream_named(stream: PairStream, param: str) -> ItemName:
    """Names the input pair of a prompt of a streamed call (whole documents, no windows)."""

    def name(job: int, prompt: int) -> tuple[str, int, str]:
        position = stream.positions[job][prompt]
        return param, position, f"{param}[{position}]"

    return name


def _pairs_named(prepared: PreparedPairs, param: str) -> ItemName:
    """Names the input pair of a prompt of ``prepared``; a window of a chunked document is named
    as its document's, with its place among the document's windows."""

    def name(job: int, prompt: int) -> tuple[str, int, str]:
        position = prepared.positions[job][prompt]
        if not isinstance(prepared, WindowedPairs):
            return param, position, f"{param}[{position}]"
        owner = prepared.owners[position]
        windows = [window for window, of in enumerate(prepared.owners) if of == owner]
        if len(windows) == 1:
            return param, owner, f"{param}[{owner}]"
        return param, owner, f"window {windows.index(position) + 1} of {len(windows)} of {param}[{owner}]"

    return name


def _check_model_placement(causal_lm: Any, config: ScorerConfig) -> LocalSettings:
    """Refuse settings of :meth:`GenerativeScorer.from_model` that the model given contradicts: the
    scorer scores where the model is, so ``device="cuda"`` for a model on the CPU would have run on
    the CPU while ``scorer.config.local.device`` said "cuda". Returns the local settings."""
    local = config.local
    if local is None:
        raise ConfigurationError(
            "from_model scores with the model given here; to score through a server use "
            "GenerativeScorer.from_server(server_url, model=...)",
            setting="server_url",
        )
    import torch  # here, not at the top: a scorer of a server loads no torch

    have_device = torch.device(getattr(causal_lm, "device", "cpu"))
    if local.device not in (None, "auto"):
        try:
            wanted = torch.device(local.device)
        except RuntimeError as error:
            raise ConfigurationError(f"unknown device {local.device!r}: {error}", setting="device") from None
        if wanted.type != have_device.type or wanted.index not in (None, have_device.index):
            raise ConfigurationError(
                f"device={local.device!r}, but the model is on {have_device}: from_model scores where the "
                f"model is; move it first (model.to({local.device!r})) or leave device out",
                setting="device",
            )
    have_dtype = getattr(causal_lm, "dtype", None)
    if local.dtype not in (None, "auto") and isinstance(have_dtype, torch.dtype):
        wanted_dtype = resolve_dtype(local.dtype, have_device)
        if wanted_dtype != have_dtype:
            raise ConfigurationError(
                f"dtype={local.dtype!r}, but the model's weights are {str(have_dtype).removeprefix('torch.')}: "
                f"from_model scores with the weights as they are; cast the model first "
                f"(model.to({wanted_dtype})) or leave dtype out",
                setting="dtype",
            )
    return local


def _scorer_from_settings(settings: dict[str, Any]) -> GenerativeScorer:
    """The scorer a pickle holds (:meth:`GenerativeScorer.__reduce__`)."""
    settings = dict(settings)
    return GenerativeScorer(settings.pop("model", None), **settings)


def _make_config(
    model: str | os.PathLike[str] | None, config: ScorerConfig | None, settings: dict[str, Any]
) -> ScorerConfig:
    if config is not None:
        if model is not None or settings:
            raise TypeError("pass either config= or model settings, not both")
        return config
    return ScorerConfig(model=os.fspath(model) if model else DEFAULT_MODEL, **settings)


def _load(config: ScorerConfig) -> tuple[ScoringFrontEnd, ScoringBackend]:
    """The parts ``config`` asks for: a server client when it runs on a server, else the model here."""
    local = config.run
    if isinstance(local, ServerSettings):
        return _server_parts(config, local)
    device = resolve_device(local.device)
    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    causal_lm = load_configured_lm(config, local, device)
    return _local_parts(causal_lm, tokenizer, config, local)


def load_configured_lm(config: ScorerConfig, local: LocalSettings, device: torch.device) -> Any:
    """The causal LM ``config`` names, loaded on ``device`` in ``local``'s dtype (for this module and
    for Ray's warm-up, which loads it beside the tokenizer)."""
    return load_causal_lm(
        config.model,
        device=device,
        dtype=resolve_dtype(local.dtype, device),
        trust_remote_code=config.trust_remote_code,
        show_progress=config.show_progress,
    )


def _local_parts(
    causal_lm: Any, tokenizer: Any, config: ScorerConfig, local: LocalSettings
) -> tuple[ScoringFrontEnd, ScoringEngine]:
    from genscore_core.engine import ScoringEngine  # torch: only a scorer with a model here loads it
    from genscore_core.seq_cls import check_classifier_tokens

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = ScoringEngine.for_model(causal_lm, local, pad_token_id=pad_id or 0)
    wanted = config.prompt.max_length
    if wanted is not None:
        check_max_length(causal_lm, wanted)
    max_length = wanted or model_max_length(causal_lm, tokenizer)
    front_end = ScoringFrontEnd(tokenizer, config, max_length=max_length, vocab_size=engine.vocab_rows)
    check_classifier_tokens(
        causal_lm, tokenizer, front_end.label_token_ids, config.model, front_end.score_mode
    )
    return front_end, engine


def _server_parts(config: ScorerConfig, server: ServerSettings) -> tuple[ScoringFrontEnd, ScoringBackend]:
    from genscore_core.remote import make_backend

    return ScoringFrontEnd.for_server(config), make_backend(server)
