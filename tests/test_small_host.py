"""Host work of a small call made cheaper (docs/benchmarks.md, "Small calls"): each piece against
the code it replaced, restated here as the reference, or against a plain restatement of its rule."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from genscore_core.forward import PrefixGroup
from genscore_core.kernels.attention import DEFAULT_TILING, LAST_TOKEN_TILING, check_table, plan_blocks
from genscore_core.packed import build_batch, plan_batches
from genscore_core.packed.decoder import DeviceBatch, StaticShape, flat_layout, host_layout, save_rows
from genscore_core.packed.plan import PackedBatch
from tests.helpers.packed_reference import padded_shape as static_shape


def _reference_layout(
    batch: PackedBatch, shape: StaticShape | None = None
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The padded host layout as it was built before (numpy pads and a concatenation)."""
    table = check_table(batch.segments)
    segment_last = batch.segment_last.numpy()
    spare_tokens = 0 if shape is None else shape.tokens - batch.num_tokens
    if shape is not None and batch.load:
        table = table.copy()
        loaded = (table[:, 5] > 0) & (table[:, 4] >= batch.num_tokens)
        table[loaded, 4] += spare_tokens
    if spare_tokens > 0:
        assert shape is not None
        n = batch.num_tokens
        table = np.concatenate([table, [[n, spare_tokens, n, spare_tokens, 0, 0]]])
        segment_last = np.append(segment_last, shape.tokens - 1)
    last = table.copy()
    last[:, 0] = np.arange(len(last))
    last[:, 1] = 1
    blocks = plan_blocks(table, DEFAULT_TILING)
    last_blocks = plan_blocks(last, LAST_TOKEN_TILING)
    ids = batch.input_ids.numpy()
    positions = batch.positions.numpy()
    prompt_segments = batch.prompt_segments.numpy()
    if shape is not None:
        spare = shape.segments - 1
        ids = np.pad(ids, (0, shape.tokens - len(ids)))
        positions = np.pad(positions, (0, shape.tokens - len(positions)))
        segment_last = np.pad(segment_last, (0, shape.segments - len(segment_last)))
        prompt_segments = np.pad(prompt_segments, (0, shape.segments - len(prompt_segments)))
        table = np.pad(table, ((0, shape.segments - len(table)), (0, 0)))
        last = np.pad(last, ((0, shape.segments - len(last)), (0, 0)))
        blocks = np.concatenate([blocks, np.tile([[spare, 0]], (shape.blocks - len(blocks), 1))])
        last_blocks = np.concatenate(
            [last_blocks, np.tile([[spare, 0]], (shape.segments - len(last_blocks), 1))]
        )
    parts = [ids, positions, segment_last, prompt_segments, table, blocks, last, last_blocks]
    saved = torch.cat([rows for _, rows in batch.save]).numpy() if batch.save else None
    if shape is not None and shape.save:
        rows = saved if saved is not None else np.empty(0, np.int64)
        parts.append(np.pad(rows, (0, shape.save - save_rows(batch))))
    elif shape is None and saved is not None:
        parts.append(saved)
    return [np.ascontiguousarray(p, dtype=np.int64).reshape(-1) for p in parts], table, last


def _groups(rng: random.Random, count: int) -> list[PrefixGroup]:
    def ids(n: int) -> list[int]:
        return [rng.randrange(1000) for _ in range(n)]

    return [
        PrefixGroup(
            ids(rng.choice([0, 1, 7, 83])), [ids(rng.randint(1, 90)) for _ in range(rng.randint(1, 9))]
        )
        for _ in range(count)
    ]


def _batches() -> list[PackedBatch]:
    """Batches of every kind: whole groups, and groups over several batches (prefixes saved, loaded)."""
    out = []
    for seed, budget in [(0, 100_000), (1, 300), (2, 120), (3, 64)]:
        groups = _groups(random.Random(seed), 5)
        for slices in plan_batches(groups, budget):
            out.append(build_batch(groups, slices))
    assert any(b.load for b in out) and any(b.save for b in out)
    return out


def _shapes(batch: PackedBatch) -> list[StaticShape | None]:
    shapes: list[StaticShape | None] = [None]
    for step in (1, 16, 128):
        shapes.append(static_shape(batch, step))
    # More spare segments and blocks than the step gives, and spare saved rows.
    tight = static_shape(batch, 1)
    shapes.append(StaticShape(tight.tokens + 5, tight.segments + 16, tight.load + 128, tight.save + 128))
    return shapes


@pytest.mark.parametrize("index", range(12))
def test_the_flat_layout_is_the_padded_layout_it_replaced(index: int) -> None:
    batches = _batches()
    batch = batches[index % len(batches)]
    for shape in _shapes(batch):
        flat, sizes, table, last = flat_layout(batch, shape)
        parts, ref_table, ref_last = _reference_layout(batch, shape)
        assert sizes == [len(p) for p in parts]
        assert flat.dtype == torch.int64 and not flat.is_pinned()
        np.testing.assert_array_equal(flat.numpy(), np.concatenate(parts))
        np.testing.assert_array_equal(table, ref_table)
        np.testing.assert_array_equal(last, ref_last)
        views, view_table, _ = host_layout(batch, shape)
        for view, part in zip(views, parts, strict=True):
            np.testing.assert_array_equal(view, part)
        np.testing.assert_array_equal(view_table, ref_table)


