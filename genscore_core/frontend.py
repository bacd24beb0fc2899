"""The front end: templates and protocol requests in, checked :class:`ScoringJob` s out.

It owns everything that happens before a backend sees token ids: the tokenizer, the template and its
label ids, the length budget, truncation, input checks and grouping (query, document) pairs into one
job per distinct query. It runs no model, so it is the same whether the scores come from this
machine, from a server, or from ``genscore serve``'s batcher.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from genscore_core.backend import JobPart, JobTexts, ScoringJob, StreamedJob
from genscore_core.calibration import Calibration, calibration_path
from genscore_core.config import ScorerConfig
from genscore_core.errors import InvalidRequestError, PromptTooLongError
from genscore_core.loading import check_label_ids, check_template_ids, load_tokenizer
from genscore_core.long_documents import (
    WindowedPairs,
    cap_to_tokens,
    past_text_limit,
    refuse_by_length,
    refuse_each_by_length,
    token_spans,
    window_spans,
)
from genscore_core.prepared import PreparedPairs, PreparedScore, scores_in_input_order
from genscore_core.prompts import (
    EncodedPrompt,
    PromptSummary,
    TemplatePromptBuilder,
    bounded_texts,
    build_raw_prompts,
)
from genscore_core.protocol import GenerativeScoringRequest, check_request, check_text
from genscore_core.recipes import Recipe, resolve_recipe
from genscore_core.request_life import TokenizerLock
from genscore_core.templates import ScoreMode, Span, resolve_label_ids

FIRST_PART_CHARS = 24_000
"""Characters of documents in a query's first part: 3-6k Qwen3 tokens of English, a millisecond or
two of tokenization before the first batch can fill."""
PART_CHARS = 64_000
"""Characters of documents in each later part."""
STREAM_MIN_CHARS = 65_536
"""Calls with fewer characters of documents are built whole, then scored (:meth:`PairStream.streams`):
with 10-20k tokens there is little to overlap, and parts would only add a batch."""


class ScoringFrontEnd:
    """Builds the prompts of one tokenizer, template and length budget.

    Args:
        tokenizer: A fast (Rust) Hugging Face tokenizer.
        config: The scorer's settings (``template``, ``instruction``, ``query_share``, ``model``...).
        max_length: Longest prompt in tokens (``config.prompt.max_length`` or what the model supports).
        vocab_size: Token ids the model reads and scores (its embedding and LM head rows), or a
            function giving them at each call (a local model may be resized after the build): no
            prompt or label may hold an id beyond them.
    """

    def __init__(
        self, tokenizer: Any, config: ScorerConfig, *, max_length: int, vocab_size: int | Callable[[], int]
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self._vocab_size: Callable[[], int] = vocab_size if callable(vocab_size) else lambda: vocab_size
        self.recipe: Recipe = resolve_recipe(config.prompt.template, config.model, tokenizer)
        """The template in use and why it was picked (``recipe.source``, also logged)."""
        self.template = self.recipe.template
        self.label_token_ids = resolve_label_ids(tokenizer, self.template)
        check_label_ids(
            tokenizer,
            [str(label) for label in self.template.labels],
            self.label_token_ids,
            self.vocab_size,
            by_id=bool(self.template.label_token_ids),
        )
        self.calibration: Calibration | None = None
        """With ``score_mode="calibrated"``: what maps the scores of :attr:`score_mode` to probabilities."""
        mode = config.prompt.score_mode
        if mode == "calibrated":
            self.calibration = Calibration.load(calibration_path(config.model, config.prompt.calibration))
            mode = self.calibration.score_mode
        self.score_mode: ScoreMode = resolve_score_mode(
            mode, self.template.score_mode, len(self.label_token_ids)
        )
        if config.prompt.max_length is None and self.recipe.max_length is not None:
            max_length = min(max_length, self.recipe.max_length)
        self.max_length = max_length
        # Rust tokenizers are not safe to call from several threads at once.
        # A TokenizerLock also drops requests abandoned while they waited for it (genscore serve).
        self._tokenizer_lock = cast(threading.Lock, TokenizerLock())
        self._builder = TemplatePromptBuilder(
            tokenizer,
            self.template,
            max_length=max_length,
            instruction=config.prompt.instruction,
            query_share=config.prompt.query_share,
            tokenizer_lock=self._tokenizer_lock,
            vocab_size=self._vocab_size,
        )
        builder = self._builder
        check_template_ids(
            tokenizer,
            self.template.name,
            builder.bos_ids + builder.prefix_ids + builder.suffix_ids,
            self.vocab_size,
        )

    def with_instruction(self, instruction: str | None) -> ScoringFrontEnd:
        """This front end writing ``instruction`` into its prompts instead of its own.

        The copy shares the tokenizer (and its lock), template, labels, score mode and length budget;
        only the prompt builder is new. ``None`` is the template's default instruction. A server uses
        it for a request's own instruction (``genscore serve``'s ``instruction`` field).

        Raises:
            InvalidRequestError: The template has no ``{instruction}`` slot (``param="instruction"``),
                or the instruction leaves no room for a document.
        """
        if instruction and not self.template.takes_instruction:
            raise InvalidRequestError(
                f"instruction: template {self.template.name!r} has no {{instruction}} slot, so it cannot "
                "take an instruction; leave instruction out, or serve a template that takes one",
                param="instruction",
            )
        other = copy.copy(self)
        prompt = self.config.prompt.model_copy(update={"instruction": instruction})
        other.config = self.config.model_copy(update={"prompt": prompt})
        try:
            other._builder = TemplatePromptBuilder(
                self.tokenizer,
                self.template,
                max_length=self.max_length,
                instruction=instruction,
                query_share=self.config.prompt.query_share,
                tokenizer_lock=self._tokenizer_lock,
                vocab_size=self._vocab_size,
            )
        except ValueError as error:  # the instruction alone fills the prompt
            raise InvalidRequestError(f"instruction: {error}", param="instruction") from error
        return other

    @property
    def vocab_size(self) -> int:
        """Token ids the model reads and scores now."""
        return self._vocab_size()

    @property
    def tokenizer_waiting(self) -> int:
        """Threads waiting for the tokenizer now (a server reports it in ``/stats``)."""
        lock = self._tokenizer_lock
        return lock.waiting if isinstance(lock, TokenizerLock) else 0

    @property
    def tokenizing(self) -> bool:
        """Whether a thread holds or waits for the tokenizer now: a request is being prepared."""
        lock = self._tokenizer_lock
        return lock.locked() or (isinstance(lock, TokenizerLock) and lock.waiting > 0)

    @classmethod
    def for_server(cls, config: ScorerConfig) -> ScoringFrontEnd:
        """The front end of a model whose weights stay on a server: limits come from its config files."""
        from genscore_core.remote import model_limits

        tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        vocab_size, max_length = model_limits(
            config.model, tokenizer, trust_remote_code=config.trust_remote_code
        )
        return cls(
            tokenizer, config, max_length=config.prompt.max_length or max_length, vocab_size=vocab_size
        )

    # -- protocol requests ---------------------------------------------------------------------------

    def prepare_score(self, request: GenerativeScoringRequest | Mapping[str, Any]) -> PreparedScore:
        """Check a protocol request and build its prompts (one job, no texts: raw token prompts).

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

    # -- templated (query, document) pairs -----------------------------------------------------------

    def encode(self, query: str, documents: Sequence[str]) -> list[EncodedPrompt]:
        """The templated, truncated prompts of ``documents`` for ``query``."""
        check_text(query, "query")
        check_documents(documents)
        for index, document in enumerate(documents):
            check_text(document, "documents", index)
        if not documents:
            return []
        return self._builder.build(query, documents)

    def prepare_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        max_tokens_per_doc: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> PreparedPairs:
        """Templated prompts of (query, document) pairs, one job per distinct query.

        Each job carries its texts too, so a backend that templates on its own side (``/v1/rerank``)
        can score it. ``max_tokens_per_doc`` first cuts each document after that many of its own
        tokens; with ``long_documents="chunk"``, a document that does not fit is then scored as
        overlapping windows (:mod:`genscore_core.long_documents`).

        ``max_prompt_tokens`` (``genscore serve``'s ``--max-prompt-tokens``) bounds what the
        chunked documents of the call may cost: a document whose tokens take the call past it is
        refused as soon as that is known (from its length in characters, else while it is
        tokenized), before the rest of it is tokenized or split. Truncation needs no such bound: each
        of its prompts holds at most ``max_length`` tokens.
        """
        check_pairs(pairs)
        check_token_count(max_tokens_per_doc, "max_tokens_per_doc")
        check_token_count(max_prompt_tokens, "max_prompt_tokens")
        if max_tokens_per_doc is None and self.config.prompt.long_documents == "truncate":
            return self._prepare_whole(pairs)
        documents = [document for _, document in pairs]
        capped = [False] * len(pairs)
        offsets: list[list[tuple[int, int]]] | None = None
        if max_tokens_per_doc is not None:
            # Only the first max_tokens_per_doc tokens are kept: tokenize no more text than holds them.
            documents = bounded_texts(self.tokenizer, documents, max_tokens_per_doc, self._tokenizer_lock)
            offsets = token_spans(self.tokenizer, self._tokenizer_lock, documents)
            capped = [len(o) > max_tokens_per_doc for o in offsets]
            documents = [cap_to_tokens(d, o, max_tokens_per_doc) for d, o in zip(documents, offsets)]
            offsets = [o[:max_tokens_per_doc] for o in offsets]
        if self.config.prompt.long_documents == "truncate":
            windowed: list[tuple[str, str]] = [(q, d) for (q, _), d in zip(pairs, documents)]
            return WindowedPairs(
                **vars(self._prepare_whole(windowed)),
                owners=list(range(len(pairs))),
                spans=[None] * len(pairs),
                pair_count=len(pairs),
                aggregation=self.config.prompt.chunk_aggregation,
                capped=capped,
            )
        return self._prepare_chunked(pairs, documents, offsets, capped, max_prompt_tokens)

    def _prepare_chunked(
        self,
        pairs: Sequence[tuple[str, str]],
        documents: list[str],
        offsets: list[list[tuple[int, int]]] | None,
        capped: list[bool],
        budget: int | None,
    ) -> WindowedPairs:
        """``long_documents="chunk"``: a document that fits is scored whole, as truncation would
        score it; one that does not is split into windows, each scored with the query as truncation
        keeps it (:meth:`TemplatePromptBuilder.shortened_query`)."""
        builder = self._builder
        if budget is not None:
            refuse_by_length(self.tokenizer, documents, budget)
        built = builder.build_pairs_marked([(query, d) for (query, _), d in zip(pairs, documents)])
        whole = {p: prompt for p, (prompt, cut) in enumerate(built) if not cut}
        long = [p for p in range(len(pairs)) if p not in whole]
        cap = self.config.prompt.chunk_max_tokens
        if offsets is None:
            if cap is not None:
                refuse_each_by_length(self.tokenizer, [documents[p] for p in long], cap, names=long)
            long_offsets = token_spans(
                self.tokenizer,
                self._tokenizer_lock,
                [documents[p] for p in long],
                limit=budget,
                names=long,
                text_limit=cap,
            )
        else:
            long_offsets = [offsets[p] for p in long]
            for position, doc_offsets in zip(long, long_offsets):
                if cap is not None and len(doc_offsets) > cap:  # max_tokens_per_doc above the cap
                    raise past_text_limit(position, cap)
        windows: dict[int, tuple[str, list[Span], list[EncodedPrompt]]] = {}
        queries: dict[str, tuple[str, bool, int]] = {}
        total = sum(len(prompt.token_ids) for prompt in whole.values())
        for position, doc_offsets in zip(long, long_offsets):
            query = pairs[position][0]
            if query not in queries:
                short, query_cut = builder.shortened_query(query)
                # What the prompt leaves for the document: the prompt with an empty one is all the rest.
                [empty] = builder.build(short, [""], indices=[position])
                queries[query] = (short, query_cut, self.max_length - len(empty.token_ids))
            short, query_cut, room = queries[query]
            if room < 1:
                raise PromptTooLongError(
                    f"the query and template leave no room for documents[{position}] within "
                    f"max_length={self.max_length}",
                    param="documents",
                    index=position,
                )
            spans, prompts = self._windows(
                short, documents[position], doc_offsets, room, position, budget, total
            )
            total += sum(len(prompt.token_ids) for prompt in prompts)
            windows[position] = (short, spans, prompts)
            capped[position] = capped[position] or query_cut
        windowed: list[tuple[str, str]] = []
        built_prompts: list[EncodedPrompt] = []
        owners: list[int] = []
        spans_of_windows: list[Span | None] = []
        for position, document in enumerate(documents):
            if position in whole:
                windowed.append((pairs[position][0], document))
                built_prompts.append(whole[position])
                owners.append(position)
                spans_of_windows.append(Span(0, len(document)))
                continue
            short, spans, prompts = windows[position]
            windowed.extend((short, document[span.start : span.end]) for span in spans)
            built_prompts.extend(prompts)
            owners.extend([position] * len(spans))
            spans_of_windows.extend(spans)
        return WindowedPairs(
            **vars(self._assembled(windowed, built_prompts)),
            owners=owners,
            spans=spans_of_windows,
            pair_count=len(pairs),
            aggregation=self.config.prompt.chunk_aggregation,
            capped=capped,
        )

    def _windows(
        self,
        query: str,
        document: str,
        offsets: list[tuple[int, int]],
        room: int,
        index: int,
        budget: int | None,
        spent: int,
    ) -> tuple[list[Span], list[EncodedPrompt]]:
        """The windows of a document that does not fit, and their prompts, each holding its window
        whole. Windows are sized in the document's own tokens; in the prompt, a window's first token
        can merge with the template text before it (or CJK text split differently), so a window
        whose prompt still had to be cut makes every window smaller and the split is made again."""
        size, shrink = room, 1
        overhead = self.max_length - room - 1  # the empty prompt's space token can merge away
        while True:
            spans = window_spans(document, offsets, size, self.config.prompt.chunk_overlap)
            if budget is not None and spent + len(offsets) + len(spans) * overhead > budget:
                raise PromptTooLongError(
                    f"documents[{index}] makes {len(spans)} windows of at least {len(offsets)} tokens in "
                    f"all with their templates, more than this call's prompts may hold ({budget} tokens "
                    "in all); shorten it or split the request",
                    param="documents",
                    index=index,
                )
            texts = [document[span.start : span.end] for span in spans]
            built = self._builder.build_marked(query, texts, indices=[index] * len(spans))
            if not any(cut for _, cut in built):
                return spans, [prompt for prompt, _ in built]
            size -= shrink
            shrink *= 2
            if size < 1:
                raise PromptTooLongError(
                    f"documents[{index}] cannot be cut into windows that fit max_length={self.max_length}",
                    param="documents",
                    index=index,
                )

    def _assembled(self, pairs: Sequence[tuple[str, str]], prompts: Sequence[EncodedPrompt]) -> PreparedPairs:
        """Built prompts of ``pairs`` (in order) grouped into one job per distinct query."""
        by_query: dict[str, list[int]] = {}
        for position, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(position)
        jobs = [
            ScoringJob(
                [prompts[p].token_ids for p in positions],
                self.label_token_ids,
                apply_softmax=self.score_mode != "vocab-softmax",
                texts=JobTexts(query, tuple(pairs[p][1] for p in positions)),
                score_mode=self.score_mode,
                logit_temperature=self.template.logit_temperature,
            )
            for query, positions in by_query.items()
        ]
        return PreparedPairs(
            positions=list(by_query.values()), prompts=list(prompts), jobs=jobs, calibration=self.calibration
        )

    def _prepare_whole(
        self, pairs: Sequence[tuple[str, str]], owners: Sequence[int] | None = None
    ) -> PreparedPairs:
        """One job per distinct query; errors name a pair by its position in ``pairs``, or by
        ``owners[position]`` (the caller's pair a window was cut from)."""
        # Every pair in one build: one tokenizer call whatever the number of distinct queries.
        prompts = self._builder.build_pairs(pairs, indices=owners)
        return self._assembled(pairs, prompts)

    def stream_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        first_part_chars: int = FIRST_PART_CHARS,
        part_chars: int = PART_CHARS,
    ) -> PairStream:
        """The prompts of (query, document) pairs as :meth:`prepare_pairs` builds them (whole
        documents, ``long_documents="truncate"``), made part by part when the stream's
        :meth:`~PairStream.parts` are taken, so that a local engine scores early parts while later
        ones are tokenized. Every pair is checked here, before any part is made. A query's documents
        go in parts of about ``part_chars`` characters, the first of ``first_part_chars``.
        """
        check_pairs(pairs)
        return PairStream(self, pairs, first_part_chars=first_part_chars, part_chars=part_chars)

    def prepare_rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        max_tokens_per_doc: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> PreparedPairs:
        """The one job of reranking ``documents`` for ``query`` (``max_prompt_tokens``: see
        :meth:`prepare_pairs`)."""
        check_text(query, "query")
        check_documents(documents)
        return self.prepare_pairs(
            [(query, document) for document in documents],
            max_tokens_per_doc=max_tokens_per_doc,
            max_prompt_tokens=max_prompt_tokens,
        )


