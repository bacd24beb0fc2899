"""The streamed host path: int32 buffers, batch planning, the producer thread, and scores through it."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer, PromptTooLongError, ScoreRangeError
from genscore_core.backend import JobPart, ScoringJob, StreamedJob
from genscore_core.forward import PrefixGroup
from genscore_core.packed.plan import GroupSlice, build_batch
from genscore_core.prefixes import group_prompts, share_template
from genscore_core.prefixes import shared_prefix_length as list_prefix_length
from genscore_core.streaming import (
    BatchPlanner,
    Prefetcher,
    RowKey,
    StreamBatch,
    StreamState,
    TokenRows,
    plan_stream,
)
from tests.helpers.reference_recipe import official_qwen3_scores

WORDS = "paris france capital river seine museum berlin wall history london thames bridge tower".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _jobs(rng: random.Random) -> list[list[list[int]]]:
    """Token-id jobs: a shared prefix per job, suffixes of mixed lengths, duplicates, and prompts
    that do not start with the job's prefix."""
    jobs = []
    for job in range(4):
        prefix = [rng.randrange(1, 1000) for _ in range(rng.randint(0, 12))]
        prompts = [prefix + [rng.randrange(1, 1000) for _ in range(rng.randint(1, 40))] for _ in range(30)]
        prompts += [list(prompts[3]), list(prompts[7])]  # duplicates
        if job % 2:
            prompts.append([5000 + rng.randrange(100) for _ in range(9)])  # outside the prefix
        rng.shuffle(prompts)
        jobs.append(prompts)
    return jobs


def _reference_layout(batch: StreamBatch) -> tuple[list[int], list[int]]:
    """Stream tokens and positions of a batch, token by token in Python: the reference layout."""
    ids: list[int] = []
    positions: list[int] = []
    for group_id, group in batch.groups.items():
        prefix = [int(t) for t in group.prefix_ids]
        if batch.compute_prefix[group_id] and prefix:
            ids += prefix
            positions += list(range(len(prefix)))
        for suffix in group.suffix_ids:
            ids += [int(t) for t in suffix]
            positions += list(range(len(prefix), len(prefix) + len(suffix)))
    return ids, positions


def _planned(jobs: list[list[list[int]]], budget: int) -> tuple[list[StreamBatch], StreamState]:
    """Parts of 5 prompts without a prefix hint: each job's prefix is what its first part shares."""
    state = StreamState()
    parts = [
        JobPart(j, prompts[i : i + 5]) for j, prompts in enumerate(jobs) for i in range(0, len(prompts), 5)
    ]
    return list(plan_stream([len(j) for j in jobs], parts, BatchPlanner(budget, 96), state)), state


def test_token_rows_hold_the_prompts_as_int32() -> None:
    prompts = [[1, 2, 3], [7], [1, 2, 9, 9], [1, 2]]
    rows = TokenRows.from_lists(prompts)
    assert rows.tokens.dtype == np.int32 and rows.tokens.flags.c_contiguous
    assert [rows.row(i).tolist() for i in range(len(rows))] == prompts
    # Starts with [1, 2] and goes on past it: not [7], not [1, 2] itself.
    assert rows.starting_with(np.array([1, 2], np.int32)).tolist() == [True, False, True, False]
    assert rows.starting_with(np.array([], np.int32)).tolist() == [True, True, True, True]


def test_int32_layout_equals_the_reference_layout() -> None:
    jobs = _jobs(random.Random(3))
    batches, _ = _planned(jobs, budget=200)
    assert len(batches) > 4
    for batch in batches:
        slices = [
            GroupSlice(g, 0, len(group.suffix_ids), batch.compute_prefix[g], batch.save_prefix[g])
            for g, group in batch.groups.items()
        ]
        packed = build_batch(batch.groups, slices)
        ids, positions = _reference_layout(batch)
        assert packed.input_ids.tolist() == ids
        assert packed.positions.tolist() == positions
        # The same batch with Python lists (the layout before int32 buffers) is laid out identically.
        as_lists = {
            g: PrefixGroup(
                [int(t) for t in group.prefix_ids], [[int(t) for t in s] for s in group.suffix_ids]
            )
            for g, group in batch.groups.items()
        }
        listed = build_batch(as_lists, slices)
        for name in ("input_ids", "positions", "segment_last", "prompt_segments"):
            assert torch.equal(getattr(packed, name), getattr(listed, name)), name
        assert np.array_equal(packed.segments, listed.segments)
        assert packed.kv_len == listed.kv_len and packed.load == listed.load
        assert [(g, r.tolist()) for g, r in packed.save] == [(g, r.tolist()) for g, r in listed.save]


