"""The packed forward with every Triton kernel (attention, add+RMSNorm, norm+rotary, the gate/up GEMM
with silu*mul, or the gate/up product with silu*mul reading its halves),
run on the CPU through Triton's interpreter, against each prompt alone through the Hugging Face forward.

The same comparison with the torch references is in tests/test_packed_forward.py; this one shows the
kernels compose into the same hidden states, including prefixes carried from one batch to the next.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from genscore_core.forward import PrefixGroup
from genscore_core.packed import PackedForward, PackedOptions
from tests.helpers.packed_reference import ATOL, reference_rows

pytest.importorskip("triton")

# Small enough for the interpreter: prefixes shared by several prompts, and one group without one.
SPEC = [(9, [4, 1, 12]), (0, [5, 3]), (14, [2, 7])]


def _groups(vocab: int) -> list[PrefixGroup]:
    rng = random.Random(8)
    return [
        PrefixGroup(
            [rng.randrange(vocab) for _ in range(p)], [[rng.randrange(vocab) for _ in range(n)] for n in ns]
        )
        for p, ns in SPEC
    ]


def _triton_forward(model: Any, budget: int) -> PackedForward:
    forward = PackedForward(model, max_batch_tokens=budget, options=PackedOptions.all_kernels("triton"))
    decoder = forward.decoder
    assert (decoder.attention_impl, decoder.ops_impl, decoder.mlp_impl) == ("triton", "triton", "triton")
    return forward


@pytest.mark.parametrize("budget", [20, 10_000])
def test_qwen3_through_the_kernels(tiny_model_dir: Path, budget: int) -> None:
    """budget 20 splits groups over batches: their prefix keys are saved, then loaded."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    groups = _groups(model.config.vocab_size)
    got = _triton_forward(model, budget).last_hidden_states(groups)
    torch.testing.assert_close(got, reference_rows(model, groups), atol=ATOL, rtol=ATOL)


def test_qwen2_through_the_kernels() -> None:
    """q/k/v biases and no q/k norms; head dim 16, the smallest a Triton dot takes."""
    torch.manual_seed(2)
    config = Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.2,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    groups = _groups(config.vocab_size)
    got = _triton_forward(model, 20).last_hidden_states(groups)
    torch.testing.assert_close(got, reference_rows(model, groups), atol=ATOL, rtol=ATOL)


def test_fused_mlp_alone_with_mlp_biases() -> None:
    """Only the gate/up GEMM kernel on Triton, on a Llama with MLP biases (Qwen3 has none)."""
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, mlp_bias=True, initializer_range=0.2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # biases of order one, so that leaving one out would show
        for layer in model.model.layers:
            layer.mlp.gate_proj.bias.normal_()
            layer.mlp.up_proj.bias.normal_()
    forward = PackedForward(
        model,
        max_batch_tokens=20,
        options=PackedOptions(gated_mlp="triton", fused_ops="torch", attention="torch"),
    )
    assert forward.decoder.mlp_impl == "triton"
    groups = _groups(config.vocab_size)
    torch.testing.assert_close(
        forward.last_hidden_states(groups), reference_rows(model, groups), atol=ATOL, rtol=ATOL
    )


@pytest.mark.parametrize("budget", [20, 10_000])
def test_fused_projections_with_biases_through_the_kernels(budget: int) -> None:
    """A Llama with q/k/v and MLP biases of order one: the fused q/k/v product's column blocks go
    through the Triton rope and attention (K/V rows with the product's stride, saved and loaded
    prefixes at budget 20), the fused gate/up product's halves through the Triton silu*mul."""
    torch.manual_seed(4)
    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=True, mlp_bias=True, initializer_range=0.2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.mlp.gate_proj, layer.mlp.up_proj):  # fmt: skip
                module.bias.normal_()
    forward = PackedForward(
        model,
        max_batch_tokens=budget,
        options=PackedOptions(attention="triton", fused_ops="triton", gated_mlp="torch"),
    )
    decoder = forward.decoder
    assert decoder.layers[0].qkv is not None and decoder.layers[0].gate_up is not None
    assert (decoder.attention_impl, decoder.ops_impl, decoder.mlp_impl) == ("triton", "triton", "torch")
    groups = _groups(config.vocab_size)
    torch.testing.assert_close(
        forward.last_hidden_states(groups), reference_rows(model, groups), atol=ATOL, rtol=ATOL
    )


def test_a_bf16_model_through_the_fused_ops(tiny_model_dir: Path) -> None:
    """A bf16 model with add+RMSNorm, rotary and silu*mul on Triton (attention and products stay
    torch, to test the fused ops alone), prefixes carried between batches. In bf16 the kernels and
    the torch versions round apart by up to ~0.06 on this model's rows, so both are held to the
    float32 model's rows within bf16 noise; a residual read or written in the wrong dtype is off by
    order one."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).eval()
    model32 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    groups = _groups(model.config.vocab_size)
    reference = reference_rows(model32, groups)

    def rows(ops: str) -> torch.Tensor:
        options = PackedOptions(fused_ops=ops, attention="torch", gated_mlp="torch")  # type: ignore[arg-type]
        forward = PackedForward(model, max_batch_tokens=20, options=options)
        assert forward.decoder.ops_impl == ops
        return forward.last_hidden_states(groups)

    triton_rows = rows("triton")
    torch.testing.assert_close(triton_rows, reference, atol=0.1, rtol=0.05)
    torch.testing.assert_close(triton_rows, rows("torch"), atol=0.1, rtol=0.05)


def test_a_bf16_model_through_every_kernel(tiny_model_dir: Path) -> None:
    """A bf16 model with attention, the fused ops and the gate/up GEMM all on Triton, prefixes carried
    between batches, within bf16 noise of the float32 model's rows, as the torch versions are (the
    interpreter's bf16 dots, wrong on the CPU, are upcast by the kernels there: without that the rows
    are off by orders of magnitude)."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).eval()
    model32 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    groups = _groups(model.config.vocab_size)
    reference = reference_rows(model32, groups)
    triton_rows = _triton_forward(model, 20).last_hidden_states(groups)
    torch_rows = PackedForward(
        model, max_batch_tokens=20, options=PackedOptions.all_kernels("torch")
    ).last_hidden_states(groups)
    torch.testing.assert_close(torch_rows, reference, atol=0.1, rtol=0.05)
    torch.testing.assert_close(triton_rows, reference, atol=0.1, rtol=0.05)