def pair_parts(
    documents: Sequence[Sequence[str]],
    first_part_chars: int = FIRST_PART_CHARS,
    part_chars: int = PART_CHARS,
) -> Iterator[list[tuple[int, int, int]]]:
    """Parts of the documents of several jobs (``documents[j]``: job ``j``'s, in order), each a list
    of ``(job, start, stop)`` ranges of about ``part_chars`` characters, the first of
    ``first_part_chars``. A part may hold many jobs (distinct queries of one document each), so
    that one tokenizer call builds it; a job's first range holds at least two of its documents (so
    that it shows the prefix its prompts share)."""
    part: list[tuple[int, int, int]] = []
    chars, limit = 0, first_part_chars
    for job, texts in enumerate(documents):
        start = 0
        while start < len(texts):
            stop, minimum = start, 2 if start == 0 else 1
            while stop < len(texts) and (chars < limit or stop - start < minimum):
                chars += len(texts[stop])
                stop += 1
            part.append((job, start, stop))
            start = stop
            if chars >= limit:
                yield part
                part, chars, limit = [], 0, part_chars
    if part:
        yield part


class PairStream:
    """(query, document) pairs whose prompts are built part by part (:meth:`ScoringFrontEnd.stream_pairs`).

    :attr:`jobs` says what the engine scores (one job per distinct query); :meth:`parts` builds
    the prompts, and :meth:`assemble` puts the scores back in input order once they have all
    been built.
    """

    def __init__(
        self,
        front_end: ScoringFrontEnd,
        pairs: Sequence[tuple[str, str]],
        *,
        first_part_chars: int = FIRST_PART_CHARS,
        part_chars: int = PART_CHARS,
    ) -> None:
        self._front_end = front_end
        self._part_chars = (first_part_chars, part_chars)
        by_query: dict[str, list[int]] = {}
        for position, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(position)
        self._queries = list(by_query)
        self._documents = [[pairs[p][1] for p in positions] for positions in by_query.values()]
        self.positions = list(by_query.values())
        self.streams = sum(len(document) for _, document in pairs) >= STREAM_MIN_CHARS
        """Whether the call is large enough to be scored part by part (else prepare it whole)."""
        self.prompts: list[PromptSummary | None] = [None] * len(pairs)
        """What the results report of each pair's prompt; its token ids go only to the engine."""
        mode = front_end.score_mode
        temperature = front_end.template.logit_temperature
        self.jobs = [
            StreamedJob(len(p), front_end.label_token_ids, mode, temperature) for p in self.positions
        ]

    def parts(self) -> Iterator[JobPart]:
        """Each query's prompts in parts, in order; a document that cannot fit raises
        :class:`~genscore_core.errors.PromptTooLongError` with its pair's index, as
        :meth:`ScoringFrontEnd.prepare_pairs` does."""
        builder = self._front_end._builder
        for ranges in pair_parts(self._documents, *self._part_chars):
            pairs = [
                (self._queries[j], d) for j, start, stop in ranges for d in self._documents[j][start:stop]
            ]
            names = [p for j, start, stop in ranges for p in self.positions[j][start:stop]]
            built = deque(builder.build_pairs(pairs, indices=names))
            for job, start, stop in ranges:
                prompts = [built.popleft() for _ in range(stop - start)]
                for position, prompt in zip(self.positions[job][start:stop], prompts):
                    self.prompts[position] = PromptSummary.of(prompt)
                # The part holds the only reference to the ids left: whoever takes the parts (the
                # engine's producer thread) frees them once it has copied them into its buffers.
                yield JobPart(job, [prompt.token_ids for prompt in prompts])

    def assemble(self, scores: list[list[float]]) -> list[tuple[float, PromptSummary]]:
        """(score, prompt summary) of each pair in input order, once every part was built."""
        prompts = [prompt for prompt in self.prompts if prompt is not None]
        if len(prompts) != len(self.prompts):
            raise RuntimeError("the pair stream was not taken to its end")
        calibration = self._front_end.calibration
        if calibration is not None:
            scores = [calibration.apply(job_scores) for job_scores in scores]
        return scores_in_input_order(self.positions, prompts, scores)


