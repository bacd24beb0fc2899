"""An opt-in cache of scores, bounded in bytes: a prompt scored before is answered without the model.

A RAG pipeline re-ranks the same (query, document) pairs again and again (the same question asked
twice, a document retrieved for many phrasings of it); each of those scores is the same number every
time. :class:`ResultCache` keeps the score of each prompt a scorer has scored, least recently used
first out, and :class:`~genscore_core.GenerativeScorer` consults it around its call of the backend:
the prompts it holds are answered from it, the rest go to the backend as before, in one call.

What a score depends on is all in its key: the scorer's identity (the model, where and how it runs:
:meth:`GenerativeScorer.result_cache_identity`), the job's score mode and label ids, the prompt's
token ids (which hold the template, the instruction and the truncation: a longer ``max_length`` or
another instruction makes another prompt) and the job's texts where it carries them (a ``/v1/rerank``
server templates those itself). The key is a 128-bit BLAKE2b digest of those, so an entry costs the
same whatever the prompt's length (:data:`ENTRY_BYTES`).

Thread-safe: one lock guards the entries, taken once per call to look the call's prompts up and once
to keep its new scores.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from genscore_core.backend import JobTexts, ScoringJob

ENTRY_BYTES = 180
"""Memory of one entry: its 16-byte key, its float and the ordered dict's slot, measured with
``tracemalloc`` over 200,000 entries on CPython 3.11 (178 bytes each). The bound of a cache counts
each entry at this cost: ``max_bytes // ENTRY_BYTES`` entries at most."""

ItemName = Callable[[int, int], tuple[str, int, str]]
"""``(job, prompt) -> (param, index, words)``, as :mod:`genscore_core.scorer` names a prompt's input."""


