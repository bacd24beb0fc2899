"""Documents longer than the prompt budget: capped at a token count, or split into overlapping windows.

``long_documents="chunk"`` scores a document that does not fit as several windows, each with the
template intact, and gives the document one score from its windows' (``chunk_aggregation``: the
maximum by default, the way Elasticsearch and LightRAG keep the best chunk). Windows are cut from the
document's own tokens (the document tokenized alone) and mapped back to character spans, so each
window's text is a slice of the document and results can name it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from genscore_core.prepared import PreparedPairs
from genscore_core.prompts import EncodedPrompt
from genscore_core.templates import Span

Aggregation = Literal["max", "mean", "first", "last"]
"""How a chunked document's score comes from its windows' scores: the best window (``"max"``), their
mean, the first window's (the document's start, what truncation would score), or the last's."""
AGGREGATIONS: tuple[Aggregation, ...] = ("max", "mean", "first", "last")


def token_spans(tokenizer: Any, lock: threading.Lock, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
    """Character span of each token of each text, the text tokenized alone."""
    if not texts:
        return []
    with lock:
        encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    return [list(offsets) for offsets in encoded["offset_mapping"]]


def cap_to_tokens(text: str, offsets: Sequence[tuple[int, int]], tokens: int) -> str:
    """``text`` cut after its first ``tokens`` tokens (whole when it has no more)."""
    if len(offsets) <= tokens:
        return text
    return text[: offsets[tokens - 1][1]] if tokens > 0 else ""


def window_spans(offsets: Sequence[tuple[int, int]], size: int, overlap: int) -> list[Span]:
    """Character spans of windows of ``size`` tokens, each starting ``size - overlap`` tokens after the
    previous one; the last window ends at the last token. One window when the text fits."""
    if size < 1:
        raise ValueError(f"window size must be at least one token, got {size}")
    overlap = min(max(overlap, 0), size // 2)
    count = len(offsets)
    if count <= size:
        return [Span(0, offsets[-1][1] if offsets else 0)]
    spans = []
    start = 0
    while True:
        end = min(start + size, count)
        spans.append(Span(offsets[start][0], offsets[end - 1][1]))
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
