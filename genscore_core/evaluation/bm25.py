"""The first stage when no run is given: BM25 over the corpus, in plain Python.

Okapi BM25 with Lucene's idf, ``log(1 + (N - df + 0.5) / (df + 0.5))``, and Anserini's BEIR
defaults ``k1 = 0.9``, ``b = 0.4``. Texts are lowercased and split into runs of letters and digits
(``\\w+``); there is no stemming and no stop list, so it is a plain lexical baseline, close to but not
the same as a search engine's BM25. It holds an inverted index in memory: fine for the evaluation
sets it is meant for (thousands to a few hundred thousand documents), not a search engine.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Mapping

K1 = 0.9
B = 0.4
_WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """The lowercased words of ``text``."""
    return _WORD.findall(text.lower())


class BM25:
    """An inverted index of ``corpus`` (document id -> text), searched by :meth:`search`."""

    def __init__(self, corpus: Mapping[str, str], *, k1: float = K1, b: float = B) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, list[tuple[str, int]]] = {}
        self._lengths: dict[str, int] = {}
        for doc, text in corpus.items():
            words = tokenize(text)
            self._lengths[doc] = len(words)
            for word, count in Counter(words).items():
                self._postings.setdefault(word, []).append((doc, count))
        self._average = sum(self._lengths.values()) / max(len(self._lengths), 1) or 1.0

    def idf(self, word: str) -> float:
        count = len(self._lengths)
        df = len(self._postings.get(word, ()))
        return math.log(1.0 + (count - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> dict[str, float]:
        """The BM25 score of every document holding a word of ``query`` (a word given twice counts twice)."""
        scores: dict[str, float] = {}
        for word, repeats in Counter(tokenize(query)).items():
            weight = self.idf(word) * repeats
            for doc, count in self._postings.get(word, ()):
                norm = self.k1 * (1.0 - self.b + self.b * self._lengths[doc] / self._average)
                scores[doc] = scores.get(doc, 0.0) + weight * count * (self.k1 + 1.0) / (count + norm)
        return scores

    def search(self, query: str, k: int) -> dict[str, float]:
        """The ``k`` best documents for ``query`` and their scores (ties: the larger id first, as
        trec_eval orders them)."""
        best = heapq.nlargest(k, self.scores(query).items(), key=lambda item: (item[1], item[0]))
        return dict(best)
