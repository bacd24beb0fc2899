"""The FP8-output kernels (add+RMSNorm, silu*mul): each Triton kernel (through the
CPU interpreter, conftest.py) against its torch version bit for bit, and the torch versions against
the fake-quantisation reference written apart in tests/helpers/fp8_reference.py. Then the packed
decoder with FP8 products and every Triton kernel against that reference's forward."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from genscore_core.kernels import fused_ops
from genscore_core.kernels.dispatch import KernelImpl
from genscore_core.packed import PackedForward, PackedOptions
from tests.helpers.fp8_reference import fake_quant_rows, fake_quantised
from tests.helpers.packed_reference import random_groups, reference_rows

pytest.importorskip("triton")


def _same_bits(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert a[0].dtype == b[0].dtype == torch.float8_e4m3fn
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
    torch.testing.assert_close(a[1], b[1], atol=0, rtol=2e-7)


def _dequantised(q: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return q[0].float() * q[1]


def test_add_rmsnorm_fp8() -> None:
    r = torch.randn(7, 48) * 3
    delta = torch.randn(7, 48).bfloat16()
    w = torch.randn(48).bfloat16()
    r1, r2 = r.clone(), r.clone()
    a = fused_ops.add_rmsnorm_fp8(r1, delta, w, 1e-6, impl="torch")
    b = fused_ops.add_rmsnorm_fp8(r2, delta, w, 1e-6, impl="triton")
    _same_bits(a, b)
    torch.testing.assert_close(r2, r1)  # the residual updated in place alike
    torch.testing.assert_close(r1, r + delta.float())
    normed = r1 * torch.rsqrt(r1.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(_dequantised(a), fake_quant_rows(normed), atol=1e-6, rtol=1e-6)
    # Normalising only.
    _same_bits(
        fused_ops.add_rmsnorm_fp8(r1, None, w, 1e-6, impl="torch"),
        fused_ops.add_rmsnorm_fp8(r2, None, w, 1e-6, impl="triton"),
    )


def test_silu_mul_fp8_reads_strided_halves() -> None:
    gate_up = torch.randn(5, 80) * 4
    gate, up = gate_up[:, :40], gate_up[:, 40:]
    a = fused_ops.silu_mul_fp8(gate, up, impl="torch")
    _same_bits(a, fused_ops.silu_mul_fp8(gate, up, impl="triton"))
    torch.testing.assert_close(_dequantised(a), fake_quant_rows(F.silu(gate) * up), atol=0, rtol=0)


def _silu_mul_fp8_of(x: torch.Tensor, impl: KernelImpl) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` quantised through silu_mul_fp8: silu(32) is exactly 32 in float32 (exp(-32) vanishes
    beside 1) and ``x / 32 * 32`` is ``x`` exactly, so the kernel's rounding sees ``x`` itself."""
    return fused_ops.silu_mul_fp8(torch.full_like(x, 32.0), x / 32, impl=impl)


def test_e4m3_rows_over_magnitudes_and_zero_rows() -> None:
    """Rows from 1e-8 to 1e3 (normal and subnormal e4m3 values), a strided view and an all-zero row."""
    x = (torch.randn(6, 2, 33) * torch.logspace(-8, 3, 6)[:, None, None])[:, 0]
    x[2] = 0
    a = _silu_mul_fp8_of(x, "torch")
    _same_bits(a, _silu_mul_fp8_of(x, "triton"))
    torch.testing.assert_close(_dequantised(a), fake_quant_rows(x), atol=0, rtol=0)
    assert torch.isfinite(a[1]).all() and not a[0][2].float().any()


def test_rounding_carries_into_the_next_binade_and_ties_go_to_even() -> None:
    """127.6 rounds up to 128 (Triton's interpreter conversion gave 64), 1.0625 (a tie between 1 and
    1.125) to 1, 1.1875 (between 1.125 and 1.25) to 1.25; the row maximum maps to 448."""
    x = torch.tensor([[127.6, 1.0625, 1.1875, -31.9, 448.0, 0.0]])
    values, scale = _silu_mul_fp8_of(x, "triton")
    assert scale.item() == 1.0
    assert values.float().tolist() == [[128.0, 1.0, 1.25, -32.0, 448.0, 0.0]]


def test_fp8_decoder_through_the_kernels(tiny_model_dir: Path) -> None:
    """Every Triton kernel with FP8 products on a float32 model (products written in float32): the
    fake-quantised reference's rows to float32 rounding, so the kernels add no error of their own
    (plain float32 rows differ by order 0.1-1). A budget of 20 tokens carries prefixes between batches."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    groups = random_groups(random.Random(3), model.config.vocab_size, [(9, [4, 1, 12]), (0, [5, 3])])
    with fake_quantised(model):
        reference = reference_rows(model, groups)
    options = PackedOptions(attention="triton", fused_ops="triton", gated_mlp="torch", quantization="fp8")
    got = PackedForward(model, max_batch_tokens=20, options=options).last_hidden_states(groups)
    torch.testing.assert_close(got, reference, atol=2e-5, rtol=2e-5)
    plain = reference_rows(model, groups)
    assert (got - plain).abs().max() > 0.05  # quantised, not the plain model
