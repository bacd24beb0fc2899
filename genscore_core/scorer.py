"""``GenerativeScorer``: the one entry point of genscore's engine."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm  # not tqdm.auto: notebooks without ipywidgets would warn on import

from genscore_core.config import DEFAULT_MODEL, ScorerConfig
from genscore_core.engine import ScoringEngine, ScoringJob, select_forward
from genscore_core.errors import InvalidRequestError
from genscore_core.loading import (
    load_causal_lm,
    load_tokenizer,
    model_max_length,
    resolve_device,
    resolve_dtype,
)
from genscore_core.prepared import PreparedPairs, PreparedScore
from genscore_core.prompts import EncodedPrompt, TemplatePromptBuilder, build_raw_prompts
from genscore_core.protocol import (
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    check_request,
)
from genscore_core.remote.base import RemoteBackend, ScoringBackend
from genscore_core.results import RankedResults, check_rank_options, rank_results
from genscore_core.scoring import LabelHead
from genscore_core.templates import get_template, resolve_label_ids


def scorer_setting_names() -> frozenset[str]:
    """Keyword names that configure a new :class:`GenerativeScorer`: ``model``, ``config`` and the
    fields of :class:`ScorerConfig`. Adapters use it to tell scorer settings from their own options."""
    return frozenset({"model", "config", *ScorerConfig.model_fields})


class GenerativeScorer:
    """Scores (query, document) pairs by a causal LM's next-token label probabilities.

    Example:
        >>> scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B")  # doctest: +SKIP
        >>> ranked = scorer.rerank("capital of France", ["Berlin is...", "Paris is..."], top_n=1)
        >>> ranked[0].index  # doctest: +SKIP
        1

    With ``server_url=`` it scores through a server (``genscore serve``, vLLM, SGLang, ``/v1/rerank``)
    instead of loading the weights; prompts are still built here, so ``model`` must name the tokenizer,
    and the scores equal local ones (see ``docs/scaling.md``)::

        scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B", server_url="http://127.0.0.1:8000")

    Args:
        model: Hub id or local folder of a causal LM (default ``Qwen/Qwen3-Reranker-0.6B``).
        config: A ready :class:`ScorerConfig`; or pass its fields as keyword arguments.
        **settings: Fields of :class:`ScorerConfig` (``template``, ``instruction``, ``max_length``,
            ``device``, ``dtype``, ``max_batch_tokens``, ``server_url``, ``server_kind``, ...). Unknown
            names are rejected.
    """

    def __init__(
        self, model: str | None = None, *, config: ScorerConfig | None = None, **settings: Any
    ) -> None:
        config = _make_config(model, config, settings)
        if config.server_url is not None:
            self._setup_remote(config)
            return
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        loaded = load_causal_lm(
            config.model,
            device=device,
            dtype=dtype,
            trust_remote_code=config.trust_remote_code,
            show_progress=config.show_progress,
        )
        self._setup(loaded, tokenizer, config)

    @classmethod
    def from_model(cls, causal_lm: Any, tokenizer: Any, **settings: Any) -> GenerativeScorer:
        """Wrap a causal LM and tokenizer that are already loaded (no copy is made).

        ``settings`` are :class:`ScorerConfig` fields; ``model`` only names the model in responses.
        """
        name = settings.pop("model", None) or getattr(causal_lm, "name_or_path", None) or DEFAULT_MODEL
        config = ScorerConfig(model=name, **settings)
        scorer = cls.__new__(cls)
        scorer._setup(causal_lm.eval(), tokenizer, config)
        return scorer

    def _setup(self, model: Any, tokenizer: Any, config: ScorerConfig) -> None:
        self.model = model
        self._setup_prompts(tokenizer, config, config.max_length or model_max_length(model, tokenizer))
        head = LabelHead(model)
        self.vocab_size = head.vocab_size
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._engine: ScoringEngine | None = ScoringEngine(select_forward(model, config, pad_id or 0), head)
        self.backend: ScoringBackend = self._engine
        self._remote: RemoteBackend | None = None

    def _setup_remote(self, config: ScorerConfig) -> None:
        from genscore_core.remote import make_backend, model_limits

        tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        vocab_size, max_length = model_limits(
            config.model, tokenizer, trust_remote_code=config.trust_remote_code
        )
        self.model = None
        self._setup_prompts(tokenizer, config, config.max_length or max_length)
        self.vocab_size = vocab_size
        self._engine = None
        self._remote = make_backend(config)
        self.backend = self._remote

    def _setup_prompts(self, tokenizer: Any, config: ScorerConfig, max_length: int) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.template = get_template(config.template, config.model)
        self.label_token_ids = resolve_label_ids(tokenizer, self.template.label_words)
        self.max_length = max_length
        self._tokenizer_lock = threading.Lock()
        self._builder = TemplatePromptBuilder(
            tokenizer,
            self.template,
            max_length=self.max_length,
            instruction=config.instruction,
            query_share=config.query_share,
            tokenizer_lock=self._tokenizer_lock,
        )

    @property
    def engine(self) -> ScoringEngine:
        """The local engine; a scorer that scores through a server has none."""
        if self._engine is None:
            raise AttributeError(
                f"this scorer scores through {self.config.server_url} and has no local engine; "
                "use scorer.backend"
            )
        return self._engine

    # -- the protocol -------------------------------------------------------------------------------

    def score(self, request: GenerativeScoringRequest | Mapping[str, Any]) -> GenerativeScoringResponse:
        """Answer a generative scoring request (vLLM's ``/generative_scoring`` semantics)."""
        prepared = self.prepare_score(request)
        [scores] = self._run([prepared.job])
        return prepared.response(scores)

    def prepare_score(self, request: GenerativeScoringRequest | Mapping[str, Any]) -> PreparedScore:
        """Check a request and build its prompts without scoring them (a server batches the jobs).

        Raises:
            InvalidRequestError: What the protocol answers with HTTP 400.
            pydantic.ValidationError: A mapping that is not a request (HTTP 422).
        """
        if not isinstance(request, GenerativeScoringRequest):
            request = GenerativeScoringRequest.model_validate(request)
        check_request(request, self.vocab_size)
        prompts = build_raw_prompts(
            self.tokenizer, request, max_length=self.max_length, tokenizer_lock=self._tokenizer_lock
        )
        job = ScoringJob([p.token_ids for p in prompts], request.label_token_ids, request.apply_softmax)
        return PreparedScore(prompts, job, request.model or self.config.model)

    # -- reranking with the template ----------------------------------------------------------------

    def encode(self, query: str, documents: Sequence[str]) -> list[EncodedPrompt]:
        """The templated, truncated prompts that :meth:`rerank` scores."""
        _check_text(query, "query")
        for index, document in enumerate(documents):
            _check_text(document, "documents", index)
        return self._builder.build(query, documents)

    def score_documents(self, query: str, documents: Sequence[str]) -> list[float]:
        """Score of each document for ``query``, in input order."""
        return self.score_pairs([(query, d) for d in documents])

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Score of each (query, document) pair, in input order; pairs may mix queries."""
        return [score for score, _ in self._score_pairs(pairs)]

    def prepare_pairs(self, pairs: Sequence[tuple[str, str]]) -> PreparedPairs:
        """Build the templated prompts of (query, document) pairs without scoring them."""
        by_query: dict[str, list[int]] = {}
        for position, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidRequestError(f"pair {position} is not a (query, document) pair", index=position)
            by_query.setdefault(pair[0], []).append(position)
        encoded: dict[int, EncodedPrompt] = {}
        documents: list[list[str]] = []
        jobs = []
        for query, positions in by_query.items():
            documents.append([pairs[p][1] for p in positions])
            prompts = self.encode(query, documents[-1])
            encoded.update(zip(positions, prompts))
            jobs.append(ScoringJob([p.token_ids for p in prompts], self.label_token_ids))
        return PreparedPairs(
            queries=list(by_query),
            documents=documents,
            positions=list(by_query.values()),
            prompts=[encoded[position] for position in range(len(pairs))],
            jobs=jobs,
        )

    def _score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, EncodedPrompt]]:
        prepared = self.prepare_pairs(pairs)
        if self._remote is not None and not self._remote.accepts_token_ids:
            # A text-only server applies its own template: send the texts, not the prompts.
            remote = self._remote
            scores = [remote.score_texts(q, d) for q, d in zip(prepared.queries, prepared.documents)]
            return prepared.assemble(scores)
        return prepared.assemble(self._run(prepared.jobs))

    async def _ascore_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, EncodedPrompt]]:
        remote = self._remote
        if remote is None:
            return await asyncio.to_thread(self._score_pairs, pairs)
        prepared = await asyncio.to_thread(self.prepare_pairs, pairs)
        if remote.accepts_token_ids:
            return prepared.assemble(await remote.ascore_jobs(prepared.jobs))
        scores = await asyncio.gather(
            *(remote.ascore_texts(q, d) for q, d in zip(prepared.queries, prepared.documents))
        )
        return prepared.assemble(list(scores))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        score_threshold: float | None = None,
    ) -> RankedResults:
        """Documents best first (ties in input order), at most ``top_n``, none below ``score_threshold``."""
        check_rank_options(top_n, score_threshold)
        scored = self._score_pairs([(query, d) for d in documents])
        return rank_results(query, documents, scored, top_n=top_n, score_threshold=score_threshold)

    # -- async --------------------------------------------------------------------------------------

    async def ascore(
        self, request: GenerativeScoringRequest | Mapping[str, Any]
    ) -> GenerativeScoringResponse:
        if self._remote is None:
            return await asyncio.to_thread(self.score, request)
        prepared = await asyncio.to_thread(self.prepare_score, request)
        [scores] = await self._remote.ascore_jobs([prepared.job])
        return prepared.response(scores)

    async def ascore_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return [score for score, _ in await self._ascore_pairs(pairs)]

    async def arerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        score_threshold: float | None = None,
    ) -> RankedResults:
        """:meth:`rerank` without blocking the event loop (a worker thread, or async HTTP for a server)."""
        check_rank_options(top_n, score_threshold)
        scored = await self._ascore_pairs([(query, d) for d in documents])
        return rank_results(query, documents, scored, top_n=top_n, score_threshold=score_threshold)

    # -- internals ----------------------------------------------------------------------------------

    def _run(self, jobs: list[ScoringJob]) -> list[list[float]]:
        total = sum(len(job.prompts) for job in jobs)
        with tqdm(
            total=total, disable=not self.config.show_progress, file=sys.stderr, desc="scoring", unit="doc"
        ) as bar:
            return self.backend.score_jobs(jobs, on_progress=bar.update)

    def close(self) -> None:
        """Close the connections of a server-backed scorer (nothing to do for a local model)."""
        if self._remote is not None:
            self._remote.close()

    def __enter__(self) -> GenerativeScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._remote is not None:
            return (
                f"GenerativeScorer(model={self.config.model!r}, server_url={self.config.server_url!r}, "
                f"server_kind={self.config.server_kind!r}, template={self.template.name!r}, "
                f"max_length={self.max_length})"
            )
        return (
            f"GenerativeScorer(model={self.config.model!r}, template={self.template.name!r}, "
            f"max_length={self.max_length}, device={self.model.device}, dtype={self.model.dtype})"
        )


def _make_config(model: str | None, config: ScorerConfig | None, settings: dict[str, Any]) -> ScorerConfig:
    if config is not None:
        if model is not None or settings:
            raise TypeError("pass either config= or model settings, not both")
        return config
    return ScorerConfig(model=model or DEFAULT_MODEL, **settings)


def _check_text(value: object, param: str, index: int | None = None) -> None:
    if not isinstance(value, str):
        where = f"{param}[{index}]" if index is not None else param
        raise InvalidRequestError(
            f"{where} must be a string, got {type(value).__name__}", param=param, index=index
        )
