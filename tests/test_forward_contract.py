"""The forward contract (genscore_core.forward.ForwardStrategy), one test per point over both forwards.

Both forwards come from ``select_forward``, the engine's one place that picks them. Out-of-memory errors
are injected where a real one is raised, at the call that runs a batch through the model (the padded
forward's decoder, the packed forward's ``PackedDecoder.run``): a batch of more token positions than a
limit raises ``torch.OutOfMemoryError`` with CUDA's message, a smaller one runs for real.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from genscore_core.config import LocalSettings
from genscore_core.engine import select_forward
from genscore_core.forward import ForwardStrategy, PaddedForward, PrefixGroup
from genscore_core.packed import PackedForward
from tests.helpers.packed_reference import ATOL, SPEC, random_groups, reference_rows

KINDS = ["padded", "packed"]


@pytest.fixture(scope="module")
def qwen3(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def _forward(model: Any, kind: str, budget: int) -> ForwardStrategy[Any, Any]:
    forward = select_forward(model, LocalSettings(forward=kind, max_batch_tokens=budget), pad_token_id=0)
    assert type(forward) is {"padded": PaddedForward, "packed": PackedForward}[kind]
    return forward


@dataclass
class Recorder:
    """What reached the model: (token positions, prompts, ran) per attempted batch."""

    limit: int | None = None
    error: Callable[[], BaseException] = lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    calls: list[tuple[int, int, bool]] = field(default_factory=list)

    def check(self, tokens: int, prompts: int) -> None:
        assert torch.is_inference_mode_enabled(), "the forward runs in inference mode"
        failed = self.limit is not None and tokens > self.limit
        self.calls.append((tokens, prompts, not failed))
        if failed:
            raise self.error()

    @property
    def failures(self) -> int:
        return sum(not ran for _, _, ran in self.calls)


def _record(forward: ForwardStrategy[Any, Any], recorder: Recorder) -> None:
    """Route every batch of ``forward`` through ``recorder`` on its way to the model."""
    if isinstance(forward, PaddedForward):
        decoder = forward.decoder

        def padded(**inputs: Any) -> Any:
            recorder.check(inputs["input_ids"].numel(), inputs["input_ids"].shape[0])
            return decoder(**inputs)

        forward.decoder = padded
    else:
        assert isinstance(forward, PackedForward)
        run = forward.decoder.run

        def packed(dev: Any, loaded: Any = None) -> Any:
            recorder.check(dev.num_tokens, dev.num_prompts)
            return run(dev, loaded)

        forward.decoder.run = packed  # type: ignore[method-assign]


def _groups(vocab: int, seed: int = 2) -> list[PrefixGroup]:
    return random_groups(random.Random(seed), vocab, SPEC)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_final_hidden_states_out(
    tiny_model_dir: Path, qwen3: Any, kind: str, dtype: torch.dtype
) -> None:
    """float32 out whatever the model's dtype; at float32, the per-prompt HF forward at 1e-5."""
    model = (
        qwen3
        if dtype == torch.float32
        else AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=dtype)
    )
    groups = _groups(model.config.vocab_size)
    got = _forward(model, kind, 100).last_hidden_states(groups)
    assert got.dtype == torch.float32 and got.shape == (
        sum(len(g.suffix_ids) for g in groups),
        model.config.hidden_size,
    )
    reference = reference_rows(qwen3, groups)  # float32 weights, float32 arithmetic
    if dtype == torch.float32:
        torch.testing.assert_close(got, reference, atol=ATOL, rtol=ATOL)
    else:  # bf16 weights and matmuls: close to float32, and not rounded to bf16 at the end
        torch.testing.assert_close(got, reference, atol=0.1, rtol=0.05)
        assert not torch.equal(got, got.bfloat16().float())


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_memory_splits_only_the_failing_batch(qwen3: Any, kind: str) -> None:
    groups = _groups(qwen3.config.vocab_size)
    prompts = sum(len(g.suffix_ids) for g in groups)
    expected = _forward(qwen3, kind, 10_000).last_hidden_states(groups)

    forward = _forward(qwen3, kind, 10_000)
    recorder = Recorder(limit=60)
    _record(forward, recorder)
    progress: list[int] = []
    got = forward.last_hidden_states(groups, progress.append)

    torch.testing.assert_close(got, expected, atol=ATOL, rtol=ATOL)
    assert recorder.failures > 0
    ran = [(tokens, n) for tokens, n, ok in recorder.calls if ok]
    # Every prompt ran exactly once after its batch succeeded, and was reported exactly once.
    assert sum(n for _, n in ran) == prompts == sum(progress)
    assert len(progress) == len(ran)
    assert all(tokens <= 60 for tokens, _ in ran)
    # The budget is lowered for what comes next, in this call and later ones.
    assert forward.max_batch_tokens < 10_000
    failures = recorder.failures
    again = forward.last_hidden_states(groups)
    torch.testing.assert_close(again, expected, atol=ATOL, rtol=ATOL)
    assert recorder.failures - failures < failures


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_memory_on_a_single_prompt_is_raised(qwen3: Any, kind: str) -> None:
    forward = _forward(qwen3, kind, 10_000)
    recorder = Recorder(limit=5)
    _record(forward, recorder)
    progress: list[int] = []
    with pytest.raises(torch.OutOfMemoryError):
        forward.last_hidden_states([PrefixGroup([1, 2, 3], [[4, 5, 6, 7], [8, 9, 10]])], progress.append)
    assert progress == [] and recorder.calls[-1][1] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_other_errors_are_not_retried(qwen3: Any, kind: str) -> None:
    forward = _forward(qwen3, kind, 10_000)
    recorder = Recorder(limit=0, error=lambda: RuntimeError("shape mismatch"))
    _record(forward, recorder)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        forward.last_hidden_states(_groups(qwen3.config.vocab_size))
    assert len(recorder.calls) == 1 and forward.max_batch_tokens == 10_000


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [40, 120])
def test_the_budget_bounds_positions_run_per_batch(qwen3: Any, kind: str, budget: int) -> None:
    """``max_batch_tokens`` bounds the token positions a batch runs (padding included, a shared prefix
    once); only a batch of one prompt may exceed it."""
    groups = _groups(qwen3.config.vocab_size)
    forward = _forward(qwen3, kind, budget)
    recorder = Recorder()
    _record(forward, recorder)
    got = forward.last_hidden_states(groups)
    torch.testing.assert_close(got, reference_rows(qwen3, groups), atol=ATOL, rtol=ATOL)
    assert len(recorder.calls) > 1
    assert all(tokens <= budget or n == 1 for tokens, n, _ in recorder.calls)
    positions = sum(tokens for tokens, _, _ in recorder.calls)
    computed = sum(len(g.prefix_ids) + sum(map(len, g.suffix_ids)) for g in groups)
    if kind == "packed":  # each prefix once, nothing padded
        assert positions == computed
    else:  # every prompt whole, padded to its batch's longest
        assert positions >= sum(len(p) for g in groups for p in g.prompts()) > computed


@pytest.mark.parametrize("kind", KINDS)
def test_empty_call(qwen3: Any, kind: str) -> None:
    out = _forward(qwen3, kind, 100).last_hidden_states([])
    assert out.shape == (0, qwen3.config.hidden_size) and out.dtype == torch.float32


def test_a_decoder_without_a_final_norm_module_is_cast() -> None:
    """GPT-2 names its final norm ``ln_f``: its own output at the last position, as float32."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    model = model.to(torch.bfloat16).eval()
    forward = select_forward(model, LocalSettings(forward="auto"), pad_token_id=0)
    assert isinstance(forward, PaddedForward) and forward.final_norm is None
    groups = [PrefixGroup([1, 2, 3], [[4, 5], [6]])]
    got = forward.last_hidden_states(groups)
    with torch.inference_mode():
        want = torch.stack(
            [model.transformer(torch.tensor([p])).last_hidden_state[0, -1] for p in groups[0].prompts()]
        )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.float(), atol=1e-2, rtol=1e-2)
