"""Turning queries and items into token-id prompts: the protocol's raw mode and reranker templates."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genscore_core.errors import InvalidRequestError, PromptTooLongError
from genscore_core.protocol import GenerativeScoringRequest
from genscore_core.templates import PromptTemplate, RenderedBody
from genscore_core.token_pieces import PIECE_CHARS, joined, pieces_of, splits_exactly, worth_cutting
from genscore_core.truncation import (
    cut_to_token_budget,
    cut_where_settled,
    drop_tail_of_range,
    max_chars_per_token,
    query_token_cap,
    token_range,
    truncate_raw,
)

CUT_QUERY = 1
"""A prompt's query was shortened to fit (``TemplatePromptBuilder._fit``)."""
CUT_DOCUMENT = 2
"""A prompt's document was shortened to fit."""


@dataclass(frozen=True)
class EncodedPrompt:
    token_ids: list[int]
    truncated: bool
    """Whether the item (or query) was shortened to fit the maximum prompt length."""
    window: tuple[int, int] | None = None
    """Character span ``[start, end)`` of the document this prompt holds, when it holds a window of
    it (``long_documents="chunk"``); None when it holds the whole document."""
    windows: int = 1
    """How many windows the document was split into."""
    all_tokens: int | None = None
    """Tokens of every window's prompt (usage), when there were several."""

    @property
    def num_tokens(self) -> int:
        """Tokens of the prompt."""
        return len(self.token_ids)


@dataclass(frozen=True)
class PromptSummary:
    """What a result reports of an :class:`EncodedPrompt`, without its token ids.

    A streamed call keeps these instead of the prompts (``frontend.PairStream``): the ids then live
    only in the parts handed to the engine and are freed on its producer thread while the GPU runs.
    Kept to the call's end, W1's 256 prompts (about 100k Python ints) took 1-1.5 ms to free after
    the scores were in (docs/benchmarks.md, "Streaming text calls").
    """

    num_tokens: int
    truncated: bool
    window: tuple[int, int] | None = None
    windows: int = 1
    all_tokens: int | None = None

    @classmethod
    def of(cls, prompt: EncodedPrompt) -> PromptSummary:
        return cls(len(prompt.token_ids), prompt.truncated, prompt.window, prompt.windows, prompt.all_tokens)


class PromptInfo(Protocol):
    """What :func:`~genscore_core.results.rank_results` reads of a prompt: an :class:`EncodedPrompt`
    or a :class:`PromptSummary`."""

    @property
    def num_tokens(self) -> int: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def window(self) -> tuple[int, int] | None: ...
    @property
    def windows(self) -> int: ...
    @property
    def all_tokens(self) -> int | None: ...


Offsets = list[tuple[int, int]]
EncodedBody = tuple[list[int], Offsets]
"""A body's token ids, and each token's character span in the body text."""
CappedQuery = tuple[list[int], Offsets, RenderedBody]
"""A body whose query was shortened: its ids, offsets, and the body itself."""


class BodyTokenization:
    """How one template's body becomes token ids: the strategy its reference code uses.

    ``encode`` returns, per body, the ids and each token's character span in the body text, so that
    truncation can find the query's and the document's tokens whatever the strategy.
    """

    def __init__(self, tokenizer: Any, lock: threading.Lock) -> None:
        self.tokenizer = tokenizer
        self._lock = lock

    def _tokenize(self, texts: list[str]) -> tuple[list[list[int]], list[Offsets]]:
        with self._lock:
            encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]

    def encode(self, bodies: Sequence[RenderedBody]) -> list[EncodedBody]:
        raise NotImplementedError

    def cap_query(
        self, rebuild: Callable[[int], RenderedBody], body: RenderedBody, encoded: EncodedBody, cap: int
    ) -> CappedQuery | None:
        """Shorten the query to ``cap`` tokens; None when it already fits."""
        raise NotImplementedError

    always_caps_query = False
    """Whether the query is capped even when the whole prompt fits (the reference truncates it on
    its own, before it knows the document's length)."""


