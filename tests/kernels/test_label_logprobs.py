"""Label log-probability kernel and reference against an independent float64 computation.

The Triton kernels run on CPU tensors through the interpreter (conftest.py sets TRITON_INTERPRET=1),
so shapes are small; benchmarks/bench_kernels.py compares kernel and reference at Qwen3 sizes on a
GPU.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from genscore_core.kernels.label_logprobs import LabelLogprobs, label_logprobs, label_logprobs_reference

# The package re-exports the function under the module's name, so fetch the module itself.
lp_module = importlib.import_module("genscore_core.kernels.label_logprobs")
triton = pytest.importorskip("triton")
from genscore_core.kernels import label_logprobs_triton as lpt  # noqa: E402

# Both paths accumulate in fp32 from the same (already rounded) inputs as the float64 reference, so
# low-precision dtypes differ only by the accumulation order; logits are O(10).
TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    torch.float16: {"atol": 5e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 5e-4, "rtol": 1e-4},
}


def make_inputs(
    batch: int,
    hidden: int,
    vocab: int,
    n_labels: int,
    dtype: torch.dtype,
    *,
    with_bias: bool = False,
    ragged: bool = False,
) -> dict[str, Any]:
    h = torch.randn(batch, hidden).to(dtype)
    w = (torch.randn(vocab, hidden) * 3 / hidden**0.5).to(dtype)
    ids = torch.randint(0, vocab, (batch, n_labels))
    mask = None
    if ragged:
        # Row r keeps its first 1..K labels; padding holds ids no row of W has.
        lengths = torch.randint(1, n_labels + 1, (batch,))
        mask = torch.arange(n_labels)[None, :] < lengths[:, None]
        ids = ids.masked_fill(~mask, -1)
        ids[:, -1] = torch.where(mask[:, -1], ids[:, -1], vocab)
    bias = torch.randn(vocab).to(dtype) if with_bias else None
    return {"hidden": h, "weight": w, "label_ids": ids, "label_mask": mask, "bias": bias}


def float64_expected(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> LabelLogprobs:
    """Full logits in float64, log_softmax, gather: the obvious way, independent of both paths."""
    logits = hidden.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    logp = logits.log_softmax(-1)
    mask = label_mask if label_mask is not None else torch.ones_like(label_ids, dtype=torch.bool)
    picked = logp.gather(-1, label_ids.masked_fill(~mask, 0)).masked_fill(~mask, float("-inf"))
    return LabelLogprobs(picked, logits.logsumexp(-1))


def poisoned(batch: int, n_labels: int) -> LabelLogprobs:
    return LabelLogprobs(torch.full((batch, n_labels), float("nan")), torch.full((batch,), float("nan")))


def assert_matches(actual: LabelLogprobs, expected: LabelLogprobs, dtype: torch.dtype) -> None:
    assert actual.logprobs.dtype == torch.float32 and actual.log_normalizer.dtype == torch.float32
    assert not actual.logprobs.isnan().any(), f"unwritten/NaN logprobs at {actual.logprobs.isnan().nonzero()}"
    assert not actual.log_normalizer.isnan().any(), "unwritten/NaN log_normalizer"
    # assert_close reports the mismatched count, the largest error and its index; -inf == -inf.
    torch.testing.assert_close(actual.log_normalizer.double(), expected.log_normalizer, **TOLERANCES[dtype])
    torch.testing.assert_close(actual.logprobs.double(), expected.logprobs, **TOLERANCES[dtype])


def _random_cases(n: int, seed: int = 1234) -> list[tuple[int, int, int, int, torch.dtype, bool, bool]]:
    rng = random.Random(seed)
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    return [
        (
            rng.randint(1, 40),
            rng.randint(32, 96),
            rng.randint(100, 3000),
            rng.randint(1, 9),
            dtypes[i % 3],
            rng.random() < 0.5,
            rng.random() < 0.5,
        )
        for i in range(n)
    ]


CASES = [
    # (B, H, V, K, dtype, bias, ragged)
    (1, 32, 257, 1, torch.float32, False, False),  # B = 1, K = 1, V prime (not a multiple of any tile)
    (3, 48, 1000, 2, torch.bfloat16, True, True),
    (16, 64, 2049, 5, torch.float16, False, True),
    (17, 96, 3001, 9, torch.bfloat16, True, True),
    (40, 80, 1531, 4, torch.float32, True, True),
    (5, 40, 999, 128, torch.bfloat16, False, True),  # K = 128, labels in two BLOCK_K chunks
    *_random_cases(4),
]


@pytest.mark.parametrize(("batch", "hidden", "vocab", "n_labels", "dtype", "with_bias", "ragged"), CASES)
def test_kernel_matches_float64(
    batch: int, hidden: int, vocab: int, n_labels: int, dtype: torch.dtype, with_bias: bool, ragged: bool
) -> None:
    inputs = make_inputs(batch, hidden, vocab, n_labels, dtype, with_bias=with_bias, ragged=ragged)
    out = lpt.label_logprobs_triton(**inputs, out=poisoned(batch, n_labels))
    assert_matches(out, float64_expected(**inputs), dtype)


@pytest.mark.parametrize(
    "config",
    [
        # 3 row blocks, H loop with a remainder (80 = 32 + 32 + 16), 3 tiles per split so the last
        # split runs past the vocabulary, single-stage pipeline.
        lpt.LabelLogprobsTiling(16, 32, 32, num_warps=4, num_stages=1, tiles_per_split=3, swap_ab=True),
        lpt.LabelLogprobsTiling(16, 32, 32, num_warps=4, num_stages=1, tiles_per_split=3, swap_ab=False),
        lpt.LabelLogprobsTiling(32, 64, 64, num_warps=4, num_stages=2, tiles_per_split=1, swap_ab=True),
        lpt.LabelLogprobsTiling(32, 64, 64, num_warps=4, num_stages=2, tiles_per_split=1, swap_ab=False),
    ],
    ids=["swap-3rowblocks-3tiles", "noswap-3rowblocks-3tiles", "swap-2rowblocks", "noswap-2rowblocks"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_tilings(config: lpt.LabelLogprobsTiling, dtype: torch.dtype) -> None:
    inputs = make_inputs(37, 80, 1000, 3, dtype, with_bias=True, ragged=True)
    out = lpt.label_logprobs_triton(**inputs, out=poisoned(37, 3), config=config)
    assert_matches(out, float64_expected(**inputs), dtype)


def test_default_configs_cover_large_batches() -> None:
    # The large-B config (128-row blocks, h @ W^T orientation) on a tiny problem: two row blocks,
    # the second almost all padding.
    inputs = make_inputs(130, 32, 300, 2, torch.float16)
    out = lpt.label_logprobs_triton(**inputs, out=poisoned(130, 2))
    assert lpt.default_config(130).block_b == 128 and not lpt.default_config(130).swap_ab
    assert_matches(out, float64_expected(**inputs), torch.float16)


def test_strided_rows_and_tied_embeddings() -> None:
    # Last position of [B, T, H] hidden states (strided rows) against an nn.Embedding weight that
    # requires grad, the way a tied LM head arrives.
    emb = torch.nn.Embedding(500, 48)
    states = torch.randn(6, 5, 48)
    ids = torch.randint(0, 500, (6, 3))
    out = label_logprobs(states[:, -1, :], emb.weight, ids, impl="triton")
    expected = float64_expected(states[:, -1, :], emb.weight.detach(), ids, None, None)
    assert_matches(out, expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_float64(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lp_module, "_VOCAB_CHUNK", 256)  # several chunks plus a partial one
    inputs = make_inputs(9, 64, 1000, 4, dtype, with_bias=True, ragged=True)
    assert_matches(label_logprobs(**inputs, impl="torch"), float64_expected(**inputs), dtype)


def test_auto_dispatch_picks_torch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def spy_reference(*args: Any, **kwargs: Any) -> LabelLogprobs:
        calls.append("torch")
        return label_logprobs_reference(*args, **kwargs)

    def spy_triton(*args: Any, **kwargs: Any) -> LabelLogprobs:
        calls.append("triton")
        return LabelLogprobs(torch.zeros(2, 2), torch.zeros(2))

    monkeypatch.setattr(lp_module, "label_logprobs_reference", spy_reference)
    monkeypatch.setattr(lpt, "label_logprobs_triton", spy_triton)
    inputs = make_inputs(2, 32, 100, 2, torch.float32)
    label_logprobs(**inputs)
    label_logprobs(**inputs, impl="torch")
    label_logprobs(**inputs, impl="triton")
    assert calls == ["torch", "torch", "triton"]


def test_input_errors() -> None:
    inputs = make_inputs(2, 32, 100, 2, torch.float32)
    with pytest.raises(ValueError, match="impl"):
        label_logprobs(**inputs, impl="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight"):
        label_logprobs(inputs["hidden"], inputs["weight"][:, :16], inputs["label_ids"])
    with pytest.raises(ValueError, match="label_ids"):
        label_logprobs(inputs["hidden"], inputs["weight"], inputs["label_ids"][:1])
    with pytest.raises(TypeError, match="integer"):
        label_logprobs(inputs["hidden"], inputs["weight"], inputs["label_ids"].float())
    with pytest.raises(ValueError, match="label_mask"):
        label_logprobs(
            inputs["hidden"], inputs["weight"], inputs["label_ids"], torch.ones(2, 3, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="bias"):
        label_logprobs(inputs["hidden"], inputs["weight"], inputs["label_ids"], bias=torch.zeros(99))


class _ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor any torch op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@contextmanager
def _no_vocab_wide_tensors(vocab: int) -> Iterator[_ShapeRecorder]:
    with _ShapeRecorder() as rec:
        yield rec
    # W itself is [V, H] (V leading); a logits-like tensor has V in a later dimension.
    wide = [s for s in rec.shapes if vocab in s[1:]]
    assert rec.shapes, "recorder saw no ops"
    assert not wide, f"tensors with a vocabulary-wide dimension were created: {wide}"


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_never_allocates_batch_by_vocab(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    batch, hidden, vocab, n_labels = 3, 16, 2000, 2  # all distinct, so shapes are unambiguous
    monkeypatch.setattr(lp_module, "_VOCAB_CHUNK", 512)
    inputs = make_inputs(batch, hidden, vocab, n_labels, torch.float32, with_bias=True)
    with _no_vocab_wide_tensors(vocab):
        out = label_logprobs(**inputs, impl=impl)  # type: ignore[arg-type]
    assert_matches(out, float64_expected(**inputs), torch.float32)
    # The guard itself catches the naive path.
    with pytest.raises(AssertionError, match="vocabulary-wide"), _no_vocab_wide_tensors(vocab):
        float64_expected(**inputs)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("bad", [100, -1, 10**6])
def test_label_ids_outside_the_vocabulary_are_refused(impl: str, bad: int) -> None:
    """An unmasked id outside [0, V) names its row, slot and id: the kernel read past W (NaN or
    another row's logit) and the reference took -1 as W's last row, both without a word. Masked
    slots may hold any id."""
    inputs = make_inputs(3, 32, 100, 3, torch.float32)
    ids = inputs["label_ids"].clone()
    ids[2, 1] = bad
    with pytest.raises(
        ValueError, match=rf"label id {bad} \(row 2, slot 1\) is outside the vocabulary \[0, 100\)"
    ):
        label_logprobs(inputs["hidden"], inputs["weight"], ids, impl=impl)  # type: ignore[arg-type]
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, 1] = False
    out = label_logprobs(inputs["hidden"], inputs["weight"], ids, mask, impl=impl)  # type: ignore[arg-type]
    assert_matches(out, float64_expected(inputs["hidden"], inputs["weight"], ids, mask, None), torch.float32)


@pytest.mark.parametrize("kernel", ["reference", "triton"])
def test_ids_outside_the_vocabulary_past_the_check_come_out_nan(kernel: str) -> None:
    """Ids on a GPU are not checked on the host (that would wait for the device); there both paths
    give NaN for such a slot, which the engine's score check refuses, never a number read from
    outside W or from its last row. Called past the entry point's check, on CPU tensors."""
    inputs = make_inputs(2, 32, 100, 4, torch.float32, with_bias=True)
    ids = inputs["label_ids"].clone()
    ids[0, 1], ids[1, 3] = 100, -1
    call = label_logprobs_reference if kernel == "reference" else lpt.label_logprobs_triton
    out = call(inputs["hidden"], inputs["weight"], ids, None, inputs["bias"])
    outside = torch.zeros_like(ids, dtype=torch.bool)
    outside[0, 1] = outside[1, 3] = True
    assert out.logprobs[outside].isnan().all()
    expected = float64_expected(inputs["hidden"], inputs["weight"], ids.clamp(0, 99), None, inputs["bias"])
    torch.testing.assert_close(out.log_normalizer.double(), expected.log_normalizer, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(
        out.logprobs[~outside].double(), expected.logprobs[~outside], atol=1e-4, rtol=1e-5
    )