def test_a_device_batch_refilled_holds_the_new_batch_only() -> None:
    """``fill`` puts a smaller batch into a static buffer made for a larger one of the same shape:
    every array (and the host tables the torch attention reads) is what a fresh buffer would hold."""
    batches = sorted(_batches(), key=lambda b: b.num_tokens)
    small, large = batches[0], batches[-1]
    shape = static_shape(large, 128)
    shape = StaticShape(shape.tokens, max(shape.segments, static_shape(small, 128).segments), 128, 128)
    dev = DeviceBatch.static(shape, torch.device("cpu"), large)
    dev.fill(small, shape)
    fresh = DeviceBatch.static(shape, torch.device("cpu"), small)
    torch.testing.assert_close(dev.buffer, fresh.buffer, rtol=0, atol=0)
    np.testing.assert_array_equal(dev.segments.host, fresh.segments.host)
    np.testing.assert_array_equal(dev.last_segments.host, fresh.last_segments.host)
    assert dev.num_prompts == small.num_prompts


def test_token_ids_as_lists_or_int32_arrays_lay_out_the_same_batch() -> None:
    groups = _groups(random.Random(5), 4)
    arrays = [
        PrefixGroup(g.prefix_ids, [np.asarray(s, dtype=np.int32) for s in g.suffix_ids]) for g in groups
    ]
    for slices in plan_batches(groups, 150):
        a, b = build_batch(groups, slices), build_batch(arrays, slices)
        assert a.input_ids.dtype == b.input_ids.dtype == torch.int64
        torch.testing.assert_close(a.input_ids, b.input_ids, rtol=0, atol=0)
        expected = [t for s in slices for t in _stream_of(groups[s.group], s.start, s.stop, s.compute_prefix)]
        assert a.input_ids.tolist() == expected


def _stream_of(group: PrefixGroup, start: int, stop: int, with_prefix: bool) -> list[int]:
    prefix = list(group.prefix_ids) if with_prefix else []
    return prefix + [t for suffix in group.suffix_ids[start:stop] for t in suffix]


# -- ranked results ------------------------------------------------------------------------------------


def _reference_ranking(
    scored: list[tuple[float, Any]], top_n: int | None, threshold: float | None
) -> list[int]:
    """Input indices best first: NaN last, ties in input order; then the threshold, then top_n."""
    finite = sorted((i for i, (s, _) in enumerate(scored) if s == s), key=lambda i: (-scored[i][0], i))
    nans = [i for i, (s, _) in enumerate(scored) if s != s]
    order = finite + nans
    if threshold is not None:
        order = [i for i in order if scored[i][0] >= threshold]
    return order if top_n is None else order[:top_n]


@pytest.mark.parametrize("top_n, threshold", [(None, None), (3, None), (None, 0.5), (2, 0.3), (50, 0.0)])
def test_rank_results_against_a_plain_sort(top_n: int | None, threshold: float | None) -> None:
    from genscore_core.prompts import EncodedPrompt, PromptSummary
    from genscore_core.results import RankedResult, RankedResults, rank_results

    rng = random.Random(11)
    values = [0.9, 0.5, 0.5, float("nan"), 0.1, 0.7, 0.5, 0.3, float("nan"), 1.0]
    prompts: list[Any] = []
    for i in range(len(values)):
        if i % 3 == 0:
            prompts.append(EncodedPrompt([1] * (10 + i), truncated=bool(i % 2)))
        else:
            prompts.append(PromptSummary(20 + i, i == 4, (i, 5 * i), 2, all_tokens=40 + i))
    scored = list(zip(values, prompts))
    documents = [f"document {i} " + "x" * rng.randrange(5) for i in range(len(values))]
    ranked = rank_results("the query", documents, scored, top_n=top_n, score_threshold=threshold)
    assert isinstance(ranked, RankedResults) and ranked.query == "the query"
    assert [r.index for r in ranked] == _reference_ranking(scored, top_n, threshold)
    for r in ranked:
        p = prompts[r.index]
        assert isinstance(r, RankedResult)
        assert (r.score == values[r.index]) or (r.score != r.score and values[r.index] != values[r.index])
        assert (r.document, r.truncated, r.prompt_tokens) == (documents[r.index], p.truncated, p.num_tokens)
        assert (r.window, r.windows) == (p.window, p.windows)
    # Usage counts every prompt scored, kept or not, and every window of a chunked document.
    assert ranked.prompt_tokens == sum(p.all_tokens or p.num_tokens for p in prompts)
