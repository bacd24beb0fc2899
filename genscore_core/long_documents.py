"""Documents longer than the prompt budget: capped at a token count, or split into overlapping windows.

``long_documents="chunk"`` scores a document that does not fit as several windows, each with the
template intact, and gives the document one score from its windows' (``chunk_aggregation``: the
maximum by default, the way Elasticsearch and LightRAG keep the best chunk). Windows are cut from the
document's own tokens (the document tokenized alone) and mapped back to character spans, so each
window's text is a slice of the document and results can name it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from genscore_core.errors import PromptTooLongError
from genscore_core.prepared import PreparedPairs
from genscore_core.prompts import EncodedPrompt
from genscore_core.templates import Span
from genscore_core.token_pieces import cut_points, splits_exactly
from genscore_core.truncation import CUT_MARGIN_CHARS, max_chars_per_token

Aggregation = Literal["max", "mean", "first", "last"]
"""How a chunked document's score comes from its windows' scores: the best window (``"max"``), their
mean, the first window's (the document's start, what truncation would score), or the last's."""
AGGREGATIONS: tuple[Aggregation, ...] = ("max", "mean", "first", "last")

SPAN_PIECE_CHARS = 65_536
"""Characters tokenized at a time when a call's tokens are counted against a limit (about 15k
English tokens): the count overshoots the limit by at most one piece's worth."""


def token_spans(
    tokenizer: Any,
    lock: threading.Lock,
    texts: Sequence[str],
    *,
    limit: int | None = None,
    names: Sequence[int] | None = None,
    text_limit: int | None = None,
) -> list[list[tuple[int, int]]]:
    """Character span of each token of each text, the text tokenized alone.

    With ``limit`` (prompt tokens a call may hold: every token of a chunked document is in some
    window's prompt), the texts' tokens are counted as they are made and the first text that takes
    the count over ``limit`` is refused (:class:`~genscore_core.errors.PromptTooLongError` naming
    ``documents[names[i]]``), so that a huge document costs what the limit allows, not its size.
    ``text_limit`` (``chunk_max_tokens``) bounds each text's tokens alone the same way.
    Long texts are then tokenized in pieces where that gives the same tokens
    (:mod:`genscore_core.token_pieces`); a text the tokenizer cannot cut exactly is tokenized whole.
    """
    if not texts:
        return []
    if limit is None and text_limit is None:
        with lock:
            encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        return [list(offsets) for offsets in encoded["offset_mapping"]]
    exact = splits_exactly(tokenizer)
    spans: list[list[tuple[int, int]]] = []
    total = 0
    for index, text in enumerate(texts):
        name = names[index] if names is not None else index
        # The tokens this text may have: what the call has left, or its own cap, whichever is less.
        call_room = limit - total if limit is not None else None
        by_call = text_limit is None or (call_room is not None and call_room <= text_limit)
        allowed = call_room if by_call else text_limit
        assert allowed is not None
        refusal = _past_limit(name, limit or 0) if by_call else past_text_limit(name, text_limit)

        cuts = cut_points(text, SPAN_PIECE_CHARS) if exact else []
        if not cuts and _surely_more_tokens(tokenizer, lock, text, allowed):
            raise refusal
        offsets: list[tuple[int, int]] = []
        for start, stop in itertools.pairwise([0, *cuts, len(text)]):
            with lock:
                encoded = tokenizer(text[start:stop], add_special_tokens=False, return_offsets_mapping=True)
            offsets.extend((start + a, start + b) for a, b in encoded["offset_mapping"])
            if len(offsets) > allowed:
                raise refusal
        total += len(offsets)
        spans.append(offsets)
    return spans


def _past_limit(name: int, limit: int) -> PromptTooLongError:
    return PromptTooLongError(
        f"documents[{name}] takes this call's prompts past {limit} tokens (with the documents before "
        "it); shorten it or split the request",
        param="documents",
        index=name,
    )


def past_text_limit(name: int, cap: int | None, least: int | None = None) -> PromptTooLongError:
    """The refusal of a document past ``chunk_max_tokens``; ``least``: the tokens its length proves."""
    count = f"at least {least} tokens (from its length)" if least is not None else f"more than {cap} tokens"
    return PromptTooLongError(
        f"documents[{name}] has {count}: more than chunk_max_tokens={cap}, the most one "
        "document may have to be scored in windows (long_documents='chunk'); shorten it, cut it with "
        "max_tokens_per_doc, or raise chunk_max_tokens",
        param="documents",
        index=name,
    )