def test_plan_covers_each_distinct_prompt_once_within_budget_and_computes_each_prefix_once() -> None:
    jobs = _jobs(random.Random(5))
    budget = 200
    batches, state = _planned(jobs, budget)
    seen: dict[tuple[int, int], list[int]] = {}
    computed: dict[int, int] = {}
    for number, batch in enumerate(batches):
        cost = 0
        for g, group in batch.groups.items():
            if batch.compute_prefix[g]:
                computed[g] = computed.get(g, 0) + 1
                cost += len(group.prefix_ids)
            else:
                assert g in computed, "a prefix is loaded only after a batch computed it"
            cost += sum(len(s) for s in group.suffix_ids)
        assert cost == batch.tokens
        assert cost <= budget or batch.num_prompts == 1
        if number == 0:
            assert cost < budget, "the first batch is small, so the GPU starts early"
        for g, group in batch.groups.items():
            for suffix, key in zip(group.suffix_ids, batch.rows[g]):
                seen.setdefault((key.job, key.prompt), []).append(number)
                prompt = [int(t) for t in group.prefix_ids] + [int(t) for t in suffix]
                assert prompt == state.jobs[key.job].distinct[key.prompt].tolist()
    assert all(count == 1 for count in computed.values())
    for j, prompts in enumerate(jobs):
        recorded = state.jobs[j]
        distinct = {tuple(p) for p in prompts}
        assert len(recorded.distinct) == len(distinct)
        assert all(len(seen[(j, i)]) == 1 for i in range(len(distinct)))
        # Each input prompt points at its own tokens; duplicates share one row.
        assert [recorded.distinct[w].tolist() for w in recorded.where] == prompts
    # The main group of each job carries the prefix its first part shares; prompts without it
    # (job 1 and 3 have one) are scored in a group of their own.
    for j, prompts in enumerate(jobs):
        first = next(b.groups[j] for b in batches if j in b.groups)
        assert len(first.prefix_ids) == list_prefix_length(prompts[:5])
    assert any(g >= len(jobs) for batch in batches for g in batch.groups)


@pytest.mark.parametrize("growth", [1.0, 1.5, 2.0])
def test_batches_fill_their_targets_to_within_one_prompt(growth: float) -> None:
    """Each batch holds at most its target (the first's, then growing by ``growth`` up to the budget)
    and closes only when the next prompt would take it over: its size, padded to a CUDA graph's
    shape, then repeats from call to call."""
    rng = random.Random(6)
    sizes = [rng.randint(1, 40) for _ in range(300)]
    planner = BatchPlanner(500, 96, growth)
    batches: list[tuple[StreamBatch, int]] = []  # (batch, the cost of the prompt that closed it)
    for i, size in enumerate(sizes):
        closed = planner.add(0, np.empty(0, np.int32), np.ones(size, np.int32), RowKey(0, i))
        if closed is not None:
            batches.append((closed, size))
    last = planner.finish()
    assert last is not None
    target = 96.0
    for batch, next_cost in batches:
        assert batch.tokens <= int(target) < batch.tokens + next_cost
        target = min(int(growth * target), 500)
    assert last.tokens <= int(target)
    assert sum(b.tokens for b, _ in batches) + last.tokens == sum(sizes)
    with pytest.raises(ValueError, match="growth"):
        BatchPlanner(500, 96, 0.5)


def test_a_small_growth_still_grows_the_targets_and_a_first_target_must_be_positive() -> None:
    """Targets grow by ``growth`` rounded up: rounded down, 8 tokens grown by 1.1 stayed 8 for every
    batch of the call (and a first target of 0 stayed 0: a batch a prompt, with no error)."""
    planner = BatchPlanner(40, 8, 1.1)
    closed = [planner.add(0, np.empty(0, np.int32), np.ones(1, np.int32), RowKey(0, i)) for i in range(400)]
    sizes = [batch.tokens for batch in closed if batch is not None]
    assert sizes[:6] == [8, 9, 10, 11, 13, 15]
    assert max(sizes) == 40, "up to the budget"
    with pytest.raises(ValueError, match="first_batch_tokens must be positive, got 0"):
        BatchPlanner(40, 0)


def test_a_nearly_full_batch_leaves_with_its_part() -> None:
    """A batch that a prompt as large as any seen would overflow goes out at the end of its part,
    before the next part is taken (tokenized)."""
    taken: list[int] = []

    def parts() -> Iterator[JobPart]:
        for number in range(3):
            taken.append(number)
            yield JobPart(0, [[5, 6] + [10 + 3 * number + k] * 30 for k in range(3)])

    planner = BatchPlanner(1000, 100)
    batches = plan_stream([9], parts(), planner, StreamState())
    first = next(batches)
    assert taken == [0], "the first batch left before the second part was taken"
    assert first.tokens == 2 + 3 * 30  # the shared prefix [5, 6] once, then three suffixes
    rest = list(batches)
    assert [b.num_prompts for b in rest] == [6]
    empty = BatchPlanner(1000, 100)
    assert empty.ripe() is None
    empty.add(0, np.empty(0, np.int32), np.ones(10, np.int32), RowKey(0, 0))
    assert empty.ripe() is None, "room left for a prompt as large as any seen"


