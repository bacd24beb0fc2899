"""A plain-torch fake-quantisation reference of genscore's FP8 scheme, written apart from it.

Every ``nn.Linear`` of the decoder layers except the attention's output projection (``o_proj``) runs in
float32 on a quantised-then-dequantised weight (per output channel: scale = the row's absolute maximum /
448, values rounded to the nearest e4m3) and a quantised-then-dequantised input (per token). Nothing
else changes: embeddings, norms, attention, ``o_proj`` and the head are the model's own, in float32. It
runs the model's own Hugging Face forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

FP8_MAX = 448.0


def fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` (float32) quantised to e4m3 at scale amax / 448 and dequantised."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


class _FakeQuantLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = fake_quant_rows(linear.weight.detach().float())
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In the input's dtype out, as the model's own product: a bf16 model rounds its output.
        return F.linear(fake_quant_rows(x.float()), self.weight, self.bias).to(x.dtype)


@contextlib.contextmanager
def fake_quantised(model: Any) -> Iterator[Any]:
    """``model`` (float32) with its decoder layers' linear layers but ``o_proj`` fake-quantised,
    restored after."""
    swapped: list[tuple[Any, str, torch.nn.Module]] = []
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear) and name != "o_proj":
                    swapped.append((parent, name, child))
                    setattr(parent, name, _FakeQuantLinear(child))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
