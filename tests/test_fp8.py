"""Opt-in FP8 (``quantization="fp8"``): the packed decoder's quantised products against a plain-torch
fake-quantisation reference of the same scheme (tests/helpers/fp8_reference.py, written apart from
genscore's), the ``torch._scaled_mm`` glue against an explicit dequantised product, and the setting's
refusals where FP8 cannot run. The real products on a GPU are measured by benchmarks/bench_text.py
--fp8; here ``torch._scaled_mm`` runs on the CPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from genscore_core import GenerativeScorer
from genscore_core.cli_args import add_config_arguments
from genscore_core.config import LocalSettings, ScorerConfig
from genscore_core.engine import select_forward
from genscore_core.errors import ConfigurationError
from genscore_core.kernels.fused_ops import quantize_rows_e4m3
from genscore_core.packed import PackedForward, PackedOptions
from genscore_core.packed.fp8 import Fp8Linear, Fp8Rows, unsupported_reason
from tests.helpers.fp8_reference import fake_quant_rows, fake_quantised
from tests.helpers.packed_reference import SPEC, random_groups, reference_rows


def _dequantised_product(x: Fp8Rows, linear: Fp8Linear) -> torch.Tensor:
    """The product ``torch._scaled_mm`` stands for, written out in float32."""
    out = (x.values.float() * x.scale) @ (linear.weight.float() * linear.scale[:, None]).t()
    return out if linear.bias is None else out + linear.bias.float()


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_glue_is_the_dequantised_product(out_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 64), torch.randn(48)
    linear = Fp8Linear.of((weight, bias), out_dtype)
    x = Fp8Rows(*quantize_rows_e4m3(torch.randn(5, 64) * 3))
    torch.testing.assert_close(
        (linear.weight.float() * linear.scale[:, None]), fake_quant_rows(weight), atol=0, rtol=0
    )
    expected = _dequantised_product(x, linear)
    tol = 1e-5 if out_dtype == torch.float32 else 3e-2
    torch.testing.assert_close(linear(x).float(), expected, atol=tol, rtol=tol)
    # Into the first rows of a larger buffer (where the decoder's loaded prefix rows follow), and a
    # slice of output channels (the last layer's queries, keys and values).
    out = torch.zeros(8, 48, dtype=out_dtype)
    linear(x, out=out[:5])
    torch.testing.assert_close(out[:5].float(), expected, atol=tol, rtol=tol)
    assert not out[5:].any()
    torch.testing.assert_close(linear.rows(16)(x).float(), expected[:, 16:], atol=tol, rtol=tol)
    assert linear(Fp8Rows(*quantize_rows_e4m3(torch.empty(0, 64)))).shape == (0, 48)


def test_fp8_rows_select_rows() -> None:
    x = Fp8Rows(*quantize_rows_e4m3(torch.randn(6, 32)))
    picked = x.index_select(0, torch.tensor([4, 1]))
    assert torch.equal(picked.values.float(), x.values.float()[[4, 1]])
    assert torch.equal(picked.scale, x.scale[[4, 1]])


def _groups(vocab: int) -> list:
    return random_groups(random.Random(0), vocab, SPEC)


def test_fp8_decoder_adds_no_error_of_its_own(tiny_model_dir: Path) -> None:
    """A float32 model (products written in float32): the fake-quantised reference's rows to float32
    rounding, at a budget that carries prefixes between batches; the plain rows are far off."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    groups = _groups(model.config.vocab_size)
    with fake_quantised(model):
        reference = reference_rows(model, groups)
    plain = reference_rows(model, groups)
    forward = PackedForward(model, max_batch_tokens=20, options=PackedOptions(quantization="fp8"))
    got = forward.last_hidden_states(groups)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
    assert (got - plain).abs().max() > 0.1


def test_fp8_decoder_in_bf16_is_within_the_bf16_recipe_error(tiny_model_dir: Path) -> None:
    """A bf16 model: against the float32 fake-quantised reference, the FP8 path errs no more than the
    same scheme run the model's own way in bf16 (its forward with fake-quantised products rounding
    to bf16); e4m3 rounding turns bf16 noise into whole e4m3 steps, so both exceed plain bf16's error."""
    model16 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).eval()
    model32 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).float().eval()
    groups = _groups(model16.config.vocab_size)
    with fake_quantised(model32):
        reference = reference_rows(model32, groups)
    with fake_quantised(model16):
        recipe = reference_rows(model16, groups).float()
    got = PackedForward(model16, options=PackedOptions(quantization="fp8")).last_hidden_states(groups)
    recipe_error = (recipe - reference).abs()
    error = (got - reference).abs()
    assert error.max() <= recipe_error.max() and error.mean() <= recipe_error.mean(), (error, recipe_error)
    # Quantised: nearer the fake-quantised rows than the plain float32 ones.
    assert (got - reference_rows(model32, groups)).abs().mean() > 1.5 * error.mean()


def test_default_stays_in_the_model_dtype(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    assert PackedForward(model).decoder.fp8 is None
    assert ScorerConfig().local is not None and ScorerConfig().local.quantization is None


def test_refused_on_the_cpu_and_with_the_padded_forward(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs a CUDA GPU with FP8 tensor cores") as caught:
        GenerativeScorer(str(tiny_model_dir), device="cpu", quantization="fp8")
    assert caught.value.setting == "quantization"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    with pytest.raises(ConfigurationError, match="runs in the packed forward") as caught:
        select_forward(model, LocalSettings(quantization="fp8", forward="padded"), pad_token_id=0)
    assert caught.value.setting == "quantization"


def test_unsupported_reasons() -> None:
    cpu = torch.device("cpu")
    assert "needs a CUDA GPU" in (unsupported_reason(cpu, torch.bfloat16, {}) or "")
    if torch.cuda.is_available():  # on a GPU machine: the capability, dtype and size checks
        gpu = torch.device("cuda")
        reason = unsupported_reason(gpu, torch.float16, {"hidden_size": 1000})
        assert reason is not None


def test_command_line_flag() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert parser.parse_args(["--quantization", "fp8"]).quantization == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "int4"])
