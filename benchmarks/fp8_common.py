"""What the FP8 measurements share: a plain-torch fake-quantisation of genscore's FP8 scheme, ranking
agreement (Kendall tau, top-10 overlap), and the weight scales of the issue's experiment.

The scheme, written here apart from genscore's code: every ``nn.Linear`` of the decoder layers but the
attention's output projection (``o_proj``) runs in float32 on a quantised-then-dequantised weight
(float8 e4m3, one scale per output channel: the row's absolute maximum / 448) and a
quantised-then-dequantised input (the same, one scale per token). Embeddings, norms, attention, the
output projection and the head are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
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
    """``model`` (float32) with its decoder layers' linear layers but ``o_proj`` fake-quantised;
    restored after."""
    swapped = []
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear) and name != "o_proj":
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
    if baseline is not None and baseline["max"] > 0 and baseline["mean"] > 0:
        ratios = f" ({got['max'] / baseline['max']:.2f}x / {got['mean'] / baseline['mean']:.2f}x bf16's)"
    return (
        f"{name}: max {got['max']:.2e} mean {got['mean']:.2e}{ratios}, tau {got['tau']:.3f}, "
        f"top-10 {got['top10']:.0%}"
    )


# -- bench_text.py --fp8 ------------------------------------------------------------------------------


def allow_fp8_on_the_cpu() -> None:
    """--dry-run on the CPU: genscore refuses FP8 there (no FP8 tensor cores), but torch._scaled_mm
    runs, so the script's own code is checked with the device check skipped."""
    from genscore_core.packed import fp8

    fp8.check_supported = lambda *args, **kwargs: None


def fp8_section(
    report: Any,
    *,
    build: Any,
    model: Any,
    tokenizer: Any,
    w1: tuple[str, list[str]],
    w4_sets: list[tuple[str, list[str]]],
    bf16_w1_s: float,
    bf16_w4_s: float,
    repeats: int,
    scales: Sequence[float],
    fresh: Callable[[Any], None] | None = None,
) -> None:
    """FP8 beside bf16 in one run: W1 and W4 speed on ``model``; then, at each weight scale, W1's
    accuracy against the official recipe in fp32 of genscore's FP8 and bf16 paths, the official bf16
    recipe, and the scheme simulated in plain torch (fp32, and bf16 as its own yardstick).

    ``build(dtype)``: a new model of the benchmark's shape in ``dtype`` (weights to be loaded).
    ``fresh(scorer)``: times the FP8 scorer's calls on fresh documents, before any other call."""
    from common import OfficialRecipe

    from genscore_core import GenerativeScorer

    scorer = GenerativeScorer.from_model(model, tokenizer, quantization="fp8")
    if fresh is not None:
        fresh(scorer)
    _fp8_speed(report, scorer, w1, w4_sets, bf16_w1_s, bf16_w4_s, repeats)
    del scorer
    pairs = [(w1[0], d) for d in w1[1]]
    state = model.state_dict()
    for scale in scales:
        scaled = build(model.dtype)
        scaled.load_state_dict(state)
        scale_weights(scaled, scale)
        ref_model = build(torch.float32)
        ref_model.load_state_dict(scaled.state_dict())
        ref = OfficialRecipe(ref_model, tokenizer)(pairs)
        with fake_quantised(ref_model):
            simulated_scores = OfficialRecipe(ref_model, tokenizer)(pairs)
        del ref_model
        official = agreement(OfficialRecipe(scaled, tokenizer)(pairs), ref)
        with fake_quantised(scaled):
            simulated16 = agreement(OfficialRecipe(scaled, tokenizer)(pairs), simulated_scores)
        # Accuracy only: no CUDA-graph ladder to capture for these one-call scorers.
        genscore_bf16 = agreement(
            _scores(GenerativeScorer.from_model(scaled, tokenizer, cuda_graphs=False), w1), ref
        )
        fp8_scores = _scores(
            GenerativeScorer.from_model(scaled, tokenizer, quantization="fp8", cuda_graphs=False), w1
        )
        fp8 = agreement(fp8_scores, ref)
        name = f"W1 accuracy, weights x{scale:g}"
        report.add(name, "genscore FP8 vs fp32 recipe: max error", fp8["max"], "",
                   note=describe("FP8", fp8, official))  # fmt: skip
        report.add(name, "official bf16 recipe vs fp32: max error", official["max"], "",
                   note=describe("official bf16", official))  # fmt: skip
        report.add(name, "genscore bf16 vs fp32 recipe: max error", genscore_bf16["max"], "",
                   note=describe("genscore bf16", genscore_bf16, official))  # fmt: skip
        simulated = agreement(simulated_scores, ref)
        report.add(name, "FP8 scheme simulated in fp32 vs fp32: max error", simulated["max"], "",
                   note=describe("simulated", simulated, official))  # fmt: skip
        against = agreement(fp8_scores, simulated_scores)
        report.add(name, "genscore FP8 vs the simulated scheme: max error", against["max"], "",
                   note=describe("FP8 vs simulated", against) + "; "
                   + describe("the simulated scheme in bf16 vs in fp32 (its yardstick)", simulated16))  # fmt: skip
        del scaled
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _fp8_speed(
    report: Any, scorer: Any, w1: tuple[str, list[str]], w4_sets: list[tuple[str, list[str]]],
    bf16_w1_s: float, bf16_w4_s: float, repeats: int,
) -> None:  # fmt: skip
    from common import call_times, median

    docs = len(w1[1])

    def w1_call() -> Any:
        return scorer.rerank(*w1)

    w1_call(), w1_call()
    fp8_w1_s = median(call_times([w1_call] * repeats))
    report.add("W1 FP8", f"pairs/s, 1 x {docs}, documents repeated", docs / fp8_w1_s, "pairs/s",
               note=f"{bf16_w1_s / fp8_w1_s:.2f}x bf16's {docs / bf16_w1_s:,.0f} pairs/s in this run")  # fmt: skip
    w4_calls = [lambda s=s: scorer.rerank(*s) for s in w4_sets]
    call_times(w4_calls * 2)
    t4 = median(call_times(w4_calls * max(2, repeats // 2)))
    report.add("W4 FP8", "median latency, 1 x 20, documents repeated", t4 * 1e3, "ms",
               note=f"bf16 {bf16_w4_s * 1e3:.1f} ms in this run")  # fmt: skip


def _scores(scorer: Any, w1: tuple[str, list[str]]) -> list[float]:
    scores = [0.0] * len(w1[1])
    for r in scorer.rerank(*w1):
        scores[r.index] = r.score
    return scores