def test_the_first_batch_leaves_with_the_first_part_short_of_its_target() -> None:
    """The first part's prompts go out as the first batch even when a prompt as large as any seen
    would still fit: the GPU starts without waiting for the second part to be tokenized. Later
    targets grow from the first batch's target, not from what it held, and a later part's end
    closes a batch only when it is full."""
    taken: list[int] = []

    def parts() -> Iterator[JobPart]:
        for number in range(6):
            taken.append(number)
            yield JobPart(0, [[5, 6] + [100 * number + k] * 20 for k in range(4)])

    planner = BatchPlanner(10_000, 200)
    batches = plan_stream([24], parts(), planner, StreamState())
    first = next(batches)
    assert taken == [0], "the first batch left before the second part was taken"
    assert first.tokens == 2 + 4 * 20 and first.num_prompts == 4
    assert [key.prompt for key in first.ordered_rows()] == [0, 1, 2, 3]
    rest = list(batches)
    # Target 400 after the first batch's 200: 20 prompts of 20 tokens, the prefix computed already.
    assert [b.num_prompts for b in rest] == [20]
    assert rest[0].tokens == 400
    assert [key.prompt for key in rest[0].ordered_rows()] == list(range(4, 24))


def test_only_the_first_batch_leaves_early() -> None:
    """A first part that fills the first batch closes it as usual; the rest of that part waits for
    the next part's prompts (no second, small batch at the end of the first part)."""
    taken: list[int] = []

    def parts() -> Iterator[JobPart]:
        for number in range(3):
            taken.append(number)
            yield JobPart(0, [[100 * number + k] * 30 for k in range(5)])

    planner = BatchPlanner(10_000, 100)
    batches = plan_stream([15], parts(), planner, StreamState())
    first = next(batches)
    assert taken == [0] and first.tokens == 90 and first.num_prompts == 3
    second = next(batches)
    assert taken == [0, 1], "the second batch waited for the next part's prompts"
    assert second.num_prompts == 6 and second.tokens == 180
    assert [b.num_prompts for b in batches] == [6]


def test_the_producer_runs_ahead_and_results_come_in_order() -> None:
    made = [threading.Event() for _ in range(6)]

    def produce(item: int) -> int:
        made[item].set()
        return item * item

    got = []
    with Prefetcher(range(6), produce, depth=2) as results:
        for value in results:
            if value == 0:
                # Item 1 is made while the consumer still holds item 0: the producer is ahead.
                assert made[1].wait(10)
            got.append(value)
    assert got == [i * i for i in range(6)]


def test_an_error_in_the_producer_reaches_the_consumer_and_nothing_hangs() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("part 3 is bad")

    got = []
    prefetcher = Prefetcher(items(), lambda x: x, depth=1)
    with pytest.raises(ValueError, match="part 3 is bad"):
        with prefetcher as results:
            for value in results:
                got.append(value)
    assert got == [1, 2]
    assert not prefetcher._thread.is_alive()


def _items_until_blocked(blocked: threading.Event) -> Iterator[int]:
    """Counts up, setting ``blocked`` as it makes item 2: with depth 1, item 0 is taken and item 1
    queued, so the producer blocks on putting this one."""
    for i in range(1000):
        if i == 2:
            blocked.set()
        yield i


def test_a_consumer_that_stops_early_stops_the_producer() -> None:
    started = threading.Event()

    prefetcher = Prefetcher(_items_until_blocked(started), lambda x: x, depth=1)
    with pytest.raises(RuntimeError, match="consumer failed"):
        with prefetcher as results:
            for value in results:
                assert started.wait(10)
                raise RuntimeError(f"consumer failed at {value}")
    assert not prefetcher._thread.is_alive()


def test_a_producer_ends_by_itself_when_the_exit_that_joins_it_is_interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second KeyboardInterrupt that lands while the first one's exit waits for the producer: the
    old exit drained the queue to free a producer blocked on it, so interrupted there it left the
    producer blocked on a full queue for good, holding its items. Now the producer sees the consumer
    has left and ends."""
    blocked = threading.Event()

    prefetcher = Prefetcher(_items_until_blocked(blocked), lambda x: x, depth=1)
    real_join = prefetcher._thread.join

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # the second Ctrl-C

    with pytest.raises(KeyboardInterrupt):
        with prefetcher as results:
            for _ in results:
                assert blocked.wait(10)
                # Whatever the exit waits on (the queue, the thread) is interrupted.
                monkeypatch.setattr(prefetcher._queue, "get", interrupted)
                monkeypatch.setattr(prefetcher._thread, "join", interrupted)
                raise KeyboardInterrupt  # the first Ctrl-C
    monkeypatch.undo()
    real_join(10)
    assert not prefetcher._thread.is_alive(), "the producer ended by itself"


@pytest.fixture(scope="module")
def small_batch_scorer(scorer: GenerativeScorer) -> GenerativeScorer:
    """The session's tiny model with a small packed budget, so a call runs many batches."""
    return GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, max_length=512, forward="packed", max_batch_tokens=256
    )


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.mark.slow
def test_streamed_scores_equal_the_official_recipe(
    small_batch_scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    rng = random.Random(11)
    queries = [_text(rng, n) for n in (4, 9, 2)]
    pairs = [(q, _text(rng, rng.randint(1, 60))) for q in queries for _ in range(12)]
    pairs.insert(5, pairs[2])  # a duplicate
    rng.shuffle(pairs)
    scorer = small_batch_scorer
    stream = scorer.front_end.stream_pairs(pairs, first_part_chars=200, part_chars=500)
    parts = list(stream.parts())
    assert len(parts) > len(queries), "several parts per query"
    stream = scorer.front_end.stream_pairs(pairs, first_part_chars=200, part_chars=500)
    batches: list[int] = []
    scores = scorer.engine.score_stream(stream.jobs, stream.parts(), on_progress=batches.append)
    assert len(batches) > 4 and sum(batches) == len(pairs)
    got = [score for score, _ in stream.assemble(scores)]
    model, tokenizer = reference_model
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=scorer.max_length)
    worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    assert worst <= 1e-5, f"max |score - official| = {worst:.3g}"