def check_token_count(value: object, param: str) -> None:
    """``value`` is None or a positive integer (a count of tokens), else InvalidRequestError naming ``param``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidRequestError(f"{param} must be a positive integer, got {value!r}", param=param)


def check_documents(documents: Sequence[str]) -> None:
    """``documents`` is a list of texts, not one text (whose characters would each be scored), and
    each of them valid text."""
    if isinstance(documents, (str, bytes)):
        raise InvalidRequestError(
            f"documents must be a list of texts, got {type(documents).__name__}; pass one document as "
            "[document]",
            param="documents",
        )
    # Here, not only in check_pairs: a reranked document is documents[i] to its caller, not a pair.
    for position, document in enumerate(documents):
        check_text(document, "documents", position)


def check_pairs(pairs: Sequence[tuple[str, str]]) -> None:
    """Each pair is a (query, document) pair of texts (InvalidRequestError naming the first bad one)."""
    if isinstance(pairs, (str, bytes)):
        raise InvalidRequestError(
            f"pairs must be a list of (query, document) pairs, got {type(pairs).__name__}", param="pairs"
        )
    for position, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidRequestError(
                f"pairs[{position}] is not a (query, document) pair: got {_what_it_is(pair)}",
                param="pairs",
                index=position,
            )
        # Named as the caller passed them: a bad score of the same pair is "pairs[3]" too.
        check_text(pair[0], "pairs", position, where=f"pairs[{position}][0] (the query)")
        check_text(pair[1], "pairs", position, where=f"pairs[{position}][1] (the document)")


def _what_it_is(value: object) -> str:
    """What a caller passed where a pair was due, for an error: its type, and a sequence's length."""
    kind = type(value).__name__
    if isinstance(value, (tuple, list)):
        return f"a {kind} of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, str):
        return f"the str {value[:40]!r}{'...' if len(value) > 40 else ''} (pass (query, document) tuples)"
    return f"a {kind}"


def resolve_score_mode(setting: str, template_mode: ScoreMode, labels: int) -> ScoreMode:
    """The score mode a ``score_mode`` setting asks for (``"auto"``: the template's), checked against
    the number of labels."""
    mode: ScoreMode = template_mode if setting == "auto" else setting  # type: ignore[assignment]
    if mode in ("label-softmax", "expected-grade") and labels < 2:
        raise ValueError(
            f"score_mode {mode!r} normalises over the label tokens and needs two or more; this "
            "template has one label: use 'logit' (its raw logit) or 'logit-sigmoid'"
        )
    return mode
