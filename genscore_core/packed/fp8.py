"""Opt-in FP8 products of the packed decoder (``LocalSettings.quantization="fp8"``).

The scheme: the weight matrices of a decoder layer that a norm or SiLU feeds (q/k/v, gate/up, down)
are quantised once, per output channel, to float8 e4m3 with a float32 scale per row (its absolute
maximum / 448); each of those products' input is quantised per token the same way, inside the kernel
that makes it (add+RMSNorm, silu*mul), and the product runs as ``torch._scaled_mm`` with row-wise
scales and a bf16 output. Everything else is untouched: the embeddings, every norm and the residual
stream (float32), attention (bf16), the attention's output projection (bf16), the last norm and the
label rows of the head (which read the float32 hidden state; quantising the head is what broke
Qwen3-Reranker in public reports).

Why the output projection stays in bf16: its input, the attention output, is made by no norm or SiLU
kernel, so quantising it took a kernel of its own, and on random-initialised Qwen3-0.6B weights at
scale 1 it was the product that pushed FP8's error past 5x the bf16 recipe's (3.3x max / 7.8x mean
with it in FP8, 1.5x / 2.5x without; docs/benchmarks.md, "FP8"). It holds 9-13% of a layer's
weights (the 8B and 0.6B shapes).

The FP8 weights are held beside the model's own (which its own forward, ``save_pretrained`` and a
rebuild still read): more memory by about half the size of the bf16 weights they quantise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from genscore_core.errors import ConfigurationError
from genscore_core.kernels.fused_ops import E4M3_MAX, MIN_AMAX

Linear = tuple[torch.Tensor, torch.Tensor | None]
"""An ``nn.Linear``'s (weight, bias)."""

MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards."""


class Fp8Rows(NamedTuple):
    """Rows quantised per token: float8 e4m3 ``values`` [T, K] and float32 ``scale`` [T, 1]."""

    values: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def index_select(self, dim: int, index: torch.Tensor) -> Fp8Rows:
        """The rows at ``index`` (``dim`` 0). Selected as bytes: index kernels need not take float8."""
        if dim != 0:
            raise ValueError("Fp8Rows selects rows only (dim 0)")
        values = self.values.view(torch.uint8).index_select(0, index).view(torch.float8_e4m3fn)
        return Fp8Rows(values, self.scale.index_select(0, index))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] as float8 e4m3 [N, K] (contiguous) and a float32 scale [N] per output channel
    (the row's absolute maximum / 448), quantised from float32, rounding to nearest."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=MIN_AMAX) / E4M3_MAX
    values = (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values.contiguous(), scale.view(-1)


@dataclass(frozen=True)
class Fp8Linear:
    """One quantised product ``x @ W.T + b``: the weight's e4m3 values [N, K] with their scales [N],
    and the bias in the output's dtype (or None)."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype

    @classmethod
    def of(cls, linear: Linear, out_dtype: torch.dtype) -> Fp8Linear:
        weight, bias = linear
        values, scale = quantize_weight(weight)
        return cls(values, scale, None if bias is None else bias.detach().to(out_dtype), out_dtype)

    def rows(self, start: int, stop: int | None = None) -> Fp8Linear:
        """The product of output channels ``start:stop`` only (views: per-channel scales slice with them)."""
        bias = None if self.bias is None else self.bias[start:stop]
        return Fp8Linear(self.weight[start:stop], self.scale[start:stop], bias, self.out_dtype)

    def __call__(self, x: Fp8Rows, out: torch.Tensor | None = None) -> torch.Tensor:
        """``dequant(x) @ dequant(W).T + b`` [T, N] in ``out_dtype`` (into ``out`` when given),
        accumulated in float32 by ``torch._scaled_mm`` (row-wise scales: [T, 1] and [1, N])."""
        n = self.weight.shape[0]
        if out is None:
            out = torch.empty((x.shape[0], n), dtype=self.out_dtype, device=self.weight.device)
        if x.shape[0] == 0:
            return out
        # The weight [N, K] is row-major, so its transpose [K, N] is the column-major operand
        # _scaled_mm requires; both scales must be contiguous float32 ([T, 1] and [1, N]).
        torch._scaled_mm(
            x.values,
            self.weight.t(),
            scale_a=x.scale,
            scale_b=self.scale.view(1, n),
            out_dtype=self.out_dtype,
            out=out,
        )
        if self.bias is not None:
            out.add_(self.bias)
        return out


@dataclass(frozen=True)
class Fp8Layer:
    """One decoder layer's quantised products, named as the fields of the decoder's ``_Layer`` (the
    output projection ``o`` is not one: it runs in bf16)."""

    qkv: Fp8Linear
    q: Fp8Linear
    kv: Fp8Linear
    gate_up: Fp8Linear
    down: Fp8Linear

    @classmethod
    def of(cls, layer: Any, out_dtype: torch.dtype) -> Fp8Layer:
        """From the decoder's ``_Layer`` (q/k/v and gate/up already fused into one matrix each)."""
        qkv = Fp8Linear.of(layer.qkv, out_dtype)
        q_rows = layer.q[0].shape[0]
        return cls(
            qkv=qkv,
            q=qkv.rows(0, q_rows),
            kv=qkv.rows(q_rows),
            gate_up=Fp8Linear.of(layer.gate_up, out_dtype),
            down=Fp8Linear.of(layer.down, out_dtype),
        )


def unsupported_reason(device: torch.device, dtype: torch.dtype, sizes: dict[str, int]) -> str | None:
    """Why FP8 products cannot run a model on ``device`` in ``dtype`` with these product sizes (None
    when they can): a CUDA GPU of compute capability 8.9 or more, bf16, sizes multiples of 16."""
    if device.type != "cuda":
        return (
            f"it needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); the model is on {device}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"it needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper or newer); "
            f"{name} has {capability[0]}.{capability[1]}"
        )
    if dtype != torch.bfloat16:
        return (
            f"it runs bf16 models (FP8 products write bf16); the model is {str(dtype).removeprefix('torch.')}"
        )
    odd = {name: size for name, size in sizes.items() if size % 16}
    if odd:
        return f"FP8 products need sizes that are multiples of 16; {odd} are not"
    return None


def check_supported(device: torch.device, dtype: torch.dtype, sizes: dict[str, int]) -> None:
    """Raise :class:`ConfigurationError` (setting ``quantization``) where FP8 cannot run."""
    reason = unsupported_reason(device, dtype, sizes)
    if reason is None:
        reason = _probe(device)
    if reason is not None:
        raise ConfigurationError(
            f"quantization='fp8' cannot run here: {reason}; leave quantization unset (bf16)",
            setting="quantization",
        )


def _probe(device: torch.device) -> str | None:
    """Why a small row-scaled ``torch._scaled_mm`` fails on ``device`` (None when it runs): this torch
    build may lack the row-wise kernel for this GPU, which would otherwise fail in the first batch."""
    x = torch.ones((16, 16), device=device).to(torch.float8_e4m3fn)
    try:
        Fp8Linear(x, torch.ones(16, device=device), None, torch.bfloat16)(
            Fp8Rows(x, torch.ones((16, 1), device=device))
        )
    except RuntimeError as error:
        return f"torch {torch.__version__} cannot run row-scaled FP8 products here ({error})"
    return None
