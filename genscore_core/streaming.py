"""Host work overlapped with the GPU's: prompts arrive in parts, batches leave as soon as they are laid out.

Text in, the host's work (tokenizing, finding each query's shared prefix, dropping duplicates, laying
batches out as flat arrays, the copy to the device) used to finish for the whole call before the
first kernel ran. Here a producer thread does it part by part and hands each batch over as soon as
it is laid out, so the GPU runs batch k while the host prepares batch k+1. The first batch is kept
small so that the GPU starts early.

Token ids travel as flat ``int32`` numpy buffers: each part's prompts are copied once into one
buffer (:class:`TokenRows`), and a batch's stream is the concatenation of slices of those buffers.
Nothing converts token ids element by element in Python after the tokenizer.

Scores do not depend on the parts: the prompts of a job that start with its shared prefix form one
group whose prefix is computed once (its keys and values are kept for later batches), duplicates are
scored once, and prompts that do not start with that prefix are scored as a group of their own.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import numpy as np

if TYPE_CHECKING:
    import torch

from genscore_core.backend import JobPart, check_all_taken, check_part
from genscore_core.prefixes import PrefixGroup

T = TypeVar("T")
U = TypeVar("U")

FIRST_BATCH_TOKENS = 4096
"""Token target of the first batch of a text call: small, so that the GPU starts while the host
tokenizes the rest (about 7 ms of an H200 on a Qwen3-0.6B shape). The first batch leaves at the end
of the stream's first part of documents (``frontend.FIRST_PART_CHARS``) even when that part holds
fewer tokens (:meth:`BatchPlanner.ripe`). Each later batch's target is twice its predecessor's, up
to the forward's budget (docs/benchmarks.md, "Streaming text calls")."""


BATCH_GROWTH = 2.0
"""Each batch's token target over its predecessor's."""