class WholeBody(BodyTokenization):
    """The filled body in one tokenizer call (Qwen3-Reranker's recipe): tokens may merge across the
    placeholder boundaries, exactly as the reference's do."""

    def encode(self, bodies: Sequence[RenderedBody]) -> list[EncodedBody]:
        ids, offsets = self._tokenize([body.text for body in bodies])
        return list(zip(ids, offsets))

    def cap_query(
        self, rebuild: Callable[[int], RenderedBody], body: RenderedBody, encoded: EncodedBody, cap: int
    ) -> CappedQuery | None:
        ids, offsets = encoded
        query_tokens = token_range(offsets, body.query)
        if query_tokens[1] - query_tokens[0] <= cap:
            return None
        # Cut the query text at a token boundary and tokenize the body again, so that the text
        # after the query keeps its own tokens.
        cut_at = offsets[query_tokens[0] + cap - 1][1] - body.query.start
        body = rebuild(max(cut_at, 0))
        [(ids, offsets)] = self.encode([body])
        return ids, offsets, body


class PieceByPiece(BodyTokenization):
    """Each piece in its own tokenizer call, ids concatenated (mixedbread's and FlagEmbedding's
    recipes): a piece boundary is always a token boundary, so "?" + "\\n" stay two tokens."""

    always_caps_query = True

    def encode(self, bodies: Sequence[RenderedBody]) -> list[EncodedBody]:
        pieces = [body.pieces() for body in bodies]
        # One call for every piece of every body: the tokenizer batches them in Rust.
        ids, offsets = self._tokenize([text for body in pieces for _, text in body])
        results = []
        position = 0
        for body in pieces:
            body_ids: list[int] = []
            body_offsets: Offsets = []
            for start, _ in body:
                body_ids.extend(ids[position])
                body_offsets.extend((start + a, start + b) for a, b in offsets[position])
                position += 1
            results.append((body_ids, body_offsets))
        return results

    def cap_query(
        self, rebuild: Callable[[int], RenderedBody], body: RenderedBody, encoded: EncodedBody, cap: int
    ) -> CappedQuery | None:
        # The reference truncates the whole piece holding the query (instruction and labels included)
        # to its first ``cap`` tokens; its tokens are those starting inside the piece.
        ids, offsets = encoded
        piece_start, text = body.pieces()[body.query_piece]
        # Pieces are tokenized alone, so each token lies inside one piece: count by start offsets.
        first = sum(1 for start, _ in offsets if start < piece_start)
        last = first + sum(
            1 for start, end in offsets if piece_start <= start and end <= piece_start + len(text)
        )
        if last - first <= cap:
            return None
        return ids[: first + cap] + ids[last:], offsets[: first + cap] + offsets[last:], body


def body_tokenization(template: PromptTemplate, tokenizer: Any, lock: threading.Lock) -> BodyTokenization:
    """The tokenization strategy a template states."""
    strategy = PieceByPiece if template.tokenization == "pieces" else WholeBody
    return strategy(tokenizer, lock)