def refuse_each_by_length(
    tokenizer: Any, documents: Sequence[str], cap: int, names: Sequence[int] | None = None
) -> None:
    """Refuse, before any tokenization, the first document whose characters alone prove it has more
    than ``cap`` tokens (``chunk_max_tokens``); nothing when the tokenizer has no such bound."""
    chars_per_token = max_chars_per_token(tokenizer)
    if chars_per_token is None:
        return
    for index, document in enumerate(documents):
        least = -(-len(document) // chars_per_token)
        if least > cap:
            raise past_text_limit(names[index] if names is not None else index, cap, least)


def _surely_more_tokens(tokenizer: Any, lock: threading.Lock, text: str, tokens: int) -> bool:
    """Whether ``text`` (one that cannot be tokenized in exact pieces: CJK, no spaces) has more than
    ``tokens`` tokens, found from prefixes of doubling length so that the work follows ``tokens``, not
    the text. A prefix's tokens that end ``chars_per_token + CUT_MARGIN_CHARS`` characters or more
    before its cut are the whole text's (the argument of
    :func:`~genscore_core.truncation.cut_to_token_budget`); False when that cannot be shown."""
    chars_per_token = max_chars_per_token(tokenizer)
    if chars_per_token is None:
        return False
    length = SPAN_PIECE_CHARS
    while length < len(text):
        with lock:
            encoded = tokenizer(text[:length], add_special_tokens=False, return_offsets_mapping=True)
        settled = length - chars_per_token - CUT_MARGIN_CHARS
        if sum(1 for _, end in encoded["offset_mapping"] if end <= settled) > tokens:
            return True
        length *= 2
    return False


def refuse_by_length(
    tokenizer: Any, documents: Sequence[str], limit: int, names: Sequence[int] | None = None
) -> None:
    """Refuse, before any tokenization, the first document whose characters alone prove that the
    documents so far make more than ``limit`` tokens (a token covers at most
    :func:`~genscore_core.truncation.max_chars_per_token` characters); nothing when the tokenizer
    has no such bound."""
    chars_per_token = max_chars_per_token(tokenizer)
    if chars_per_token is None:
        return
    least = 0
    for index, document in enumerate(documents):
        least += -(-len(document) // chars_per_token)
        if least > limit:
            name = names[index] if names is not None else index
            raise PromptTooLongError(
                f"documents[{name}] is {len(document)} characters: with the documents before it, at least "
                f"{least} tokens, more than this call's prompts may hold ({limit} tokens in all); shorten "
                "it or split the request",
                param="documents",
                index=name,
            )


def _token_end(text: str, offsets: Sequence[tuple[int, int]], count: int) -> int:
    """Where the text of its first ``count`` tokens ends: where the next token starts (or the
    text's end). A token's own end offset can fall short of that: a normalizer that composes
    characters (Qwen's NFC) maps ``e`` + U+0301 to the base character's offset alone, and ending
    there would drop the mark."""
    return offsets[count][0] if count < len(offsets) else len(text)


def cap_to_tokens(text: str, offsets: Sequence[tuple[int, int]], tokens: int) -> str:
    """``text`` cut after its first ``tokens`` tokens (whole when it has no more)."""
    if len(offsets) <= tokens:
        return text
    return text[: _token_end(text, offsets, tokens)] if tokens > 0 else ""


def window_spans(text: str, offsets: Sequence[tuple[int, int]], size: int, overlap: int) -> list[Span]:
    """Character spans of windows of ``size`` tokens of ``text``, each starting ``size - overlap``
    tokens after the previous one; the last window ends at the last token. One window when the text
    fits. Together they cover every character: the first starts at 0, each ends where the token
    after it starts (the last at the text's end), and the next starts at or before that."""
    if size < 1:
        raise ValueError(f"window size must be at least one token, got {size}")
    overlap = min(max(overlap, 0), size // 2)
    count = len(offsets)
    if count <= size:
        return [Span(0, len(text))]
    spans = []
    start = 0
    while True:
        end = min(start + size, count)
        spans.append(Span(offsets[start][0] if start else 0, _token_end(text, offsets, end)))
        if end == count:
            return spans
        start += size - overlap


@dataclass(frozen=True)
class WindowedPairs(PreparedPairs):
    """Prepared pairs whose documents were capped or split into windows: :meth:`assemble` gives one
    (score, prompt) per original pair, the prompt being the reported window's."""

    owners: list[int]
    """The original pair of each windowed pair."""
    spans: list[Span | None]
    """Each windowed pair's character span in its document (None: the whole document)."""
    pair_count: int
    aggregation: Aggregation
    capped: list[bool]
    """Whether each original document was cut at ``max_tokens_per_doc``."""

    def assemble(self, scores: list[list[float]]) -> list[tuple[float, EncodedPrompt]]:
        windows = super().assemble(scores)
        grouped: list[list[int]] = [[] for _ in range(self.pair_count)]
        for window, owner in enumerate(self.owners):
            grouped[owner].append(window)
        results = []
        for pair, members in enumerate(grouped):
            values = [windows[w][0] for w in members]
            best = max(range(len(members)), key=lambda i: values[i])  # first of equal maxima
            if self.aggregation == "mean":
                score = sum(values) / len(values)
            elif self.aggregation == "first":
                best, score = 0, values[0]
            elif self.aggregation == "last":
                best, score = len(values) - 1, values[-1]
            else:
                score = values[best]
            prompt = windows[members[best]][1]
            span = self.spans[members[best]]
            results.append(
                (
                    score,
                    replace(
                        prompt,
                        truncated=prompt.truncated or self.capped[pair],
                        window=(span.start, span.end) if span is not None else None,
                        windows=len(members),
                        all_tokens=sum(len(windows[w][1].token_ids) for w in members),
                    ),
                )
            )
        return results