class TokenRows:
    """Prompts as one flat ``int32`` buffer: prompt ``i`` is ``tokens[starts[i]:starts[i + 1]]``."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray) -> None:
        self.tokens = tokens
        self.starts = starts

    @classmethod
    def from_lists(cls, prompts: Sequence[Sequence[int]]) -> TokenRows:
        """One copy of every prompt's ids into the buffer (in C: ``chain`` feeding ``fromiter``)."""
        lengths = np.fromiter(map(len, prompts), dtype=np.int64, count=len(prompts))
        starts = np.zeros(len(prompts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        total = int(starts[-1])
        tokens = np.fromiter(itertools.chain.from_iterable(prompts), dtype=np.int32, count=total)
        return cls(tokens, starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def row(self, index: int) -> np.ndarray:
        return self.tokens[self.starts[index] : self.starts[index + 1]]

    def starting_with(self, prefix: np.ndarray) -> np.ndarray:
        """Whether each prompt starts with ``prefix`` and goes on past it (one vectorised compare)."""
        lengths = np.diff(self.starts)
        longer = lengths > len(prefix)
        if not len(prefix):
            return longer
        rows = np.flatnonzero(longer)
        if not len(rows):
            return longer
        window = self.tokens[self.starts[rows][:, None] + np.arange(len(prefix))]
        longer[rows] = (window == prefix).all(axis=1)
        return longer


@dataclass(frozen=True)
class RowKey:
    """An output row: distinct prompt ``prompt`` of job ``job``."""

    job: int
    prompt: int


RowReduction = Callable[["torch.Tensor", list[RowKey]], "torch.Tensor"]
"""What a streaming forward makes of one batch's hidden states [rows, H] and its rows' keys: a
tensor with one entry a row (the engine's scores)."""


@dataclass
class StreamBatch:
    """One planned batch: its groups (only the prompts this batch computes), which prefixes it
    computes and keeps, and the key of each output row."""

    groups: dict[int, PrefixGroup]
    """Group id -> the group's prefix and this batch's suffixes of it (``int32`` arrays)."""
    compute_prefix: dict[int, bool]
    save_prefix: dict[int, bool]
    rows: dict[int, list[RowKey]]
    """Group id -> the key of each of its suffixes here."""
    release: list[int]
    """Groups whose kept prefix no later batch reads (drop it after this batch)."""
    tokens: int

    @property
    def num_prompts(self) -> int:
        return sum(map(len, self.rows.values()))

    def ordered_rows(self) -> list[RowKey]:
        """Keys of the output rows in the batch's layout order (group by group)."""
        return [key for group in self.groups for key in self.rows[group]]


class JobPrompts:
    """The distinct prompts of one job as its parts arrive (first-seen order), and which distinct
    prompt each input prompt is: :func:`genscore_core.prefixes.distinct_prompts`, incrementally."""

    def __init__(self) -> None:
        self.distinct: list[np.ndarray] = []
        self.where: list[int] = []
        self._index: dict[bytes, int] = {}

    def add(self, prompt: np.ndarray) -> int | None:
        """Record ``prompt``; its distinct index if it is new, None if it repeats an earlier one."""
        # The bytes of an int32 slice hash in C; equal bytes are equal token ids.
        key = prompt.tobytes()
        index = self._index.get(key)
        if index is not None:
            self.where.append(index)
            return None
        index = self._index[key] = len(self.distinct)
        self.where.append(index)
        self.distinct.append(prompt)
        return index


class BatchPlanner:
    """Fills batches of computed tokens (a prefix counts once, in the batch that computes it) from
    prompts added one at a time; :meth:`add` returns the batch that the prompt did not fit into.

    Each batch holds at most its target: ``first_batch_tokens`` for the first, twice its
    predecessor's for each later one, up to ``max_batch_tokens``. A batch closes when the next
    prompt would take it over its target, so batches fill their targets to within one prompt and
    their sizes, padded to a CUDA graph's shape, repeat from call to call. A prompt larger than the
    target gets a batch of its own. The first batch may also close early, at the end of the first
    part (:meth:`ripe`).
    """

    def __init__(
        self,
        max_batch_tokens: int,
        first_batch_tokens: int = FIRST_BATCH_TOKENS,
        growth: float = BATCH_GROWTH,
    ) -> None:
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        if first_batch_tokens <= 0:
            # A target of 0 grows to 0: every later batch would hold one prompt.
            raise ValueError(f"first_batch_tokens must be positive, got {first_batch_tokens}")
        if growth < 1:
            raise ValueError(f"growth must be at least 1, got {growth}")
        self.max_batch_tokens = max_batch_tokens
        self.growth = growth
        self._target = min(first_batch_tokens, max_batch_tokens)
        self._computed: set[int] = set()  # groups whose prefix an earlier batch computed
        self._closed: set[int] = set()
        self._kept: set[int] = set()  # groups whose prefix is saved for later batches
        self._largest = 0  # the largest prompt (suffix tokens) added so far
        self.closed_batches = 0
        """Batches handed out so far."""
        self._reset()

    def _reset(self) -> None:
        self._groups: dict[int, PrefixGroup] = {}
        self._compute: dict[int, bool] = {}
        self._rows: dict[int, list[RowKey]] = {}
        self._used = 0

    def add(self, group: int, prefix: np.ndarray, suffix: np.ndarray, row: RowKey) -> StreamBatch | None:
        """Add one prompt (``prefix + suffix``) of ``group``; the batch it closed, if any."""
        if not len(suffix):
            raise ValueError("every prompt needs at least one token after the shared prefix")
        full = None
        cost = len(suffix) + (0 if self._has_prefix(group) else len(prefix))
        if self._rows and self._used + cost > self._target:
            full = self._flush()
            cost = len(suffix) + (0 if self._has_prefix(group) else len(prefix))
        entry = self._groups.get(group)
        if entry is None:
            # numpy arrays in place of lists: build_batch reads them with len() and concatenation.
            entry = self._groups[group] = PrefixGroup(cast(list[int], prefix), [])
            self._compute[group] = group not in self._computed
            self._rows[group] = []
        entry.suffix_ids.append(cast(list[int], suffix))
        self._rows[group].append(row)
        self._used += cost
        self._largest = max(self._largest, len(suffix))
        return full

    def ripe(self, *, first_part: bool = False) -> StreamBatch | None:
        """The open batch, closed now if a prompt as large as the largest seen would not fit in it,
        or, with ``first_part`` (the end of the stream's first part), if it is the first batch.

        Called at the end of a part: without it, a batch within one prompt of its target would wait
        for the next part to be tokenized to learn that its next prompt does not fit. The first batch
        never waits for a second part: W1's first part (24k characters, 10 documents) held 3.4k
        tokens, short of 4,096 by less than its largest prompt, so the GPU started only once the
        second part (29 documents) was tokenized too, about 15 ms into the call
        (docs/benchmarks.md, "Streaming text calls").
        """
        if not self._rows:
            return None
        if self._used + self._largest > self._target or (first_part and not self.closed_batches):
            return self._flush()
        return None

    def _has_prefix(self, group: int) -> bool:
        return group in self._computed or group in self._groups

    def close(self, group: int) -> None:
        """No more prompts of ``group`` will be added."""
        self._closed.add(group)

    def finish(self) -> StreamBatch | None:
        """The last, partly filled batch (None when empty)."""
        return self._flush() if self._rows else None

    def _flush(self) -> StreamBatch:
        save = {
            g: self._compute[g] and g not in self._closed and len(pg.prefix_ids) > 0
            for g, pg in self._groups.items()
        }
        self._kept.update(g for g, keep in save.items() if keep)
        self._computed.update(g for g, computes in self._compute.items() if computes)
        release = sorted(g for g in self._kept if g in self._closed)
        self._kept.difference_update(release)
        batch = StreamBatch(
            groups=self._groups,
            compute_prefix=self._compute,
            save_prefix=save,
            rows=self._rows,
            release=release,
            tokens=self._used,
        )
        self._reset()
        # The next target grows from this one's, not from what this batch held: a first batch cut
        # short by its part still leaves the later targets (and their graphs' shapes) as they were.
        # Rounded up: rounded down, a growth under 1 + 1/target never moved the target at all.
        self._target = min(math.ceil(self.growth * self._target), self.max_batch_tokens)
        self.closed_batches += 1
        return batch


@dataclass
class StreamState:
    """What the producer learnt about each job: its distinct prompts and where each input prompt went."""

    jobs: list[JobPrompts] = field(default_factory=list)


class TakenParts(Iterator[JobPart]):
    """The parts of a call as they are taken, with the error their iterator raised, if any.

    That error is the caller's (a document that cannot be tokenized, a tokenizer that failed), even
    when it reads like running out of memory: the engine then neither scores the call again in
    smaller batches nor lets the error be lost while the producer is stopped after a failure of the
    forward (:meth:`~genscore_core.engine.ScoringEngine.score_stream`).
    """

    def __init__(self, parts: Iterable[JobPart]) -> None:
        self._parts = iter(parts)
        self.error: BaseException | None = None

    def __next__(self) -> JobPart:
        try:
            return next(self._parts)
        except StopIteration:
            raise
        except BaseException as error:
            self.error = error
            raise


def plan_stream(
    sizes: Sequence[int],
    parts: Iterable[JobPart],
    planner: BatchPlanner,
    state: StreamState,
    *,
    first_batch_early: bool = True,
) -> Iterator[StreamBatch]:
    """Batches for the parts of jobs of ``sizes[j]`` prompts each, as the parts arrive; with
    ``first_batch_early``, the first batch leaves at the end of the first part (:meth:`BatchPlanner.ripe`).

    A job's prompts that start with the prefix its first part shares and go on past it form one
    group (id ``j``); the others form a second group, scored after all parts, whose prefix is the
    one its own prompts share. A part of no job, or parts holding more or fewer prompts than their
    job's size, raise ``ValueError`` naming the job (:func:`check_part`, :func:`check_all_taken`).
    """
    state.jobs = [JobPrompts() for _ in sizes]
    prefixes: dict[int, np.ndarray] = {}
    group_of: dict[int, int] = {}  # job -> the planner group its prompts join
    template = SharedTemplate(2 * len(sizes))  # after the jobs' ids and their spilled groups'
    seen = [0] * len(sizes)
    spilled: dict[int, list[int]] = {}  # job -> its distinct prompts outside its main group
    for part_number, part in enumerate(parts):
        check_part(sizes, seen, part)
        job = part.job
        rows = TokenRows.from_lists(part.prompts)
        recorded = state.jobs[job]
        # Every prompt of the part is recorded before any batch is handed out, so that a consumer
        # that stops early finds each part the producer took either wholly recorded or not at all.
        added = [(i, recorded.add(rows.row(i))) for i in range(len(rows))]
        if job not in prefixes:
            length = shared_prefix_length([rows.row(i) for i in range(len(rows))]) if len(rows) > 1 else 0
            prefixes[job] = rows.row(0)[:length].copy() if len(rows) else np.empty(0, np.int32)
            group_of[job] = job
            if len(rows):
                yield from template.offer(job, sizes[job], rows.row(0), len(prefixes[job]), planner, state)
                if template.holds(job) and template.prefix is not None:
                    prefixes[job], group_of[job] = template.prefix, template.group
        prefix = prefixes[job]
        inside = rows.starting_with(prefix)
        for i, index in added:
            if index is None or template.pending_row(job, i):
                continue
            if inside[i]:
                batch = planner.add(group_of[job], prefix, rows.row(i)[len(prefix) :], RowKey(job, index))
                if batch is not None:
                    yield batch
            else:
                spilled.setdefault(job, []).append(index)
        seen[job] += len(rows)
        if seen[job] >= sizes[job]:
            # Closed only now: a batch closed while this part was added still keeps the prefix for
            # the part's later prompts.
            planner.close(job)
        ripe = planner.ripe(first_part=first_batch_early and part_number == 0)
        if ripe is not None:
            yield ripe
    check_all_taken(sizes, seen)
    yield from template.release(planner, state)
    for job in range(len(sizes)):
        planner.close(job)
    planner.close(template.group)
    for number, (job, indices) in enumerate(spilled.items()):
        group = len(sizes) + number
        rest = [state.jobs[job].distinct[i] for i in indices]
        shared = shared_prefix_length(rest)
        for i, prompt in zip(indices, rest):
            batch = planner.add(group, prompt[:shared], prompt[shared:], RowKey(job, i))
            if batch is not None:
                yield batch
        planner.close(group)
    last = planner.finish()
    if last is not None:
        yield last


MIN_TEMPLATE_TOKENS = 8
"""Fewest leading tokens two jobs must share to be scored under one template prefix."""


class SharedTemplate:
    """Jobs of distinct queries that share their template's head, computed once per batch.

    A reranker's prompts start with the template's query-independent tokens (the Qwen3 template's
    system message and instruction, about 55 tokens), then the query. A job of one query and many
    documents shares its whole query prefix already; jobs of one or two documents each (``score_pairs``
    over distinct queries) share nothing with each other. Here such a job's prompts join one group whose
    prefix is the head that the first two such jobs share: its query goes into each prompt's own
    tokens. A job of ``n`` prompts whose own shared prefix is ``p`` tokens joins when that costs
    fewer tokens: ``n * (p - t) < p`` for a head of ``t``; a job of one prompt joins whenever it
    starts with the head. The first candidate waits for the second, which tells the head; if none
    comes, or they share fewer than :data:`MIN_TEMPLATE_TOKENS`, it is scored alone.
    """

    def __init__(self, group: int) -> None:
        self.group = group
        """The planner's group id of the template's prompts."""
        self.prefix: np.ndarray | None = None
        self._members: set[int] = set()
        self._pending: tuple[int, np.ndarray, int] | None = None  # (job, first prompt, own prefix)

    def holds(self, job: int) -> bool:
        return job in self._members

    def pending_row(self, job: int, row: int) -> bool:
        """Whether prompt ``row`` of ``job``'s first part waits for the head to be known."""
        return self._pending is not None and self._pending[0] == job and row == 0

    def offer(
        self,
        job: int,
        size: int,
        first: np.ndarray,
        own_prefix: int,
        planner: BatchPlanner,
        state: StreamState,
    ) -> Iterator[StreamBatch]:
        """Consider ``job`` (``size`` prompts, ``first`` its first one, ``own_prefix`` the tokens its
        first part shares) when its first part arrives; yields batches that adding a waiting job closed."""
        if size > 2 and own_prefix == 0:
            return
        if self.prefix is not None:
            if self._joins(size, first, own_prefix):
                self._members.add(job)
            return
        if self._pending is None:
            if size == 1:
                self._pending = (job, first, own_prefix)
            return
        waiting, waiting_first, _ = self._pending
        head = shared_prefix_length([waiting_first, first])
        if head < MIN_TEMPLATE_TOKENS:
            # Scored alone; this job may head the next pair.
            yield from self._alone(planner, state)
            if size == 1:
                self._pending = (job, first, own_prefix)
            return
        self.prefix = first[:head].copy()
        self._members.add(waiting)
        self._pending = None
        yield from self._add(waiting, waiting_first, planner, state)
        if self._joins(size, first, own_prefix):
            self._members.add(job)

    def release(self, planner: BatchPlanner, state: StreamState) -> Iterator[StreamBatch]:
        """After the last part: a job still waiting is scored alone."""
        yield from self._alone(planner, state)

    def _joins(self, size: int, first: np.ndarray, own_prefix: int) -> bool:
        assert self.prefix is not None
        head = len(self.prefix)
        starts = len(first) > head and bool((first[:head] == self.prefix).all())
        return starts and (size == 1 or size * (own_prefix - head) < own_prefix)

    def _alone(self, planner: BatchPlanner, state: StreamState) -> Iterator[StreamBatch]:
        if self._pending is None:
            return
        job, first, _ = self._pending
        self._pending = None
        batch = planner.add(job, np.empty(0, np.int32), first, RowKey(job, state.jobs[job].where[0]))
        if batch is not None:
            yield batch

    def _add(
        self, job: int, first: np.ndarray, planner: BatchPlanner, state: StreamState
    ) -> Iterator[StreamBatch]:
        assert self.prefix is not None
        head = len(self.prefix)
        row = RowKey(job, state.jobs[job].where[0])
        batch = planner.add(self.group, self.prefix, first[head:], row)
        if batch is not None:
            yield batch


def shared_prefix_length(prompts: Sequence[np.ndarray]) -> int:
    """:func:`genscore_core.prefixes.shared_prefix_length` of ``int32`` arrays (vectorised)."""
    if not prompts:
        return 0
    first = prompts[0]
    length = max(min(len(p) for p in prompts) - 1, 0)
    for prompt in prompts[1:]:
        if not length:
            break
        differ = np.flatnonzero(prompt[:length] != first[:length])
        if len(differ):
            length = int(differ[0])
    return length


PRODUCER_STOP_POLL_S = 0.05
"""How often a producer waiting on a full queue looks whether its consumer has left."""


class _End:
    pass


@dataclass(frozen=True)
class _Failure:
    error: BaseException


class Prefetcher(Generic[T, U]):
    """Runs ``produce`` over ``items`` on a producer thread, at most ``depth`` results ahead of the
    consumer; an exception of the producer (or of ``items``) is raised to the consumer in order.

    Leaving the ``with`` block, normally or on an error of the consumer, stops the producer after
    the item it is working on and joins it: no thread outlives the call. The producer never waits
    on a full queue for a consumer that has left, so it ends by itself even when that join is
    interrupted in turn (a second Ctrl-C).
    """

    def __init__(self, items: Iterable[T], produce: Callable[[T], U], depth: int = 2) -> None:
        self._items = items
        self._produce = produce
        self._queue: queue.Queue[U | _End | _Failure] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="genscore-host-batches", daemon=True)

    def _run(self) -> None:
        try:
            for item in self._items:
                if self._stop.is_set() or not self._put(self._produce(item)):
                    return
        except BaseException as error:  # raised to the consumer by __iter__
            self._put(_Failure(error))
            return
        self._put(_End())

    def _put(self, item: U | _End | _Failure) -> bool:
        """Queue ``item`` for the consumer; False, dropping it, once the consumer has left."""
        while not self._stop.is_set():
            try:
                # A full queue is waited on in slices, to see the stop; a free slot wakes the wait
                # at once, so a consumer that keeps up never waits a slice.
                self._queue.put(item, timeout=PRODUCER_STOP_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __enter__(self) -> Prefetcher[T, U]:
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[U]:
        while not self._ended:
            item = self._queue.get()
            if isinstance(item, _End):
                self._ended = True
                return
            if isinstance(item, _Failure):
                self._ended = True
                raise item.error
            yield item

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        # Results made for nobody (batches already on the device) are freed now, not when the
        # caller drops the prefetcher: the engine may score the call again meanwhile.
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