class TemplatePromptBuilder:
    """Builds ``prefix + body + suffix`` prompts for one template, tokenizer and length budget.

    The body is tokenized the way the template's reference code does (:class:`WholeBody` for
    Qwen3-Reranker, :class:`PieceByPiece` for mxbai-rerank-v2 and bge-reranker-v2-gemma); character
    offsets then tell which tokens belong to the document and the query.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: PromptTemplate,
        *,
        max_length: int,
        instruction: str | None = None,
        query_share: float = 0.75,
        tokenizer_lock: threading.Lock | None = None,
        vocab_size: Callable[[], int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self._vocab_size = vocab_size
        self.instruction = instruction
        self.query_share = query_share
        self._lock = tokenizer_lock or threading.Lock()
        self.tokenization = body_tokenization(template, tokenizer, self._lock)
        with self._lock:
            self.prefix_ids: list[int] = tokenizer.encode(template.prefix, add_special_tokens=False)
            self.suffix_ids: list[int] = [
                token
                for piece in (template.suffix_pieces or (template.suffix,))
                for token in tokenizer.encode(piece, add_special_tokens=False)
            ]
        self.bos_ids: list[int] = []
        if template.bos:
            if tokenizer.bos_token_id is None:
                raise ValueError(
                    f"template {template.name!r} starts with the BOS token, but this tokenizer has none; "
                    "set tokenizer.bos_token or use a template without bos"
                )
            self.bos_ids = [tokenizer.bos_token_id]
        self.max_length = max_length
        self._no_fixed_tokens = not (self.prefix_ids or self.suffix_ids or self.bos_ids)
        """Whether a prompt is only its body, so that an empty query and document leave it empty."""
        self.body_budget = max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if self.body_budget - len(self.bos_ids) <= 0:
            raise ValueError(
                f"max_length={max_length} leaves no room for a body: template {template.name!r} alone takes "
                f"{len(self.prefix_ids) + len(self.suffix_ids) + len(self.bos_ids)} tokens"
            )
        # Fail early, not on the first request, if the template cannot take the instruction.
        empty = template.render_body("", "", instruction)
        # Nor a budget that no document fits in: it would be accepted here and refuse every document.
        [(body_ids, _)] = self.tokenization.encode([empty])
        fixed = len(self.bos_ids) + len(self.prefix_ids) + len(body_ids) + len(self.suffix_ids)
        if fixed > max_length:
            raise ValueError(
                f"max_length={max_length} leaves no room for a document: template {template.name!r} with "
                f"its instruction, an empty query and an empty document takes {fixed} tokens; raise "
                "max_length or shorten the instruction"
            )
        self._query_cap = self._cap_of_query(len(body_ids))

    def _cap_of_query(self, empty_body_tokens: int) -> int:
        """The most tokens the query keeps when a prompt has to be shortened.

        A piece-by-piece template's cap is its reference's: ``query_share`` of the body budget for
        the piece holding the query, instruction included. A whole-body template's query gets
        ``query_share`` of what the instruction and the body's own text leave: of the whole budget,
        a long instruction plus the query's share could leave no room for any document.
        """
        if self.tokenization.always_caps_query:
            return query_token_cap(self.body_budget, self.query_share)
        # ``empty_body_tokens``: the body with both placeholders empty, whose text around them can count
        # a token more than in a filled body (the space before the document merges into its first word).
        room = self.body_budget - len(self.bos_ids) - empty_body_tokens
        return query_token_cap(max(room, 1), self.query_share)

    def build(
        self, query: str, documents: Sequence[str], *, indices: Sequence[int] | None = None
    ) -> list[EncodedPrompt]:
        """The prompts of ``documents`` for ``query``; errors name ``documents[i]`` by ``indices[i]``
        (its position in the caller's list; ``i`` when not given)."""
        return [prompt for prompt, _ in self.build_marked(query, documents, indices=indices)]

    def build_marked(
        self, query: str, documents: Sequence[str], *, indices: Sequence[int] | None = None
    ) -> list[tuple[EncodedPrompt, bool]]:
        """:meth:`build`'s prompts, each with whether its document lost tokens to fit (a prompt is
        also ``truncated`` when only its query was shortened)."""
        return self.build_pairs_marked([(query, document) for document in documents], indices=indices)

    def build_pairs(
        self, pairs: Sequence[tuple[str, str]], *, indices: Sequence[int] | None = None
    ) -> list[EncodedPrompt]:
        """The prompts of (query, document) pairs of any queries, each as :meth:`build` makes it."""
        return [prompt for prompt, _ in self.build_pairs_marked(pairs, indices=indices)]

    def build_pairs_marked(
        self, pairs: Sequence[tuple[str, str]], *, indices: Sequence[int] | None = None
    ) -> list[tuple[EncodedPrompt, bool]]:
        """:meth:`build_marked` of (query, document) pairs of any queries, in one pass: the texts of
        every pair go to the tokenizer together, whose batch call runs on all cores, where a call a
        query would tokenize one document at a time when every query is distinct (``score_pairs``
        over 1,024 queries: docs/benchmarks.md, "Distinct queries")."""
        names = range(len(pairs)) if indices is None else indices
        # A reference that keeps only so many characters (zerank) shortens the texts before anything
        # else; such a prompt is reported truncated as one shortened to fit.
        query_cap, document_cap = self.template.query_max_chars, self.template.document_max_chars
        queries: dict[str, int] = {}  # each distinct query text, cut once: its place in ``texts``
        texts: list[str] = []
        places: list[tuple[int, bool]] = []  # (query's place in ``texts``, whether its chars were cut)
        for query, _ in pairs:
            if query not in queries:
                queries[query] = len(texts)
                texts.append(self.template.inserted(query, [])[0])
            places.append((queries[query], query_cap is not None and len(query) > query_cap))
        documents = [self.template.inserted("", [document])[1][0] for _, document in pairs]
        cut_by_chars = [document_cap is not None and len(document) > document_cap for _, document in pairs]
        bounded = bounded_texts(self.tokenizer, [*texts, *documents], self.body_budget, self._lock)
        texts, documents = bounded[: len(texts)], bounded[len(texts) :]
        bodies = [
            self.template.render_body(texts[place], document, self.instruction)
            for (place, _), document in zip(places, documents)
        ]
        prompts = []
        cuts = []
        for index, (body, (ids, offsets)) in enumerate(zip(bodies, self._encode(bodies))):
            query = texts[places[index][0]]
            body_ids, cut = self._fit(query, documents[index], body, ids, offsets, names[index])
            if self._no_fixed_tokens and not body_ids:
                raise self._empty_prompt(names[index])
            shortened = cut != 0 or places[index][1] or cut_by_chars[index]
            prompts.append(EncodedPrompt(self.prefix_ids + body_ids + self.suffix_ids, shortened))
            cuts.append(cut >= CUT_DOCUMENT or cut_by_chars[index])
        if self._vocab_size is not None:
            self._check_readable(prompts, self._vocab_size(), names)
        return list(zip(prompts, cuts))

    def shortened_query(self, query: str) -> tuple[str, bool]:
        """The query as a prompt whose document must be shortened keeps it, and whether it was cut.

        ``long_documents="chunk"`` scores every window of a document that does not fit with this
        query, as truncation would keep it. A piece-by-piece template's query comes back whole: its
        cap is applied to the ids of every prompt (:meth:`build`)."""
        query, _ = self.template.inserted(query, [])
        if self.tokenization.always_caps_query:
            return query, False
        [query] = bounded_texts(self.tokenizer, [query], self.body_budget, self._lock)
        body = self.template.render_body(query, "", self.instruction)
        [(ids, offsets)] = self.tokenization.encode([body])
        capped = self.tokenization.cap_query(
            lambda cut_at: self.template.render_body(query[:cut_at], "", self.instruction),
            body,
            (ids, offsets),
            self._query_cap,
        )
        if capped is None:
            return query, False
        short = capped[2]
        return short.text[short.query.start : short.query.end], True

    def _empty_prompt(self, index: int) -> InvalidRequestError:
        # A forward over no tokens has no last position: the padded forward read a pad row and
        # scored 0.5, the packed one failed with an IndexError.
        return InvalidRequestError(
            f"documents[{index}]: its prompt holds no token: the query and the document are empty (or "
            f"whitespace the tokenizer drops) and template {self.template.name!r} adds no text of its "
            "own; give a query or a document, or a template with a prefix or suffix",
            param="documents",
            index=index,
        )

    def _check_readable(self, prompts: list[EncodedPrompt], vocab_size: int, names: Sequence[int]) -> None:
        """Refuse a prompt holding a token id the model has no row for, naming its document.

        Only a tokenizer with more tokens than the model's vocabulary (not the model's own, or a
        model resized smaller after the scorer was built) can produce one; otherwise this costs a
        length comparison. Unchecked, such an id fails deep in the forward with an index error
        (on CUDA, a device-side assert that breaks every later call of the process).
        """
        tokenizer_size = len(self.tokenizer)
        if tokenizer_size <= vocab_size:
            return
        for index, prompt in enumerate(prompts):
            ids = prompt.token_ids
            if not ids or max(ids) < vocab_size:
                continue
            token_id = next(token for token in ids if token >= vocab_size)
            token = self.tokenizer.decode([token_id])
            where = f"documents[{names[index]}]"
            raise InvalidRequestError(
                f"{where}: its prompt holds token {token!r} (id {token_id}), outside the model's vocabulary "
                f"of {vocab_size} ids. The tokenizer has {tokenizer_size} tokens, more than the model reads: "
                "pass the model's own tokenizer, or resize the model's embeddings to this tokenizer "
                "(model.resize_token_embeddings(len(tokenizer)))",
                param="documents",
                index=names[index],
            )

    def _encode(self, bodies: list[RenderedBody]) -> list[tuple[list[int], Offsets]]:
        """Ids and offsets of each body; offsets only where :meth:`_fit` reads them.

        With the whole body in one call, most bodies fit the budget, and their token ids alone come
        from the tokenizer's batch call without offsets (a quarter cheaper on the Qwen3 tokenizer,
        nothing per token to convert); only the bodies over budget are tokenized again with offsets.
        """
        tokenization = self.tokenization
        if type(tokenization) is not WholeBody or tokenization.always_caps_query:
            return tokenization.encode(bodies)
        all_ids = token_ids_in_pieces(self.tokenizer, [body.text for body in bodies], tokenization._lock)
        room = self.body_budget - len(self.bos_ids)
        over = [i for i, ids in enumerate(all_ids) if len(ids) > room]
        results: list[tuple[list[int], Offsets]] = [(ids, []) for ids in all_ids]
        for i, encoded in zip(over, tokenization.encode([bodies[i] for i in over]) if over else []):
            results[i] = encoded
        return results

    def _fit(
        self,
        query: str,
        document: str,
        body: RenderedBody,
        ids: list[int],
        offsets: Offsets,
        index: int,
    ) -> tuple[list[int], int]:
        """The body's ids within the budget and what was shortened: 0 (nothing), :data:`CUT_QUERY`,
        or :data:`CUT_DOCUMENT` plus, when the query was shortened too, :data:`CUT_QUERY`."""
        # The BOS id has no characters: (0, 0) never overlaps the query or the document.
        ids = self.bos_ids + ids
        offsets = [(0, 0)] * len(self.bos_ids) + offsets
        budget = self.body_budget
        cut = 0
        if len(ids) > budget or self.tokenization.always_caps_query:
            capped = self.tokenization.cap_query(
                lambda cut_at: self.template.render_body(query[:cut_at], document, self.instruction),
                body,
                (ids[len(self.bos_ids) :], offsets[len(self.bos_ids) :]),
                self._query_cap,
            )
            if capped is not None:
                body_ids, body_offsets, body = capped
                ids = self.bos_ids + body_ids
                offsets = [(0, 0)] * len(self.bos_ids) + body_offsets
                cut = CUT_QUERY
        excess = len(ids) - budget
        if excess <= 0:
            return ids, cut
        while True:
            doc_tokens = token_range(offsets, body.document)
            # A document cut to no tokens at all would score the rest of the prompt alone.
            if excess >= max(doc_tokens[1] - doc_tokens[0], 1):
                raise self._cannot_fit(body, offsets, len(ids) - (doc_tokens[1] - doc_tokens[0]), index)
            if offsets[doc_tokens[1] - 1][1] <= body.document.end:
                return drop_tail_of_range(ids, doc_tokens, excess), cut + CUT_DOCUMENT
            # The document's last token runs on into the template text after it (a custom template
            # with text after {document}, "word \n" one token): dropping it would drop that text too.
            # Cut the document's text after the last token kept and tokenize the body again; its
            # tokens at the new end can differ, so check the budget again. The token kept can end
            # where the document does (bytes of one character): the document still loses a character,
            # so that each round shortens it.
            keep_end = min(offsets[doc_tokens[1] - excess - 1][1], body.document.end - 1)
            body, ids, offsets = self._with_document(body, keep_end - body.document.start)
            excess = len(ids) - budget
            if excess <= 0:
                # A prompt that fits now is kept: the round below would read a token that runs on
                # into the template text as the document's, and "keep" that text in the document.
                return ids, cut + CUT_DOCUMENT

    def _with_document(self, body: RenderedBody, chars: int) -> tuple[RenderedBody, list[int], Offsets]:
        """``body`` with its document cut to its first ``chars`` characters (the query as it is),
        tokenized: the body, its ids and offsets with the BOS in front, the query capped again."""
        query = body.text[body.query.start : body.query.end]
        document = body.text[body.document.start : body.document.start + chars]
        body = self.template.render_body(query, document, self.instruction)
        [(ids, offsets)] = self.tokenization.encode([body])
        if self.tokenization.always_caps_query:
            capped = self.tokenization.cap_query(
                lambda cut_at: self.template.render_body(query[:cut_at], document, self.instruction),
                body,
                (ids, offsets),
                self._query_cap,
            )
            if capped is not None:
                ids, offsets, body = capped
        return body, self.bos_ids + ids, [(0, 0)] * len(self.bos_ids) + offsets

    def _cannot_fit(
        self, body: RenderedBody, offsets: Offsets, without_document: int, index: int
    ) -> Exception:
        """The error for a prompt that is over budget even with no document tokens: it names the
        query when the prompt without it would leave room, else the instruction and template."""
        fixed = len(self.prefix_ids) + len(self.suffix_ids)
        query_start, query_end = token_range(offsets, body.query)
        if without_document - (query_end - query_start) < self.body_budget:
            return PromptTooLongError(
                f"the query cannot fit beside document {index}: cut to its share of the prompt "
                f"(query_share={self.query_share}), it still leaves no room for the document within "
                f"max_length={self.max_length}; shorten the query or raise max_length",
                param="query",
                index=index,
            )
        return PromptTooLongError(
            f"document {index} cannot fit: without it the prompt is still {without_document + fixed} "
            f"tokens, over max_length={self.max_length}; shorten the instruction or raise max_length",
            param="documents",
            index=index,
        )


def token_ids(tokenizer: Any, texts: list[str], lock: threading.Lock) -> list[list[int]]:
    """Token ids of each text without special tokens: the ids of ``tokenizer(texts,
    add_special_tokens=False)["input_ids"]``.

    A fast tokenizer's backend is called directly when that is safe (no truncation or padding left
    set on it by an earlier call): its batch call without offsets runs on all cores outside the GIL
    and skips the Hugging Face wrapper's per-text conversion.
    """
    with lock:
        backend: Any = getattr(tokenizer, "backend_tokenizer", None)
        fast = getattr(backend, "encode_batch_fast", None)
        if fast is not None and backend.truncation is None and backend.padding is None:
            return [encoding.ids for encoding in fast(texts, add_special_tokens=False)]
        ids: list[list[int]] = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return ids


def token_ids_in_pieces(
    tokenizer: Any, texts: list[str], lock: threading.Lock, piece_chars: int = PIECE_CHARS
) -> list[list[int]]:
    """:func:`token_ids` of each text; in a small call (:func:`~genscore_core.token_pieces.worth_cutting`),
    long texts tokenized as pieces of about ``piece_chars`` characters where the tokenizer gives the
    same ids that way (:mod:`genscore_core.token_pieces`), so that its threads share the call evenly."""
    if not worth_cutting(texts, piece_chars) or not splits_exactly(tokenizer):
        return token_ids(tokenizer, texts, lock)
    pieces, counts = pieces_of(texts, piece_chars)
    return joined(token_ids(tokenizer, pieces, lock), counts)


def build_raw_prompts(
    tokenizer: Any,
    request: GenerativeScoringRequest,
    *,
    max_length: int,
    tokenizer_lock: threading.Lock | None = None,
) -> list[EncodedPrompt]:
    """The protocol's prompts: query and item concatenated at token level (item first if asked)."""
    lock = tokenizer_lock or threading.Lock()
    text_items = [item for item in request.items if isinstance(item, str)]
    # The query is never cut into, only refused when too long: it keeps max_length + 1 tokens.
    query = request.query
    query_cut = False
    if isinstance(query, str):
        [query] = bounded_texts(tokenizer, [query], max_length, lock)
        query_cut = len(query) < len(request.query)
    text_items = bounded_texts(tokenizer, text_items, max_length, lock)
    with lock:
        if isinstance(query, str):
            query_ids: list[int] = tokenizer.encode(query, add_special_tokens=request.add_special_tokens)
        else:
            query_ids = list(query)
        encoded_text = tokenizer(text_items, add_special_tokens=False)["input_ids"] if text_items else []
    item_ids = iter(encoded_text)
    prompts = []
    for index, item in enumerate(request.items):
        ids = next(item_ids) if isinstance(item, str) else item
        prompt, truncated = truncate_raw(query_ids, ids, max_length, request.item_first, index, query_cut)
        prompts.append(EncodedPrompt(prompt, truncated))
    return prompts


def bounded_texts(
    tokenizer: Any, texts: list[str], tokens: int, lock: threading.Lock | None = None
) -> list[str]:
    """The texts cut, before tokenization, to what a prompt of ``tokens`` tokens can use of them.

    Memory then follows the prompt length, not the input's: each text is cut at the bound of
    :func:`~genscore_core.truncation.cut_to_token_budget`, and, given the tokenizer's ``lock``, a
    long one further where trials show that the prompt's tokens are settled
    (:func:`~genscore_core.truncation.cut_where_settled`).
    """
    chars_per_token = max_chars_per_token(tokenizer)
    texts = cut_to_token_budget(texts, tokens, chars_per_token)
    if chars_per_token is None or lock is None:
        return texts
    held = lock

    def offsets_of(text: str) -> list[tuple[int, int]]:
        with held:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets: list[tuple[int, int]] = encoded["offset_mapping"]
        return offsets

    return cut_where_settled(texts, tokens, chars_per_token, offsets_of)
