"""The packed forward (no padding, shared prefix computed once) against a plain per-prompt HF forward.

Everything runs on the CPU in float32: the same packing, prefix-reuse and layer code as on CUDA, with
the torch versions of the fused operations and blocked SDPA instead of the Triton kernels. The
kernels are checked against those torch versions through Triton's interpreter, one by one in
tests/kernels/ (test_fused_ops.py, test_segment_attention.py) and all together in
tests/kernels/test_packed_decoder_triton.py.
"""

from __future__ import annotations

import copy
import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

import genscore_core.packed.forward as packed_forward_module
from genscore_core import GenerativeScorer
from genscore_core.config import LocalSettings
from genscore_core.engine import select_forward
from genscore_core.forward import PaddedForward, PrefixGroup
from genscore_core.kernels.attention import DEFAULT_TILING
from genscore_core.packed import (
    DEFAULT_MAX_BATCH_TOKENS,
    PackedForward,
    PackedOptions,
    build_batch,
    plan_batches,
    supports,
    unsupported_reason,
)
from genscore_core.packed.decoder import DeviceBatch, StaticShape, host_layout, save_rows
from genscore_core.packed.graphs import DecoderGraphs, GraphLadder, LaunchCosts
from tests.helpers.packed_reference import ATOL, SPEC, padded_shape, random_groups, reference_rows


