"""Centred FP8 inputs (shift migration), simulated in plain torch on the random-init 0.6B shape.

    python benchmarks/fp8_centring.py --seeds 0,1 --docs 24 --oracle
    python benchmarks/fp8_centring.py --seeds 0,1 --docs 8 --by-position

Issue 34, point 4: on a random-init model the input of every decoder product is, from the third
layer on, nearly one vector shared by all tokens, so the FP8 scheme's rounding (of the weights, and of
that shared part of each input) moves every score by one shift. Centring each product's input on a
vector ``mu`` measured once on a fixed calibration prompt,

    y = Q(x - mu) @ Q(W).T + (W @ mu + b),

leaves e4m3 only the small part ``x - mu`` to round and computes the shared part ``W @ mu`` exactly
(float32, from the unquantised weights). Against the model's own forward in fp32, for each weight seed
and scale, the lines are: the official bf16 recipe (the model's forward in bf16: the yardstick); the
FP8 scheme as it is (``fp8_common.fake_quant`` of weights per output channel and inputs per token);
the scheme centred on ``mu`` from the calibration prompt (never the scored ones); and the scheme
centred on ``mu`` from the scored prompts themselves (an oracle: what centring can do at best).
Every product's output is rounded to bf16, as genscore's FP8 products write bf16.

``--by-position`` (instead of centring): the scheme with the products of the rows of the prefix every
prompt shares (template, instruction, query), of the suffix (the template's end, whose last token is
read), or of both left unquantised: whether the shift comes from the document tokens' shared vector
or from the tokens that are the same in every prompt (whose rounding errors are then the same too).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from common import Report, Texts, build_model, load_tokenizer, run_reported, word_list
from fp8_accuracy import label_ids, prompts
from fp8_common import agreement, describe, fake_quant, scale_weights

CALIBRATION_QUERY = "how do rivers shape the land they flow through"
CALIBRATION_DOCUMENT = (
    "A river carries water from high ground to the sea, and on its way it wears down rock, moves sand "
    "and silt, and builds new land where it slows. In the mountains the current is fast and the valley "
    "is narrow and steep; lower down the river widens, bends and floods its plain in spring. People have "
    "farmed these plains for thousands of years, because each flood leaves a thin layer of rich soil. "
    "Towns grew at the places where a river could be crossed, and trade followed the water. Today "
    "engineers build dams and banks to control floods and to make electricity, but a river that cannot "
    "flood also stops renewing its soil, and its delta can shrink as the sea wears it away."
)
"""The calibration pair: plain English, unlike the scored prompts (W1's random words)."""

Centres = dict[int, torch.Tensor]
"""Each linear layer's centre (by ``id``), float32 [K]."""

EXACT_ROWS: dict[str, torch.Tensor | None] = {"now": None}
"""``--by-position``: the rows (tokens) of the prompt being scored whose products stay unquantised
(bool [T]; exact float32 products, still rounded to bf16), or None."""


class CentredFakeQuantLinear(torch.nn.Module):
    """``Q(x - mu) @ Q(W).T + (W @ mu + b)``, the bias in float32 then bf16, the output in bf16."""

    def __init__(self, linear: torch.nn.Linear, centre: torch.Tensor | None) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        self.weight = fake_quant(w)
        self.weight_exact = w
        self.centre = torch.zeros(w.shape[1]) if centre is None else centre.float()  # [K]
        bias = w @ self.centre  # [N], exact in float32
        if linear.bias is not None:
            bias = bias + linear.bias.detach().float()
        self.bias = bias.to(torch.bfloat16).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x.float() - self.centre  # [1, T, K]
        product = F.linear(fake_quant(centred), self.weight)  # [1, T, N]
        exact_rows = EXACT_ROWS["now"]
        if exact_rows is not None:  # [T]: those rows' products unquantised
            product = torch.where(exact_rows[None, :, None], F.linear(centred, self.weight_exact), product)
        out = product.to(torch.bfloat16).float() + self.bias  # as _scaled_mm then the bias add
        return out.to(torch.bfloat16).to(x.dtype)


def _linears(model: Any) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, name, linear) of every product of the decoder layers."""
    found = []
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in parent.named_children():
                if isinstance(child, torch.nn.Linear):
                    found.append((parent, name, child))
    return found


@contextlib.contextmanager
def centred(model: Any, centres: Centres | None) -> Iterator[Any]:
    """``model`` with every decoder product swapped for :class:`CentredFakeQuantLinear` (centre zero,
    the scheme as it is, when ``centres`` is None); restored after."""
    swapped = _linears(model)
    for parent, name, child in swapped:
        centre = None if centres is None else centres[id(child)]
        setattr(parent, name, CentredFakeQuantLinear(child, centre))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


def measure_centres(model: Any, ids: list[list[int]]) -> Centres:
    """Each product's input averaged over every token of ``ids`` (the prompts run one at a time
    through ``model`` unquantised): float32 [K] per linear layer."""
    sums: dict[int, torch.Tensor] = {}
    count = 0

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        rows = args[0].reshape(-1, args[0].shape[-1]).float()  # [T, K]
        sums[id(module)] = sums.get(id(module), 0) + rows.sum(0)

    handles = [child.register_forward_pre_hook(hook) for _, _, child in _linears(model)]
    try:
        with torch.inference_mode():
            for prompt in ids:
                model.model(input_ids=torch.tensor([prompt]))
                count += len(prompt)
    finally:
        for handle in handles:
            handle.remove()
    return {key: total / count for key, total in sums.items()}


def scores(
    model: Any, ids: list[list[int]], labels: list[int], exact: tuple[bool, bool] | None = None
) -> list[float]:
    """P(yes) of each prompt alone: the last hidden state against the head's (no, yes) rows, in the
    model's dtype (the official recipe's logits), softmax in float32. ``exact``: whether the rows of
    the prefix and of the suffix every prompt shares are left unquantised (:data:`EXACT_ROWS`)."""
    rows = model.get_output_embeddings().weight[labels]  # [2, H]
    prefix, suffix = shared_ends(ids)
    out = []
    with torch.inference_mode():
        for prompt in ids:
            if exact is not None:
                mask = torch.zeros(len(prompt), dtype=torch.bool)  # [T]
                mask[:prefix] = exact[0]
                mask[len(prompt) - suffix :] = exact[1]
                EXACT_ROWS["now"] = mask
            hidden = model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0, -1]  # [H]
            out.append(float(torch.softmax((rows @ hidden).float(), -1)[1]))
    EXACT_ROWS["now"] = None
    return out


def shared_ends(ids: list[list[int]]) -> tuple[int, int]:
    """How many tokens every prompt of ``ids`` shares at its start (the template's prefix, the
    instruction, the query) and at its end (the template's suffix)."""
    shortest = min(len(p) for p in ids)
    prefix = next((i for i in range(shortest) if len({p[i] for p in ids}) > 1), shortest)
    suffix = next((i for i in range(shortest) if len({p[-1 - i] for p in ids}) > 1), shortest)
    return prefix, suffix


def measured(
    model: Any, ids: list[list[int]], calibration: list[int], labels: list[int], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Every line's scores on ``model`` (float32, left as it was), the fp32 reference first."""
    got = {"fp32": scores(model, ids, labels)}
    model16 = copy.deepcopy(model).to(torch.bfloat16)
    got["official bf16 recipe"] = scores(model16, ids, labels)
    with centred(model, None):
        got["FP8 scheme as it is (simulated)"] = scores(model, ids, labels)
        if args.by_position:
            prefix, suffix = shared_ends(ids)
            for key, exact, label in (("prefix", (True, False), f"the shared prefix ({prefix} tokens)"),
                                      ("suffix", (False, True), f"the shared suffix ({suffix} tokens)"),
                                      ("both", (True, True), "the shared prefix and suffix")):  # fmt: skip
                if key not in args.by_position.split(","):
                    continue
                got[f"FP8 scheme, {label} unquantised (simulated)"] = scores(model, ids, labels, exact)
    if args.by_position:
        return got
    with centred(model, measure_centres(model, [calibration])):
        got["FP8 centred, mu from the calibration prompt (simulated)"] = scores(model, ids, labels)
    if args.oracle:
        with centred(model, measure_centres(model, ids)):
            got["FP8 centred, mu from the scored prompts (oracle, simulated)"] = scores(model, ids, labels)
    return got


def run(args: argparse.Namespace, report: Report) -> None:
    tokenizer = load_tokenizer()
    shape = "tiny" if args.dry_run else "0.6b"
    texts = Texts(word_list(tokenizer))  # W1's text: the query, then the documents
    query, documents = texts.query(), texts.documents(4 if args.dry_run else args.docs)
    ids = prompts(tokenizer, query, documents)
    calibration = prompts(tokenizer, CALIBRATION_QUERY, [CALIBRATION_DOCUMENT])[0]
    labels = label_ids(tokenizer)
    tokens = sum(len(p) for p in ids)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for scale in [float(s) for s in args.scales.split(",")]:
            started = time.perf_counter()
            model = build_model(shape, "cpu", torch.float32, seed=seed)
            scale_weights(model, scale)
            got = measured(model, ids, calibration, labels, args)
            del model
            ref = got.pop("fp32")
            official = agreement(got["official bf16 recipe"], ref)
            name = f"{shape} seed {seed} x{scale:g}, 1 x {len(ids)} ({tokens} tokens)"
            for label, line in got.items():
                result = agreement(line, ref)
                base = None if line is got["official bf16 recipe"] else official
                shift = sum(a - b for a, b in zip(line, ref, strict=True)) / len(ref)
                note = f"{describe(label, result, base)}, mean signed error {shift:+.2e}"
                report.add(name, f"{label}: max error", result["max"], "", note=note)
            report.add(name, "seconds", time.perf_counter() - started, "s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1", help="weight seeds, comma-separated")
    parser.add_argument("--docs", type=int, default=24, help="W1 documents scored (default 24)")
    parser.add_argument("--scales", default="1", help="weight scales, comma-separated")
    parser.add_argument("--oracle", action="store_true", help="also centre on the scored prompts' mean")
    parser.add_argument("--by-position", nargs="?", const="prefix,suffix,both", default="",
                        help="instead of centring: the scheme with the rows of the prefix, the suffix or both "
                        "that every prompt shares left unquantised (default: each in turn)")  # fmt: skip
    run_reported(parser, "fp8_centring.py", run, dry_run="the tiny shape, four documents: checks the script")


if __name__ == "__main__":
    main()