def test_a_large_rerank_takes_the_stream(
    small_batch_scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    scorer = small_batch_scorer
    rng = random.Random(12)
    documents = [_text(rng, rng.randint(20, 60)) for _ in range(260)]
    assert sum(map(len, documents)) > 65_536  # what a call needs to be streamed
    calls: list[bool] = []
    engine = scorer.engine
    original = engine.score_stream

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    engine.score_stream = recording  # type: ignore[method-assign]
    try:
        ranked = scorer.rerank("capital of france", documents)
    finally:
        del engine.score_stream
    assert calls == [1], "one streamed call of one job"
    # The official recipe on every 13th document (its full-vocabulary logits are slow on the CPU).
    sample = list(range(0, len(documents), 13))
    model, tokenizer = reference_model
    expected = official_qwen3_scores(
        model, tokenizer, [("capital of france", documents[i]) for i in sample], max_length=scorer.max_length
    )
    got = {r.index: r.score for r in ranked}
    assert len(got) == len(documents)
    assert max(abs(got[i] - e) for i, e in zip(sample, expected)) <= 1e-5


def test_an_error_of_a_later_part_reaches_the_caller_after_earlier_batches_ran(
    small_batch_scorer: GenerativeScorer,
) -> None:
    scorer = small_batch_scorer
    rng = random.Random(2)
    documents = [_text(rng, 40) for _ in range(20)]
    stream = scorer.front_end.stream_pairs(
        [("q", d) for d in documents], first_part_chars=100, part_chars=300
    )
    ran: list[int] = []

    def failing() -> Iterator[JobPart]:
        for number, part in enumerate(stream.parts()):
            if number == 3:
                raise PromptTooLongError("part 3 cannot be built", param="documents", index=9)
            yield part

    with pytest.raises(PromptTooLongError, match="part 3") as raised:
        scorer.engine.score_stream(stream.jobs, failing(), on_progress=ran.append)
    assert raised.value.index == 9
    assert ran, "the batches of the parts before the error ran"
    assert not [t for t in threading.enumerate() if t.name == "genscore-host-batches"]
    # Nothing is left holding the engine.
    assert len(scorer.score_documents("q", documents[:3])) == 3


def test_streamed_jobs_of_mixed_modes_score_as_whole_jobs_with_duplicates_tied(
    small_batch_scorer: GenerativeScorer,
) -> None:
    """Several jobs in one stream, each with its own score mode and duplicates, some spread over
    several batches: each job's scores, in its prompt order, equal the whole-call path's, and a
    repeated prompt gets the very same score as its first copy."""
    scorer = small_batch_scorer
    rng = random.Random(21)
    modes: list[Any] = ["label-softmax", "logit", "logit-sigmoid", "vocab-softmax"]
    jobs = []
    for number, mode in enumerate(modes):
        documents = [_text(rng, rng.randint(3, 30)) for _ in range(9 + 3 * number)]
        documents[4] = documents[1]  # a duplicate within the job
        query = f"query {number} {_text(rng, 3)}"
        [job] = scorer.prepare_pairs([(query, d) for d in documents]).jobs
        jobs.append(ScoringJob(job.prompts, job.label_ids, score_mode=mode))
    parts = [
        JobPart(j, job.prompts[i : i + 4])
        for j, job in enumerate(jobs)
        for i in range(0, len(job.prompts), 4)
    ]
    streamed = [StreamedJob(len(job.prompts), job.label_ids, job.mode) for job in jobs]
    batches: list[int] = []
    got = scorer.engine.score_stream(streamed, parts, on_progress=batches.append)
    assert len(batches) > len(jobs), "the jobs were spread over several batches"
    expected = scorer.engine.score_jobs(jobs)
    for job_got, job_expected in zip(got, expected, strict=True):
        assert len(job_got) == len(job_expected)
        assert max(abs(a - b) for a, b in zip(job_got, job_expected)) <= 1e-5
        assert job_got[4] == job_got[1], "a repeated prompt keeps its first copy's score exactly"


def test_a_bad_streamed_score_names_its_job_row(
    small_batch_scorer: GenerativeScorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scores come back in one copy and are checked on the host: a NaN in the second job names
    that job's prompt, as the check on each job's own scores does."""
    scorer = small_batch_scorer
    engine = scorer.engine
    prompts = [[[7, 8, 9 + i, 10 + i] for i in range(5)], [[3, 4, 20 + i] for i in range(6)]]
    label_ids = scorer.front_end.label_token_ids
    real = engine.head.scores
    calls: list[int] = []

    def scores(
        hidden: torch.Tensor, ids: list[int], mode: Any = "label-softmax", temperature: float = 1.0
    ) -> torch.Tensor:
        out = real(hidden, ids, mode, temperature)
        calls.append(len(out))
        if len(calls) == 2:
            out = out.clone()
            out[2] = float("nan")
        return out

    monkeypatch.setattr(engine.head, "scores", scores)
    streamed = [StreamedJob(len(p), label_ids) for p in prompts]
    parts = [JobPart(j, p) for j, p in enumerate(prompts)]
    with pytest.raises(ScoreRangeError, match="prompt 2 of job 1 scored nan") as caught:
        engine.score_stream(streamed, parts)
    assert calls == [5, 6]
    assert (caught.value.job, caught.value.prompt) == (1, 2)


def test_a_stream_keeps_one_score_a_row_not_a_hidden_state(
    small_batch_scorer: GenerativeScorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch's rows are scored as the batch runs: what the call holds on the device until its
    end is one number a prompt (it held every prompt's hidden state, 4 KB a prompt at hidden size
    1,024). Jobs of other labels or modes in one batch get their own head, as score_jobs gives."""
    engine = small_batch_scorer.engine
    labels = small_batch_scorer.front_end.label_token_ids
    rng = random.Random(5)
    prompts = [[[7, 8, *(rng.randrange(100, 5000) for _ in range(rng.randint(2, 30)))] for _ in range(12)]
               for _ in range(3)]  # fmt: skip
    kinds = [(labels, "label-softmax"), (labels[::-1], "label-softmax"), (labels, "vocab-softmax")]
    streamed = [StreamedJob(len(p), list(ids), mode) for p, (ids, mode) in zip(prompts, kinds)]
    held: list[tuple[int, ...]] = []
    real_run = engine.forward.run_stream

    def run_stream(*args: Any, **kwargs: Any) -> Any:
        out, keys = real_run(*args, **kwargs)
        held.append(tuple(out.shape))
        return out, keys

    monkeypatch.setattr(engine.forward, "run_stream", run_stream)
    got = engine.score_stream(streamed, [JobPart(j, p) for j, p in enumerate(prompts)])
    assert held == [(36,)]
    expected = engine.score_jobs(
        [ScoringJob(p, list(ids), score_mode=mode) for p, (ids, mode) in zip(prompts, kinds)]
    )
    for job_got, job_expected in zip(got, expected, strict=True):
        assert max(abs(a - b) for a, b in zip(job_got, job_expected, strict=True)) <= 1e-6
    assert got[0] != got[1]  # the swapped labels really scored apart


def test_a_bad_score_of_the_engine_names_the_input_it_was_built_from(
    small_batch_scorer: GenerativeScorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine knows a bad score as a distinct prompt of a job; what reaches the caller of
    rerank or score_pairs names the document or pair, the first one given when it repeats."""
    scorer = small_batch_scorer
    engine = scorer.engine
    real = engine.head.scores
    planted: list[int] = []  # the distinct row of the first head call that gets NaN

    def scores(
        hidden: torch.Tensor, ids: list[int], mode: Any = "label-softmax", temperature: float = 1.0
    ) -> torch.Tensor:
        out = real(hidden, ids, mode, temperature)
        if planted:
            out = out.clone()
            out[planted.pop()] = float("nan")
        return out

    monkeypatch.setattr(engine.head, "scores", scores)
    docs = ["a bridge of stone", "a bridge of stone", "the river floods", "old maps of the valley"]
    # Distinct prompts: the bridge (documents 0 and 1), the river, the maps; row 1 is documents[2].
    planted.append(1)
    with pytest.raises(ScoreRangeError, match=r"^documents\[2\] scored nan") as caught:
        scorer.rerank("where is the bridge", docs)
    assert (caught.value.param, caught.value.index) == ("documents", 2)
    assert scorer.engine.streams  # the streamed path named it

    # Two queries: the first query's job holds pairs 0 and 2; its row 1 is pairs[2].
    pairs = [("bridge", docs[0]), ("river", docs[2]), ("bridge", docs[3])]
    planted.append(1)
    with pytest.raises(ScoreRangeError, match=r"^pairs\[2\] scored nan") as caught:
        scorer.score_pairs(pairs)
    assert (caught.value.param, caught.value.index) == ("pairs", 2)
    # The whole (not streamed) path names it the same way.
    planted.append(1)
    with pytest.raises(ScoreRangeError, match=r"^documents\[2\] scored nan"):
        scorer.rerank("where is the bridge", docs, max_tokens_per_doc=64)


def test_a_streamed_rerank_reports_prompts_as_the_whole_path_does(
    small_batch_scorer: GenerativeScorer,
) -> None:
    """The stream keeps a summary of each prompt, not its ids: each result's token count and
    truncation, and the call's usage, equal those of the prompts built whole."""
    scorer = small_batch_scorer
    rng = random.Random(34)
    documents = [_text(rng, rng.randint(20, 60)) for _ in range(250)]
    documents += [_text(rng, 700) for _ in range(4)]  # over max_length=512: truncated
    documents.insert(7, documents[3])  # a duplicate
    assert sum(map(len, documents)) > 65_536, "the call is streamed"
    stream = scorer.front_end.stream_pairs([("capital of france", d) for d in documents])
    assert stream.streams
    ranked = scorer.rerank("capital of france", documents)
    whole = scorer.prepare_pairs([("capital of france", d) for d in documents]).prompts
    by_index = {r.index: r for r in ranked}
    assert [(by_index[i].prompt_tokens, by_index[i].truncated) for i in range(len(documents))] == [
        (len(p.token_ids), p.truncated) for p in whole
    ]
    assert sum(p.truncated for p in whole) == 4
    assert ranked.prompt_tokens == sum(len(p.token_ids) for p in whole)
    assert by_index[7].score == by_index[3].score


def _recovered(scorer: GenerativeScorer, reference_model: tuple[object, object]) -> None:
    """After a failed call: no producer thread is left, and the engine scores a small call as the
    official recipe does (it is not left broken)."""
    assert not [t for t in threading.enumerate() if t.name == "genscore-host-batches"]
    rng = random.Random(5)
    pairs = [("capital of france", _text(rng, rng.randint(3, 30))) for _ in range(7)]
    model, tokenizer = reference_model
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=scorer.max_length)
    got = scorer.score_pairs(pairs)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-5


def _prompts_of(scorer: GenerativeScorer, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    pairs = [("capital of france", _text(rng, rng.randint(20, 40))) for _ in range(count)]
    [job] = scorer.prepare_pairs(pairs).jobs
    return job.prompts


@pytest.mark.parametrize(
    ("declared", "parts_of", "message"),
    [
        # Fewer prompts than declared: the old engine returned 12 scores for a job of 18.
        (18, [(0, 0, 6), (0, 6, 12)], "job 0 was declared with 18 prompts, but its parts held 12"),
        # More: the old engine released the job's kept prefix at 6 prompts, then failed on a KeyError.
        (6, [(0, 0, 6), (0, 6, 12)], "job 0 was declared with 6 prompts, but its parts hold more"),
        # A part of a job the call does not have: IndexError, or, for -1, the last job's scores.
        (12, [(0, 0, 6), (1, 6, 12)], "a part is of job 1, but the call has 1 jobs"),
        (12, [(0, 0, 6), (-1, 6, 12)], "a part is of job -1, but the call has 1 jobs"),
    ],
)
def test_parts_that_do_not_match_their_jobs_are_refused_naming_the_job(
    small_batch_scorer: GenerativeScorer,
    reference_model: tuple[object, object],
    declared: int,
    parts_of: list[tuple[int, int, int]],
    message: str,
) -> None:
    scorer = small_batch_scorer
    prompts = _prompts_of(scorer, 12, seed=3)
    parts = [JobPart(job, prompts[start:stop]) for job, start, stop in parts_of]
    streamed = [StreamedJob(declared, scorer.front_end.label_token_ids)]
    with pytest.raises(ValueError, match=message):
        scorer.engine.score_stream(streamed, parts)
    _recovered(scorer, reference_model)


def _failing_parts(prompts: list[list[int]], error: BaseException, at: int) -> Iterator[JobPart]:
    for number, start in enumerate(range(0, len(prompts), 4)):
        if number == at:
            raise error
        yield JobPart(0, prompts[start : start + 4])


def test_an_error_of_the_parts_that_reads_like_out_of_memory_reaches_the_caller(
    small_batch_scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    """A tokenizer's error that mentions running out of memory is the caller's: the old engine took
    it for the forward's, scored again whatever parts were left (none: the generator had died) and
    returned 8 scores for a job of 20."""
    scorer = small_batch_scorer
    prompts = _prompts_of(scorer, 20, seed=4)
    failure = RuntimeError("tokenizer: out of memory while encoding a batch")
    streamed = [StreamedJob(len(prompts), scorer.front_end.label_token_ids)]
    with pytest.raises(RuntimeError, match="tokenizer: out of memory") as raised:
        scorer.engine.score_stream(streamed, _failing_parts(prompts, failure, at=2))
    assert raised.value is failure
    _recovered(scorer, reference_model)


def test_parts_that_fail_while_the_forward_runs_out_of_memory_report_their_error(
    small_batch_scorer: GenerativeScorer,
    reference_model: tuple[object, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward runs out of memory on its first batch once the parts have failed on the producer
    thread, so the failure is still queued when the producer is stopped. The old engine dropped it
    there, scored again what the producer had taken and returned a job short of its prompts."""
    scorer = small_batch_scorer
    engine = scorer.engine
    prompts = _prompts_of(scorer, 20, seed=6)
    parts_failed = threading.Event()
    failure = PromptTooLongError("document 9 cannot be built", param="documents", index=9)

    def parts() -> Iterator[JobPart]:
        for number, start in enumerate(range(0, len(prompts), 4)):
            if number == 2:
                parts_failed.set()
                raise failure
            yield JobPart(0, prompts[start : start + 4])

    real = engine.forward.decode
    decoded: list[int] = []

    def decode(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        if len(decoded) > 1:  # the batches of a call scored again
            return real(*args, **kwargs)
        assert parts_failed.wait(30), "the producer reached the failing part"
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(engine.forward, "decode", decode)
    streamed = [StreamedJob(len(prompts), scorer.front_end.label_token_ids)]
    with pytest.raises(PromptTooLongError, match="document 9") as raised:
        engine.score_stream(streamed, parts())
    assert raised.value.index == 9
    monkeypatch.undo()
    _recovered(scorer, reference_model)


def test_the_forward_out_of_memory_mid_stream_scores_every_prompt_again_and_counts_it_once(
    small_batch_scorer: GenerativeScorer,
    reference_model: tuple[object, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward fails on its third streamed batch: the call is scored again in the forward's own
    batches, every score equals the official recipe's, and progress counts each prompt once, as
    the out-of-memory policy says (the old engine reported none of the batches scored again: 12 of
    19 prompts, and a cancelled call was not stopped there)."""
    scorer = small_batch_scorer
    engine = scorer.engine
    rng = random.Random(8)
    pairs = [("capital of france", _text(rng, rng.randint(10, 40))) for _ in range(18)]
    pairs.insert(11, pairs[2])  # a duplicate, reported at the end of the call
    [job] = scorer.prepare_pairs(pairs).jobs
    real = engine.forward.decode
    streamed_batches: list[int] = []

    def decode(*args: Any, **kwargs: Any) -> Any:
        if args[1] is not None:  # the streamed path's batches come copied to the device already
            streamed_batches.append(1)
            if len(streamed_batches) == 3:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.forward, "decode", decode)
    parts = [JobPart(0, job.prompts[i : i + 4]) for i in range(0, len(job.prompts), 4)]
    progress: list[int] = []
    streamed = [StreamedJob(len(job.prompts), job.label_ids, job.mode)]
    [got] = engine.score_stream(streamed, parts, on_progress=progress.append)
    assert len(streamed_batches) == 3
    assert sum(progress) == len(pairs), f"progress {progress}"
    assert len([done for done in progress if done]) > 3, "the batches scored again were reported"
    model, tokenizer = reference_model
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=scorer.max_length)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-5


def test_warm_up_streams_one_call_that_fills_each_batch_size_once(scorer: GenerativeScorer) -> None:
    """``ScoringEngine.warm_up`` goes through the contract's ``score_stream``: one job of made-up
    prompts sharing a prefix, as many as the batches of a streamed call fill (4,096 tokens first,
    twice as many each later batch, up to the forward's budget)."""
    engine = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, max_length=512, forward="packed", max_batch_tokens=20_000
    ).engine
    calls: list[tuple[list[StreamedJob], list[JobPart]]] = []
    original = engine.score_stream

    def recording(jobs: Any, parts: Any, on_progress: Any = None, *, layout: Any = None) -> Any:
        listed = list(parts)
        calls.append((list(jobs), listed))
        return original(jobs, listed, on_progress, layout=layout)

    engine.score_stream = recording  # type: ignore[method-assign]
    try:
        engine.warm_up(320)
    finally:
        del engine.score_stream
    [(jobs, parts)] = calls
    # The batches' targets: 4,096, 8,192, 16,384, then the budget.
    expected = (4096 + 8192 + 16_384 + 20_000) // 320
    assert [job.size for job in jobs] == [expected]
    prompts = [list(prompt) for part in parts for prompt in part.prompts]
    assert len(prompts) == expected and {len(prompt) for prompt in prompts} == {320}
    assert list_prefix_length(prompts) >= 80, "the prompts share a quarter of their tokens"


# -- distinct queries share the template's head ----------------------------------------------------


def _template_jobs(rng: random.Random) -> tuple[list[int], list[list[list[int]]]]:
    """A 20-token head; 12 jobs of one prompt and 2 of two (distinct queries, each starting with a
    token of its own), one of 10 prompts, and one single prompt without the head."""
    head = [rng.randrange(1, 1000) for _ in range(20)]

    def prompt(query: list[int]) -> list[int]:
        return head + query + [rng.randrange(1, 1000) for _ in range(rng.randint(5, 40))]

    jobs = [[prompt([2000 + j, rng.randrange(1, 1000)])] for j in range(12)]
    jobs += [[prompt([3000 + j, 7]), [*prompt([3000 + j, 7])[:-1], 8]] for j in range(2)]
    long_query = [4000] + [rng.randrange(1, 1000) for _ in range(30)]
    jobs.append([prompt(long_query) for _ in range(10)])
    jobs.append([[5000 + rng.randrange(100) for _ in range(15)]])
    return head, jobs


def test_jobs_of_distinct_queries_share_the_template_head_once_per_call() -> None:
    head, jobs = _template_jobs(random.Random(21))
    state = StreamState()
    parts = [JobPart(j, prompts) for j, prompts in enumerate(jobs)]
    batches = list(plan_stream([len(j) for j in jobs], parts, BatchPlanner(200, 96), state))
    template = 2 * len(jobs)
    seen: list[tuple[int, int]] = []
    for batch in batches:
        for g, group in batch.groups.items():
            for suffix, key in zip(group.suffix_ids, batch.rows[g], strict=True):
                seen.append((key.job, key.prompt))
                prompt = [int(t) for t in group.prefix_ids] + [int(t) for t in suffix]
                assert prompt == state.jobs[key.job].distinct[key.prompt].tolist()
    assert sorted(seen) == sorted({(j, p) for j, prompts in enumerate(jobs) for p in range(len(prompts))})
    computed = [b for b in batches if template in b.groups and b.compute_prefix[template]]
    assert len(computed) == 1 and [int(t) for t in computed[0].groups[template].prefix_ids] == head
    members = {key.job for b in batches if template in b.groups for key in b.rows[template]}
    assert members == set(range(14)), "the jobs of one and two prompts, not the 10-prompt job nor the odd one"
    plain = sum(len(p) for prompts in jobs for p in prompts)
    assert sum(b.tokens for b in batches) < plain - 12 * len(head), "the head computed once, not once a job"


def test_share_template_regroups_small_jobs_and_maps_their_rows_back() -> None:
    head, jobs = _template_jobs(random.Random(22))
    groups = [group_prompts(prompts) for prompts in jobs]
    run, rows = share_template(groups)
    assert rows is not None and len(run) == 3 and run[-1].prefix_ids == head
    flat = [prompt for group in run for prompt in group.prompts()]
    assert [flat[r] for r in rows] == [p for g in groups for p in g.prompts()]
    assert share_template(groups[:1] + groups[-2:]) == (groups[:1] + groups[-2:], None), "one candidate"
    short_head = [group_prompts([[1, 2, 3, 10 + j, 5]]) for j in range(4)]
    assert share_template(short_head) == (short_head, None), "3 shared tokens: too few"


@pytest.mark.slow
def test_distinct_queries_score_as_the_official_recipe_through_both_paths(
    small_batch_scorer: GenerativeScorer, reference_model: tuple[object, object]
) -> None:
    rng = random.Random(23)
    pairs = [(_text(rng, 3), _text(rng, rng.randint(5, 40))) for _ in range(14)]
    pairs += [(pairs[0][0], _text(rng, 9))]  # a query of two documents
    scorer = small_batch_scorer
    model, tokenizer = reference_model
    expected = official_qwen3_scores(model, tokenizer, pairs, max_length=scorer.max_length)
    streamed = scorer.score_pairs(pairs)
    prepared = scorer.prepare_pairs(pairs)
    assert sum(len(job.prompts) <= 2 for job in prepared.jobs) >= 2
    whole = [score for score, _ in prepared.assemble(scorer.engine.score_jobs(prepared.jobs))]
    for got in (streamed, whole):
        worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
        assert worst <= 1e-5, f"max |score - official| = {worst:.3g}"


def test_pair_parts_cover_every_document_in_order_and_mix_queries_in_a_part() -> None:
    from genscore_core.frontend import pair_parts

    # One query: the ranges a query's documents always had (first part 100 chars and two documents).
    one = [["x" * 30] * 10]
    assert [r for part in pair_parts(one, 100, 200) for r in part] == [(0, 0, 4), (0, 4, 10)]
    assert [len(part) for part in pair_parts(one, 100, 200)] == [1, 1]
    # Many distinct queries of one document each: a part holds several queries, each whole.
    distinct = [["y" * 40] for _ in range(12)]
    parts = list(pair_parts(distinct, 100, 200))
    assert [len(part) for part in parts] == [3, 5, 4]
    assert [r for part in parts for r in part] == [(j, 0, 1) for j in range(12)]
    # A query's first range holds two of its documents even where the part is nearly full.
    mixed = [["z" * 90], ["z" * 5] * 3, ["z" * 300]]
    ranges = [r for part in pair_parts(mixed, 100, 200) for r in part]
    assert ranges[:2] == [(0, 0, 1), (1, 0, 2)] and ranges[-1] == (2, 0, 1)
    assert sum(stop - start for _, start, stop in ranges) == 5