@dataclass(frozen=True)
class CacheStats:
    """A cache's counters since it was made (or cleared)."""

    hits: int
    """Prompts answered from the cache."""
    misses: int
    """Prompts looked up and not found (then scored by the backend)."""
    evictions: int
    """Entries dropped, least recently used first, to stay within ``max_bytes``."""
    entries: int
    """Scores held now."""
    bytes: int
    """Memory the entries take now, at :data:`ENTRY_BYTES` each."""
    max_bytes: int
    """The bound."""

    @property
    def hit_rate(self) -> float | None:
        """Hits of all lookups (``hits / (hits + misses)``); None before the first."""
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else None

    def as_dict(self) -> dict[str, int | float | None]:
        """The counters and the hit rate, as ``GET /stats`` answers them."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "evictions": self.evictions,
            "entries": self.entries,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
        }


class ResultCache:
    """Scores of prompts already scored, at most ``max_bytes`` of them, least recently used out first.

    Example:
        >>> scorer = GenerativeScorer(name, result_cache_bytes=64 << 20)  # doctest: +SKIP
        >>> scorer.rerank(query, documents); scorer.rerank(query, documents)  # doctest: +SKIP
        >>> scorer.result_cache.stats().hits == len(documents)  # doctest: +SKIP
        True
    """

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < ENTRY_BYTES:
            raise ValueError(
                f"a result cache needs max_bytes of at least {ENTRY_BYTES} (one entry), got {max_bytes!r}"
            )
        self.max_bytes = max_bytes
        self._capacity = max_bytes // ENTRY_BYTES
        self._scores: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def stats(self) -> CacheStats:
        with self._lock:
            entries = len(self._scores)
            return CacheStats(
                self._hits, self._misses, self._evictions, entries, entries * ENTRY_BYTES, self.max_bytes
            )

    def clear(self) -> None:
        """Drop every entry and reset the counters (after changing a model's weights in place, which
        no key can see)."""
        with self._lock:
            self._scores.clear()
            self._hits = self._misses = self._evictions = 0

    def lookup(self, identity: str, jobs: Sequence[ScoringJob]) -> CachedCall:
        """The call of ``jobs`` split into the scores held and the prompts still to score."""
        keys = [_job_keys(identity, job) for job in jobs]
        with self._lock:
            known = [[self._get(key) for key in job_keys] for job_keys in keys]
            found = sum(score is not None for job in known for score in job)
            self._hits += found
            self._misses += sum(len(job_keys) for job_keys in keys) - found
        return CachedCall(self, jobs, keys, known)

    def _get(self, key: bytes) -> float | None:
        score = self._scores.get(key)
        if score is not None:
            self._scores.move_to_end(key)
        return score

    def _keep(self, entries: Sequence[tuple[bytes, float]]) -> None:
        with self._lock:
            scores = self._scores
            for key, score in entries:
                scores[key] = score
                scores.move_to_end(key)
            excess = len(scores) - self._capacity
            for _ in range(max(excess, 0)):
                scores.popitem(last=False)
            self._evictions += max(excess, 0)


class CachedCall:
    """One call's jobs after the cache was consulted: :attr:`missing` goes to the backend, and
    :meth:`complete` puts its scores with those the cache held (keeping the new ones).

    The missing jobs hold only the prompts (and texts) the cache did not; a job whose prompts were all
    held is left out, so a call answered whole from the cache makes no backend call at all.
    """

    def __init__(
        self,
        cache: ResultCache | None,
        jobs: Sequence[ScoringJob],
        keys: Sequence[Sequence[bytes]] = (),
        known: Sequence[Sequence[float | None]] = (),
    ) -> None:
        self._cache = cache
        self._keys = keys
        self._known = known
        self.missing: list[ScoringJob] = []
        """The jobs to score, holding only the prompts the cache did not."""
        self._places: list[tuple[int, list[int]]] = []
        """For each missing job: its job in the call, and its prompts' places in that job."""
        if cache is None:  # no cache: every job goes to the backend as it is
            self.missing = list(jobs)
            self._places = [(index, list(range(len(job.prompts)))) for index, job in enumerate(jobs)]
            return
        for index, (job, scores) in enumerate(zip(jobs, known)):
            wanted = [place for place, score in enumerate(scores) if score is None]
            if wanted:
                self._places.append((index, wanted))
                self.missing.append(_part_of(job, wanted))

    @property
    def answered(self) -> bool:
        """Whether the cache held every score of the call: then no backend call is made (without a
        cache, every call goes to the backend, even one of no jobs)."""
        return self._cache is not None and not self.missing

    @property
    def hits(self) -> int:
        """Prompts the cache answered."""
        return sum(score is not None for job in self._known for score in job)

    def named(self, name: ItemName) -> ItemName:
        """``name`` for the prompts of :attr:`missing`: each named as the prompt of the call it is."""

        def in_call(job: int, prompt: int) -> tuple[str, int, str]:
            index, places = self._places[job]
            return name(index, places[prompt])

        return in_call

    def complete(self, scored: list[list[float]]) -> list[list[float]]:
        """The scores of the whole call, from the backend's scores of :attr:`missing` (checked by the
        caller: only a score of the job's mode is kept) and the cache's."""
        if self._cache is None:
            return scored
        scores = [list(job) for job in self._known]
        new: list[tuple[bytes, float]] = []
        for (index, places), values in zip(self._places, scored, strict=True):
            for place, value in zip(places, values, strict=True):
                scores[index][place] = value
                new.append((self._keys[index][place], value))
        self._cache._keep(new)
        return scores  # type: ignore[return-value]  # every None was filled above


def _part_of(job: ScoringJob, places: list[int]) -> ScoringJob:
    """``job`` with only the prompts (and documents) at ``places``."""
    if len(places) == len(job.prompts):
        return job
    texts = job.texts
    if texts is not None:
        texts = JobTexts(texts.query, tuple(texts.documents[place] for place in places))
    return replace(job, prompts=[job.prompts[place] for place in places], texts=texts)


def _job_keys(identity: str, job: ScoringJob) -> list[bytes]:
    """The key of each prompt of ``job``: what the job shares (identity, mode, labels, query), then
    the prompt's token ids and its document."""
    shared = hashlib.blake2b(digest_size=16)
    for part in (identity, job.mode, ",".join(map(str, job.label_ids))):
        _add_text(shared, part)
    texts = job.texts
    if texts is not None:
        _add_text(shared, texts.query)
    keys = []
    for place, prompt in enumerate(job.prompts):
        key = shared.copy()
        ids = array("q", prompt).tobytes()
        key.update(len(ids).to_bytes(8, "little"))
        key.update(ids)
        if texts is not None:
            _add_text(key, texts.documents[place])
        keys.append(key.digest())
    return keys


def _add_text(hasher: hashlib.blake2b, text: str) -> None:
    """``text`` into ``hasher`` with its length first, so that no two sequences of texts hash alike
    by sharing their concatenation."""
    data = text.encode("utf-8", "surrogatepass")
    hasher.update(len(data).to_bytes(8, "little"))
    hasher.update(data)