@pytest.fixture(scope="module")
def qwen3(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def _small_model(kind: str) -> Any:
    """A random in-memory Qwen2 (q/k/v biases, no q/k norms) or Llama model."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    common = dict(
        vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, initializer_range=0.2,
    )  # fmt: skip
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common, attention_bias=True, mlp_bias=True)).eval()


# -- packing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 10, 25, 40, 1000])
def test_plan_covers_every_prompt_once_in_order(budget: int) -> None:
    groups = random_groups(random.Random(0), 100, SPEC)
    plans = plan_batches(groups, budget)
    order = [(s.group, i) for slices in plans for s in slices for i in range(s.start, s.stop)]
    assert order == [(g, i) for g, group in enumerate(groups) for i in range(len(group.suffix_ids))]
    for g, group in enumerate(groups):
        computed = [s for slices in plans for s in slices if s.group == g and s.compute_prefix]
        assert len(computed) == 1, "each prefix is computed exactly once"
        batches = [b for b, slices in enumerate(plans) if any(s.group == g for s in slices)]
        assert computed[0].save_prefix == (len(batches) > 1 and len(group.prefix_ids) > 0)
    for slices in plans:
        batch = build_batch(groups, slices)
        longest = max(
            len(groups[s.group].prefix_ids) + max(len(x) for x in groups[s.group].suffix_ids) for s in slices
        )
        assert batch.num_tokens <= max(budget, longest)
    # The stream holds every prefix once and every suffix once: nothing is padded or recomputed.
    total = sum(build_batch(groups, slices).num_tokens for slices in plans)
    assert total == sum(len(g.prefix_ids) + sum(map(len, g.suffix_ids)) for g in groups)


def test_plan_balances_batches() -> None:
    groups = [PrefixGroup([1] * 10, [[2] * 50 for _ in range(20)])]  # 1010 tokens
    sizes = [build_batch(groups, s).num_tokens for s in plan_batches(groups, 600)]
    assert len(sizes) == 2 and max(sizes) - min(sizes) <= 50


def test_batch_layout() -> None:
    groups = random_groups(random.Random(1), 100, SPEC)
    for budget in (25, 1000):
        for slices in plan_batches(groups, budget):
            batch = build_batch(groups, slices)
            q_start, q_len, k_start, k_len, p_start, p_len = batch.segments.T
            # Segments tile the stream in order, and every token is a query over its own key row.
            assert q_start.tolist() == (np.cumsum(q_len) - q_len).tolist() and q_len.sum() == batch.num_tokens
            assert (k_start == q_start).all() and (k_len == q_len).all()
            assert (batch.segment_last.numpy() == q_start + q_len - 1).all()
            loaded = {g: row for g, row in batch.load}
            prompts = [(s.group, x) for s in slices for x in groups[s.group].suffix_ids[s.start : s.stop]]
            for (group, suffix), seg in zip(prompts, batch.prompt_segments.tolist(), strict=True):
                prefix = groups[group].prefix_ids
                ids = batch.input_ids[q_start[seg] : q_start[seg] + q_len[seg]].tolist()
                assert ids == suffix and p_len[seg] == len(prefix)
                # The prefix a prompt reads is its group's: computed in this stream, or loaded.
                if group in loaded:
                    assert p_start[seg] == loaded[group] >= batch.num_tokens
                elif prefix:
                    rows = slice(p_start[seg], p_start[seg] + p_len[seg])
                    assert batch.input_ids[rows].tolist() == prefix
                    assert batch.positions[rows].tolist() == list(range(len(prefix)))
                positions = batch.positions[q_start[seg] : q_start[seg] + q_len[seg]].tolist()
                assert positions == list(range(len(prefix), len(prefix) + len(suffix)))
            assert batch.kv_len == batch.num_tokens + sum(len(groups[g].prefix_ids) for g in loaded)


def test_plan_rejects_bad_budget() -> None:
    with pytest.raises(ValueError):
        plan_batches([PrefixGroup([], [[1]])], 0)


# -- numerics against Hugging Face ------------------------------------------------------------------


@pytest.mark.parametrize("budget", [8, 30, 100_000])
def test_matches_hf_forward_fp32(qwen3: Any, budget: int) -> None:
    """Small budgets split groups over batches, so prefixes go through the cross-batch KV cache."""
    groups = random_groups(random.Random(2), qwen3.config.vocab_size, SPEC)
    got = PackedForward(qwen3, max_batch_tokens=budget).last_hidden_states(groups)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("budget", [8, 30, 100_000])
def test_batches_laid_out_ahead_run_as_laid_out(
    qwen3: Any, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare() plans and lays out every batch as the call will (empty prefixes, prefixes carried
    between batches); the call then builds none again and gives the very rows of a call without it."""
    groups = random_groups(random.Random(2), qwen3.config.vocab_size, SPEC)
    forward = PackedForward(qwen3, max_batch_tokens=budget)
    expected = forward.last_hidden_states(groups)
    prepared = forward.prepare(groups)
    assert len(prepared.batches) == len(plan_batches(groups, budget))
    built: list[int] = []
    original = packed_forward_module.build_batch

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(packed_forward_module, "build_batch", counting)
    got = forward.last_hidden_states(groups, prepared=prepared)
    assert not built, "a batch laid out ahead was laid out again"
    assert torch.equal(got, expected)
    # Planned with another budget (lowered after running out of memory): laid out again as it runs.
    forward.max_batch_tokens = max(1, budget // 2)
    again = forward.last_hidden_states(groups, prepared=prepared)
    assert len(built) == len(plan_batches(groups, forward.max_batch_tokens))
    torch.testing.assert_close(again, reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_other_architectures(kind: str) -> None:
    model = _small_model(kind)
    assert supports(model), unsupported_reason(model)
    groups = random_groups(random.Random(3), model.config.vocab_size, SPEC)
    got = PackedForward(model, max_batch_tokens=30).last_hidden_states(groups)
    torch.testing.assert_close(got, reference_rows(model, groups), atol=ATOL, rtol=ATOL)


def test_progress_and_empty(qwen3: Any) -> None:
    forward = PackedForward(qwen3, max_batch_tokens=20)
    seen: list[int] = []
    groups = random_groups(random.Random(4), 1000, SPEC)
    forward.last_hidden_states(groups, seen.append)
    assert sum(seen) == sum(len(g.suffix_ids) for g in groups) and len(seen) > 1
    assert forward.last_hidden_states([]).shape == (0, qwen3.config.hidden_size)


def test_prefix_reuse_gives_the_same_scores(tiny_model_dir: Path) -> None:
    """Through the scorer: packed with the shared prefix computed once == padded full prompts."""
    packed = GenerativeScorer(
        str(tiny_model_dir), device="cpu", dtype="float32", forward="packed", max_batch_tokens=300
    )
    padded = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", forward="padded")
    assert isinstance(packed.engine.forward, PackedForward)
    assert isinstance(padded.engine.forward, PaddedForward)
    rng = random.Random(5)
    pairs = [
        (q, " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(n)))
        for q in ("first query", "second, longer query?")
        for n in (1, 4, 20, 60, 130)
    ]
    a, b = packed.score_pairs(pairs), padded.score_pairs(pairs)
    assert max(abs(x - y) for x, y in zip(a, b)) <= ATOL
    request = {
        "query": [11, 12, 13, 14],
        "items": [[15], [16, 17], [18] * 40],
        "label_token_ids": [9693, 2152, 5],
    }
    for softmax in (True, False):
        ra = packed.score({**request, "apply_softmax": softmax})
        rb = padded.score({**request, "apply_softmax": softmax})
        assert [d.score for d in ra.data] == pytest.approx([d.score for d in rb.data], abs=ATOL)


# -- selection and fallback -------------------------------------------------------------------------


def test_unsupported_architecture_falls_back() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    assert not supports(model) and "gpt2" in (unsupported_reason(model) or "")
    with pytest.raises(ValueError):
        PackedForward(model)
    forward = select_forward(model, LocalSettings(forward="packed"), pad_token_id=0)
    assert isinstance(forward, PaddedForward)


def test_selection(qwen3: Any) -> None:
    packed = select_forward(qwen3, LocalSettings(forward="packed"), 0)
    assert isinstance(packed, PackedForward) and packed.max_batch_tokens == DEFAULT_MAX_BATCH_TOKENS
    chosen = select_forward(qwen3, LocalSettings(forward="packed", max_batch_tokens=1000), 0)
    assert isinstance(chosen, PackedForward) and chosen.max_batch_tokens == 1000
    assert isinstance(select_forward(qwen3, LocalSettings(), 0), PackedForward)  # "auto", on the CPU too
    assert isinstance(select_forward(qwen3, LocalSettings(forward="padded"), 0), PaddedForward)


# -- options (passed in, never patched onto the class) ----------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        PackedOptions(),
        PackedOptions.all_kernels("torch"),
        PackedOptions(fused_ops="torch"),
    ],
)
def test_options_keep_the_numbers(qwen3: Any, options: PackedOptions) -> None:
    groups = random_groups(random.Random(6), qwen3.config.vocab_size, SPEC)
    forward = PackedForward(qwen3, max_batch_tokens=30, options=options)
    assert forward.decoder.options is options
    torch.testing.assert_close(
        forward.last_hidden_states(groups), reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL
    )


def test_options_name_only_kernel_implementations() -> None:
    with pytest.raises(ValidationError):
        PackedOptions(attention="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        PackedOptions(trim_last_layer=False)  # type: ignore[call-arg]


def _bf16_copy(model: Any) -> Any:
    return copy.deepcopy(model).to(torch.bfloat16)


def test_a_bf16_model_gives_the_float32_rows_within_bf16_noise(qwen3: Any) -> None:
    """The residual stream stays float32 in a bf16 model: only the products' inputs are rounded."""
    groups = random_groups(random.Random(6), qwen3.config.vocab_size, SPEC)
    reference = reference_rows(qwen3, groups)  # float32 weights and arithmetic
    rows = PackedForward(_bf16_copy(qwen3), max_batch_tokens=30).last_hidden_states(groups)
    assert rows.dtype == torch.float32
    # Final-norm rows are of order one.
    torch.testing.assert_close(rows, reference, atol=0.1, rtol=0.05)


def test_graphs_replay_a_bf16_model_as_the_eager_decoder_runs_it(qwen3: Any) -> None:
    """Rungs of several sizes, prefixes saved and loaded through the shared static buffers (the CPU
    replays on the same buffers; CUDA captures them)."""
    model = _bf16_copy(qwen3)
    decoder = PackedForward(model).decoder
    groups = random_groups(
        random.Random(16), model.config.vocab_size, [(20, [30, 2, 11, 4, 6]), (9, [7, 12, 3])]
    )
    eager = PackedForward(model, max_batch_tokens=40, options=decoder.options).last_hidden_states(groups)
    graphs = DecoderGraphs(decoder, GraphLadder((16, 32, 64), prefix_rows=128))
    graphs.capture_all()
    for _ in range(2):
        rows = _prefix_graph_rows(graphs, groups, 40)
        torch.testing.assert_close(rows, eager, atol=2e-2, rtol=0)  # a bf16 step at most
    assert graphs.captures == 3 and graphs.replays > 0


# -- the ladder of CUDA graphs: rungs, padding, static buffers (CPU: replayed eagerly) -------------


def _one_batch(groups: list[PrefixGroup]) -> Any:
    [slices] = plan_batches(groups, 10_000)
    return build_batch(groups, slices)


def test_the_default_ladder_holds_the_streamed_targets_in_fine_steps() -> None:
    ladder = GraphLadder.up_to(DEFAULT_MAX_BATCH_TOKENS)
    tokens = list(ladder.tokens)
    assert tokens == sorted(set(tokens)) and tokens[0] == 512 and tokens[-1] == DEFAULT_MAX_BATCH_TOKENS
    assert {4096, 8192, 16384, 32768, 65536} <= set(tokens), "the streamed planner's targets are rungs"
    for low, high in itertools.pairwise(tokens):
        assert high - low <= max(512, low // 4), f"a batch just over {low} tokens pads to {high}"
    assert GraphLadder.up_to(50_000).tokens[-1] == 50_000, "the forward's budget is the top rung"
    assert GraphLadder.up_to(300).tokens == (300,)
    for shape in ladder.shapes():
        assert shape.segments >= shape.tokens // 32 and shape.segments % 16 == 0
        assert shape.load == shape.save == ladder.prefix_rows
    with pytest.raises(ValueError):
        GraphLadder.up_to(0)


def test_a_batch_runs_on_the_smallest_rung_it_fits() -> None:
    groups = random_groups(random.Random(14), 100, [(20, [30, 2, 11, 4, 6])])
    first, second = [build_batch(groups, s) for s in plan_batches(groups, 40)]
    assert first.save and second.load
    ladder = GraphLadder((16, 64, 128), prefix_rows=32)
    whole = _one_batch(groups)  # 73 tokens
    assert ladder.rung_for(whole) == ladder.shape(128)
    assert ladder.rung_for(first) == StaticShape(tokens=64, segments=64, load=32, save=32)
    assert ladder.rung_for(second) is not None and ladder.rung_for(second).tokens == 64
    many = [PrefixGroup([], [[1]] * 63)]  # 63 tokens, but 63 segments + 2 spare: over 64...
    assert GraphLadder((64, 4096)).rung_for(_one_batch(many)) == GraphLadder((64, 4096)).shape(4096), (
        "...so it goes a rung up"
    )
    too_long = random_groups(random.Random(1), 100, [(0, [200])])
    assert ladder.rung_for(_one_batch(too_long)) is None, "over the top rung: eager"
    long_prefix = random_groups(random.Random(2), 100, [(40, [5, 5])])
    first_of_two = build_batch(long_prefix, plan_batches(long_prefix, 46)[0])
    assert save_rows(first_of_two) == 40 and ladder.rung_for(first_of_two) is None, "40 prefix rows > 32"
    assert ladder.batch_tokens(17) == 64 and ladder.batch_tokens(129) == 129


@pytest.mark.parametrize("seed", range(4))
def test_the_planner_fills_batches_up_to_rungs(seed: int) -> None:
    rng = random.Random(seed)
    groups = random_groups(
        rng, 100, [(rng.randrange(30), [rng.randrange(1, 60) for _ in range(40)]) for _ in range(5)]
    )
    ladder = GraphLadder((64, 128, 192, 256, 384, 512))
    plans = plan_batches(groups, 512, rungs=ladder.tokens)
    order = [(s.group, i) for slices in plans for s in slices for i in range(s.start, s.stop)]
    assert order == [(g, i) for g, group in enumerate(groups) for i in range(len(group.suffix_ids))]
    batches = [build_batch(groups, slices) for slices in plans]
    rung = ladder.batch_tokens(max(b.num_tokens for b in batches))
    longest = max(len(s) + len(g.prefix_ids) for g in groups for s in g.suffix_ids)
    for batch in batches[:-1]:
        assert rung - longest < batch.num_tokens <= rung, "filled to the rung within one prompt"
    assert batches[-1].num_tokens <= rung
    assert len(plans) == len(plan_batches(groups, 512)), "as many batches as without rungs"


def test_the_planner_closes_a_batch_when_its_segments_fill_the_rung() -> None:
    """200 prompts of 3 tokens fit 600 tokens but not a rung's segments: batches close at them, so
    every batch still lands on a rung (and replays its graph)."""
    groups = [PrefixGroup([7, 8, 9], [[i, i + 1, i + 2] for i in range(200)])]
    ladder = GraphLadder((512, 1024))
    plans = plan_batches(groups, 1024, rungs=ladder.tokens)
    batches = [build_batch(groups, slices) for slices in plans]
    assert sum(b.num_prompts for b in batches) == 200 and len(batches) == 4
    assert all(ladder.rung_for(b) is not None for b in batches)
    assert all(len(b.segments) <= ladder.shape(b.num_tokens).segments - 2 for b in batches)


@pytest.mark.parametrize("step", [1, 16, 128, 1000])
def test_a_padded_batch_gives_the_rows_of_the_hf_forward(qwen3: Any, step: int) -> None:
    groups = random_groups(random.Random(8), qwen3.config.vocab_size, SPEC)
    batch = _one_batch(groups)
    decoder = PackedForward(qwen3).decoder
    shape = padded_shape(batch, step)
    dev = DeviceBatch.static(shape, torch.device("cpu"), batch)
    assert dev.input_ids.numel() == shape.tokens and dev.segments.num_blocks == shape.blocks
    with torch.inference_mode():
        rows, saved = decoder.run(dev)
    assert saved is None and rows.shape[0] == shape.segments
    torch.testing.assert_close(rows[: batch.num_prompts], reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("step", [1, 16, 128, 1000])
def test_every_row_of_a_padded_batch_is_a_query_of_one_segment(step: int) -> None:
    """The attention writes every row of its output: spare tokens attend among themselves (an
    unwritten row can hold NaN on the GPU, which the next layer would carry into real rows' key
    tiles), and every spare attention block points at an empty segment."""
    groups = random_groups(random.Random(8), 100, SPEC)
    batch = _one_batch(groups)
    shape = padded_shape(batch, step)
    parts, table, _ = host_layout(batch, shape)
    covered = np.zeros(shape.tokens, dtype=np.int64)
    for q_start, q_len, k_start, k_len, _, _ in table:
        covered[q_start : q_start + q_len] += 1
        assert k_start + k_len <= shape.tokens
    assert (covered == 1).all()
    real = len(batch.segments)
    torch.testing.assert_close(torch.from_numpy(table[:real]), torch.from_numpy(batch.segments))
    spare_tokens = shape.tokens - batch.num_tokens
    if spare_tokens:
        assert tuple(table[real]) == (batch.num_tokens, spare_tokens, batch.num_tokens, spare_tokens, 0, 0)
    assert not table[real + 1 :].any(), "the other spare segments are empty"
    blocks = parts[5].reshape(-1, 2)
    assert len(blocks) == shape.blocks
    # Each query row is in exactly one block; blocks past the planned ones point at the empty last row.
    rows = np.zeros(shape.tokens, dtype=np.int64)
    for segment, first in blocks:
        q_start, q_len = table[segment, 0], table[segment, 1]
        stop = min(first + DEFAULT_TILING.block_m, q_len)
        rows[q_start + first : q_start + stop] += 1
        if q_len == 0:
            assert segment == shape.segments - 1
    assert (rows == 1).all()


def test_a_batch_that_does_not_fit_its_shape_is_refused() -> None:
    groups = random_groups(random.Random(7), 100, SPEC)
    batch = _one_batch(groups)
    with pytest.raises(ValueError, match="does not fit"):
        DeviceBatch.static(StaticShape(tokens=100, segments=16), torch.device("cpu"), batch)
    with pytest.raises(ValueError, match="does not fit"):
        DeviceBatch.static(StaticShape(tokens=256, segments=16), torch.device("cpu"), batch)


def test_graphs_are_captured_up_front_and_never_inside_a_call(qwen3: Any) -> None:
    """Every rung is captured by capture_all; batches then replay, a shorter one in the buffers of a
    longer one without stale rows, and a batch over the top rung runs eagerly, capturing nothing."""
    vocab = qwen3.config.vocab_size
    long = random_groups(random.Random(9), vocab, [(12, [30, 20, 25]), (5, [9, 9])])
    short = random_groups(random.Random(10), vocab, [(3, [4, 2])])
    other = random_groups(random.Random(11), vocab, [(20, [100, 90, 80])])
    graphs = DecoderGraphs(PackedForward(qwen3).decoder, GraphLadder((64, 128), prefix_rows=128))
    assert graphs.decode(_one_batch(long)) is None, "not captured yet: eager"
    graphs.capture_all()
    assert graphs.captures == 2 and set(graphs.graphs) == set(graphs.ladder.shapes())
    with torch.inference_mode():
        first = graphs.decode(_one_batch(long))
        second = graphs.decode(_one_batch(short))
        assert graphs.decode(_one_batch(other)) is None, "384 tokens: over the top rung"
    assert graphs.captures == 2 and graphs.replays == 2
    assert first is not None and second is not None and first[1] is None
    torch.testing.assert_close(first[0], reference_rows(qwen3, long), atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(second[0], reference_rows(qwen3, short), atol=ATOL, rtol=ATOL)
    assert second[0].shape[0] == 2, "only the batch's own prompts come back"


def _prefix_graph_rows(graphs: DecoderGraphs, groups: list[PrefixGroup], budget: int) -> torch.Tensor:
    """Every batch of ``groups`` (split at ``budget``, so prefixes are saved and loaded) through
    ``graphs``, carrying the saved prefix keys/values as the packed forward does."""
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    rows = []
    with torch.inference_mode():
        for slices in plan_batches(groups, budget):
            batch = build_batch(groups, slices)
            loaded = None
            if batch.load:
                keys = [cache[g] for g, _ in batch.load]
                loaded = (torch.cat([k for k, _ in keys], dim=1), torch.cat([v for _, v in keys], dim=1))
            done = graphs.decode(batch, loaded)
            assert done is not None
            hidden, saved = done
            assert (saved is None) == (not batch.save)
            offset = 0
            for g, save in batch.save:
                assert saved is not None
                cache[g] = (
                    saved[0][:, offset : offset + save.numel()],
                    saved[1][:, offset : offset + save.numel()],
                )
                offset += save.numel()
            rows.append(hidden)
    return torch.cat(rows)


def test_graphs_of_batches_that_carry_prefixes_give_the_hf_rows(qwen3: Any) -> None:
    """Saving and loading prefixes through the shared static buffers: padding moves the loaded rows,
    spare save rows are cut off, and a second group set of the same shapes gets its own rows (no
    stale keys)."""
    vocab = qwen3.config.vocab_size
    graphs = DecoderGraphs(PackedForward(qwen3).decoder, GraphLadder((32, 64), prefix_rows=128))
    graphs.capture_all()
    for seed in (16, 17):
        groups = random_groups(random.Random(seed), vocab, [(20, [30, 2, 11, 4, 6]), (9, [7, 12, 3])])
        batches = [build_batch(groups, s) for s in plan_batches(groups, 40)]
        assert any(b.save for b in batches) and any(b.load for b in batches)
        shapes = [graphs.ladder.rung_for(b) for b in batches]
        assert all(shape is not None and shape.fits(b) for shape, b in zip(shapes, batches))
        # A padded batch that loads: its loaded rows sit below the padding, not where the batch put them.
        assert any(
            shape is not None and b.load and shape.tokens > b.num_tokens for shape, b in zip(shapes, batches)
        )
        rows = _prefix_graph_rows(graphs, groups, 40)
        torch.testing.assert_close(rows, reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)
    assert graphs.captures == 2 and graphs.replays > graphs.captures
    with pytest.raises(ValueError, match="loaded"):
        graphs.decode(batches[-1] if batches[-1].load else next(b for b in batches if b.load), None)


def test_a_failed_capture_switches_graphs_off(
    qwen3: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA graph capture of a decoder on the CPU fails: eager from then on, said once."""
    groups = random_groups(random.Random(15), qwen3.config.vocab_size, SPEC)
    graphs = DecoderGraphs(PackedForward(qwen3).decoder, GraphLadder((128, 256)))
    monkeypatch.setattr(graphs, "cuda_graphs", True)  # as on CUDA, where a capture may fail
    with caplog.at_level("WARNING", logger="genscore_core.packed.graphs"):
        graphs.capture_all()
        assert graphs.decode(_one_batch(groups)) is None
    assert graphs.disabled is not None and not graphs.graphs and graphs.captures == 0
    assert sum("switched off" in r.message for r in caplog.records) == 1


def test_the_packed_forward_graphs_only_cuda_with_device_side_attention(qwen3: Any) -> None:
    assert PackedForward(qwen3).graphs is None, "CPU: no graphs"
    assert PackedForward(qwen3, options=PackedOptions(attention="torch")).graphs is None


# -- fused projections: one q/k/v and one gate/up weight per layer, the model's modules re-pointed ----


def _linears(model: Any) -> list[Any]:
    return [
        m
        for layer in model.model.layers
        for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj,
        )
    ]  # fmt: skip


def test_fused_projections_hold_the_weights_once_and_keep_the_model(tmp_path: Path) -> None:
    """The modules' weights and biases become views of each layer's fused tensors: same parameter
    objects, same values and state_dict (a save and reload gives them back), same HF forward, no
    second copy; a second decoder over the same model finds them fused and copies nothing."""
    model = _small_model("llama")  # q/k/v and MLP biases
    groups = random_groups(random.Random(9), model.config.vocab_size, SPEC)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    params = [(m.weight, m.bias) for m in _linears(model)]
    reference = reference_rows(model, groups)

    forward = PackedForward(model, max_batch_tokens=30)
    assert [(m.weight, m.bias) for m in _linears(model)] == params  # the same parameter objects
    for name, t in model.state_dict().items():
        torch.testing.assert_close(t, before[name], rtol=0, atol=0, msg=name)
    for layer, fused in zip(model.model.layers, forward.decoder.layers, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        assert fused.qkv is not None and fused.gate_up is not None and fused.qkv[1] is not None
        weight, bias = fused.qkv
        rows = 0
        for module in (attn.q_proj, attn.k_proj, attn.v_proj):
            n = module.weight.shape[0]
            assert module.weight.data_ptr() == weight[rows].data_ptr()  # a view, not a copy
            assert module.bias.data_ptr() == bias[rows].data_ptr()  # type: ignore[index]
            rows += n
        assert rows == weight.shape[0]
        assert mlp.up_proj.weight.data_ptr() == fused.gate_up[0][mlp.gate_proj.weight.shape[0]].data_ptr()
    torch.testing.assert_close(reference_rows(model, groups), reference, rtol=0, atol=0)
    torch.testing.assert_close(forward.last_hidden_states(groups), reference, atol=ATOL, rtol=ATOL)

    again = PackedForward(model)
    for a, b in zip(forward.decoder.layers, again.decoder.layers, strict=True):
        assert a.qkv is not None and b.qkv is not None and a.gate_up is not None and b.gate_up is not None
        assert (
            a.qkv[0].data_ptr() == b.qkv[0].data_ptr() and a.gate_up[0].data_ptr() == b.gate_up[0].data_ptr()
        )

    model.save_pretrained(str(tmp_path))
    reloaded = type(model).from_pretrained(str(tmp_path), dtype=torch.float32)
    for name, t in reloaded.state_dict().items():
        torch.testing.assert_close(t, before[name], rtol=0, atol=0, msg=name)


def test_fuse_linears_fills_missing_biases_and_refuses_mixed_dtypes() -> None:
    from genscore_core.packed.decoder import fuse_linears

    a, b, c = torch.nn.Linear(8, 4), torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(8, 2)
    x = torch.randn(5, 8)
    want = torch.cat([a(x), b(x), c(x)], dim=1)
    fused = fuse_linears([a, b, c])
    assert fused is not None and b.bias is None
    weight, bias = fused
    assert bias is not None and bias[4:10].abs().max() == 0
    torch.testing.assert_close(torch.nn.functional.linear(x, weight, bias), want)
    assert a.weight.data_ptr() == weight.data_ptr()  # weights moved, the mixed biases copied
    d = torch.nn.Linear(8, 3).double()
    pointer = d.weight.data_ptr()
    assert fuse_linears([a, d]) is None and d.weight.data_ptr() == pointer


def test_projections_in_another_dtype_than_the_embeddings_are_refused() -> None:
    """The products' inputs are in the embeddings' dtype: a weight in another one is refused when the
    model is checked (layer 0: the engine then takes the padded forward) or, later, when it is fused."""
    model = _small_model("qwen2")
    model.model.layers[0].self_attn.k_proj.double()
    assert "k_proj is torch.float64" in (unsupported_reason(model) or "")
    model = _small_model("qwen2")
    model.model.layers[1].mlp.up_proj.double()
    with pytest.raises(ValueError, match="layer 1"):
        PackedForward(model)


def test_fused_weights_built_under_inference_mode_keep_the_model_trainable() -> None:
    """A scorer built inside ``torch.inference_mode`` must not turn the model's parameters into
    inference tensors (autograd refuses to save those for backward)."""
    model = _small_model("qwen2")
    with torch.inference_mode():
        forward = PackedForward(model)
    assert forward.decoder.layers[0].qkv is not None
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert not weight.is_inference() and weight.data_ptr() == forward.decoder.layers[0].qkv[0].data_ptr()
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert weight.grad is not None


def test_launch_costs_run_a_batch_eagerly_only_where_its_padding_costs_more_than_launches() -> None:
    costs = LaunchCosts(per_token=1e-5, launch=1e-3)  # 200 tokens saved pay for twice the launches
    assert costs.eager_pays(8192, 7680) and not costs.eager_pays(8192, 8000)
    assert not LaunchCosts(per_token=0.0, launch=0.0).eager_pays(8192, 512), "nothing saved: replay"


def test_batches_run_eagerly_off_their_rung_give_the_hf_rows(qwen3: Any) -> None:
    """Where padding costs more than launches, a batch runs eagerly, padded to the ladder's eager
    step (not its rung), through the same buffers of loaded prefixes; its rows and saved prefixes are
    those of the unpadded model."""
    vocab = qwen3.config.vocab_size
    ladder = GraphLadder((16, 64), prefix_rows=128, eager_step=16)
    graphs = DecoderGraphs(PackedForward(qwen3).decoder, ladder)
    graphs.capture_all()
    graphs.costs = LaunchCosts(per_token=1.0, launch=0.0)  # as measured on a compute-bound model
    groups = random_groups(random.Random(18), vocab, [(12, [9, 2, 11, 4, 6]), (5, [7, 12, 3])])
    batches = [build_batch(groups, s) for s in plan_batches(groups, 40)]
    assert any(b.load for b in batches) and any(16 < b.num_tokens <= 48 for b in batches)
    rows = _prefix_graph_rows(graphs, groups, 40)
    torch.testing.assert_close(rows, reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)
    assert graphs.eager_runs > 0, "batches of 17-48 tokens run eagerly, not on the 64-token rung"
    assert graphs.eager_runs + graphs.replays == len(batches)
