"""What the FP8 measurements share: a plain-torch fake-quantisation of genscore's FP8 scheme, ranking
agreement (Kendall tau, top-10 overlap), and the weight scales of the issue's experiment.

The scheme, written here apart from genscore's code: every ``nn.Linear`` of the decoder layers runs in
float32 on a quantised-then-dequantised weight (float8 e4m3, one scale per output channel: the row's
absolute maximum / 448) and a quantised-then-dequantised input (the same, one scale per token).
Embeddings, norms, attention and the head are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
WEIGHT_SCALES = (1.0, 1.5, 2.0, 3.0)
"""The issue's experiment: every matrix of a random-init model (embeddings, projections; not the norms)
multiplied by the scale, which widens the activations' range (more outliers per token)."""


def fake_quant(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` quantised to e4m3 at scale amax / 448, then dequantised (float32)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


class FakeQuantLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = fake_quant(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(fake_quant(x), self.weight, self.bias).to(x.dtype)


@contextlib.contextmanager
def fake_quantised(model: Any) -> Iterator[Any]:
    """``model`` (float32) with its decoder layers' linear layers fake-quantised; restored after."""
    swapped = []
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    swapped.append((parent, name, child))
                    setattr(parent, name, FakeQuantLinear(child))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


def scale_weights(model: Any, scale: float) -> None:
    """Multiply every matrix of ``model`` (not the norms' vectors) by ``scale``, in place."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(scale)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of two score lists (ties in either count as neither agreeing nor not)."""
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    dx = torch.sign(x[:, None] - x[None, :])
    dy = torch.sign(y[:, None] - y[None, :])
    upper = torch.triu(torch.ones_like(dx, dtype=torch.bool), diagonal=1)
    concordance = (dx * dy)[upper].sum()
    pairs_x, pairs_y = (dx[upper] != 0).sum(), (dy[upper] != 0).sum()
    return float(concordance / torch.sqrt(pairs_x * pairs_y)) if pairs_x and pairs_y else float("nan")


def top_overlap(a: Sequence[float], b: Sequence[float], k: int = 10) -> float:
    """Share of ``a``'s top ``k`` documents that are in ``b``'s top ``k``."""
    k = min(k, len(a))
    top_a = set(torch.tensor(a).topk(k).indices.tolist())
    top_b = set(torch.tensor(b).topk(k).indices.tolist())
    return len(top_a & top_b) / k


def agreement(got: Sequence[float], ref: Sequence[float]) -> dict[str, float]:
    """Max and mean absolute error, Kendall tau and top-10 overlap of ``got`` against ``ref``."""
    diff = [abs(g - r) for g, r in zip(got, ref, strict=True)]
    return {
        "max": max(diff),
        "mean": sum(diff) / len(diff),
        "tau": kendall_tau(got, ref),
        "top10": top_overlap(got, ref),
    }


def describe(name: str, got: dict[str, float], baseline: dict[str, float] | None = None) -> str:
    """One line: ``name`` max/mean error (and x ``baseline``'s), tau, top-10 overlap."""
    ratios = ""
    if baseline is not None:
        ratios = f" ({got['max'] / baseline['max']:.2f}x / {got['mean'] / baseline['mean']:.2f}x bf16's)"
    return (
        f"{name}: max {got['max']:.2e} mean {got['mean']:.2e}{ratios}, tau {got['tau']:.3f}, "
        f"top-10 {got['top10']:.0%}"
    )
