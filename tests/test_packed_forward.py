"""The packed forward (no padding, shared prefix computed once) against a plain per-prompt HF forward.

Everything runs on the CPU in float32: the same packing, prefix-reuse and layer code as on CUDA, with
the torch versions of the fused operations and blocked SDPA instead of the Triton kernels. The
kernels are checked against those torch versions through Triton's interpreter, one by one in
tests/kernels/ (test_fused_ops.py, test_segment_attention.py) and all together in
tests/kernels/test_packed_decoder_triton.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer
from genscore_core.config import ScorerConfig
from genscore_core.engine import select_forward
from genscore_core.forward import PaddedForward, PrefixGroup
from genscore_core.packed import (
    DEFAULT_MAX_BATCH_TOKENS,
    PackedForward,
    PackedOptions,
    build_batch,
    plan_batches,
    supports,
    unsupported_reason,
)

ATOL = 1e-5


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


def _random_groups(rng: random.Random, vocab: int, spec: list[tuple[int, list[int]]]) -> list[PrefixGroup]:
    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    return [PrefixGroup(ids(p), [ids(n) for n in suffixes]) for p, suffixes in spec]


SPEC = [(12, [5, 1, 17, 9]), (0, [3, 8]), (7, [1]), (20, [30, 2, 11, 4, 6])]


def _reference(model: Any, groups: list[PrefixGroup]) -> torch.Tensor:
    """Each prompt alone through the model's own forward: the final-norm hidden state at its last token."""
    rows = []
    with torch.inference_mode():
        for group in groups:
            for prompt in group.prompts():
                output = model.model(input_ids=torch.tensor([prompt]))
                rows.append(output.last_hidden_state[0, -1])
    return torch.stack(rows)


# -- packing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 10, 25, 40, 1000])
def test_plan_covers_every_prompt_once_in_order(budget: int) -> None:
    groups = _random_groups(random.Random(0), 100, SPEC)
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
    groups = _random_groups(random.Random(1), 100, SPEC)
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
    groups = _random_groups(random.Random(2), qwen3.config.vocab_size, SPEC)
    got = PackedForward(qwen3, max_batch_tokens=budget).last_hidden_states(groups)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _reference(qwen3, groups), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_other_architectures(kind: str) -> None:
    model = _small_model(kind)
    assert supports(model), unsupported_reason(model)
    groups = _random_groups(random.Random(3), model.config.vocab_size, SPEC)
    got = PackedForward(model, max_batch_tokens=30).last_hidden_states(groups)
    torch.testing.assert_close(got, _reference(model, groups), atol=ATOL, rtol=ATOL)


def test_progress_and_empty(qwen3: Any) -> None:
    forward = PackedForward(qwen3, max_batch_tokens=20)
    seen: list[int] = []
    groups = _random_groups(random.Random(4), 1000, SPEC)
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
    forward = select_forward(model, ScorerConfig(forward="packed"), pad_token_id=0)
    assert isinstance(forward, PaddedForward)


def test_selection(qwen3: Any) -> None:
    packed = select_forward(qwen3, ScorerConfig(forward="packed"), 0)
    assert isinstance(packed, PackedForward) and packed.max_batch_tokens == DEFAULT_MAX_BATCH_TOKENS
    chosen = select_forward(qwen3, ScorerConfig(forward="packed", max_batch_tokens=1000), 0)
    assert isinstance(chosen, PackedForward) and chosen.max_batch_tokens == 1000
    assert isinstance(select_forward(qwen3, ScorerConfig(), 0), PackedForward)  # "auto", on the CPU too
    assert isinstance(select_forward(qwen3, ScorerConfig(forward="padded"), 0), PaddedForward)


# -- options (passed in, never patched onto the class) ----------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        PackedOptions(trim_last_layer=False),
        PackedOptions.all_kernels("torch"),
        PackedOptions(fused_ops="torch"),
    ],
)
def test_options_keep_the_numbers(qwen3: Any, options: PackedOptions) -> None:
    groups = _random_groups(random.Random(6), qwen3.config.vocab_size, SPEC)
    forward = PackedForward(qwen3, max_batch_tokens=30, options=options)
    assert forward.decoder.options is options
    torch.testing.assert_close(
        forward.last_hidden_states(groups), _reference(qwen3, groups), atol=ATOL, rtol=ATOL
    )


def test_a_bf16_residual_stream_is_an_option_of_one_forward(qwen3: Any) -> None:
    groups = _random_groups(random.Random(6), qwen3.config.vocab_size, SPEC)
    reference = _reference(qwen3, groups)
    rounded = PackedForward(qwen3, options=PackedOptions(residual_dtype="bfloat16")).last_hidden_states(
        groups
    )
    default = PackedForward(qwen3).last_hidden_states(groups)
    # Only the forward built with it rounds its residual; another one built after it does not.
    assert (rounded - reference).abs().max() > 1e-4
    torch.testing.assert_close(rounded, reference, atol=0.05, rtol=0.05)
    torch.testing.assert_close(default, reference, atol=ATOL, rtol=ATOL)
    with pytest.raises(ValidationError):
        PackedOptions(residual_dtype="float16")  # type: ignore[arg-type]
