"""How far bf16 scores sit from float32 arithmetic, over many W1-sized sets: genscore against the
official recipe at several batch sizes.

    PYTHONPATH=. python examples/benchmarks/bench_accuracy.py [--sets 4] [--models 2] [--dry-run]

The accuracy target of docs/benchmarks.md compares the max and mean |score - reference| over W1's 256
pairs with the official recipe's in bf16 (batches of 32), where the reference is the official recipe
in float32 arithmetic on the same bf16 weights. A max over 256 pairs is one pair's error, and any
change of rounding moves single pairs: this script puts that figure beside its own spread. For each
random-init model (Qwen3-Reranker-0.6B shape, seeds 0, 1, ...) and each set of one 20-word query and
256 documents of 128-512 words (set 0 is bench_text.py's W1; the others are drawn from later seeds),
it scores:

* the official recipe in float32 (the reference), batches of 32;
* the official recipe in bf16 with batches of 1, 8, 32 and 128 (padding and batch shape change which
  bf16 kernels run, so each batch size is a different rounding of the same recipe);
* genscore's ``rerank`` (text in) with each residual variant of bench_residual.py (one of which is the
  default ``PackedOptions``).

Prints, per scorer: max and mean error on every set, the average over sets, and on how many sets its
max / mean are at most the official recipe's at batch 32. ``--dry-run``: CPU, a tiny model, few
documents. Writes ``$OUT/bench_accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_residual import VARIANTS, rerank_scores  # noqa: E402
from bench_text import (  # noqa: E402
    QWEN3_06B,
    TINY,
    OfficialRecipe,
    TextWork,
    build_model,
    load_tokenizer,
    make_text,
    word_list,
)
from bench_workloads import errors  # noqa: E402

from genscore_core import GenerativeScorer, ScoringEngine  # noqa: E402
from genscore_core.packed import PackedForward, PackedOptions  # noqa: E402

OFFICIAL_BATCHES = (1, 8, 32, 128)
BASELINE = "official bf16, batch 32"


def score_sets(tokenizer: Any, count: int) -> list[TextWork]:
    """Set 0 is bench_text.py's W1 (seed 0, its first draw); set i > 0 is the first draw of seed i."""
    words = word_list(tokenizer)
    docs, lengths = (6, (16, 48)) if DRY else (256, (128, 512))
    return [make_text(random.Random(seed), words, 1, docs, lengths) for seed in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, few documents")
    parser.add_argument("--sets", type=int, default=4, help="score sets per model")
    parser.add_argument("--models", type=int, default=2, help="random-init models (weight seeds)")
    parser.add_argument("--label", default="", help="what is measured (a commit), printed in the header")
    args = parser.parse_args()
    device = torch.device("cpu" if DRY else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    label = f"{args.label}; " if args.label else ""
    header = f"{label}{stamp}; GPU {gpu}; torch {torch.__version__}"
    print(header, flush=True)

    tokenizer = load_tokenizer()
    sets = score_sets(tokenizer, args.sets)
    shape = TINY if DRY else QWEN3_06B
    errs: dict[str, dict[str, tuple[float, float]]] = {}
    for seed in range(args.models):
        model = build_model(shape, device, torch.bfloat16, seed=seed)
        ref_model = build_model(shape, device, torch.float32, seed=seed)
        ref_model.load_state_dict(model.state_dict())  # the same bf16-rounded weights, float32 arithmetic
        official32 = OfficialRecipe(ref_model, tokenizer)
        references = [official32(work.pairs) for work in sets]
        del ref_model, official32
        if not DRY:
            torch.cuda.empty_cache()

        got: dict[str, list[list[float]]] = {}
        official = OfficialRecipe(model, tokenizer)
        for batch in OFFICIAL_BATCHES:
            got[f"official bf16, batch {batch}"] = [official(work.pairs, batch_size=batch) for work in sets]
        del official
        base = GenerativeScorer.from_model(model, tokenizer, forward="packed")
        for name, options in VARIANTS.items():
            chosen = PackedOptions(**options)  # type: ignore[arg-type]
            default = " (the default)" if chosen == PackedOptions() else ""
            forward = PackedForward(model, options=chosen)
            scorer = GenerativeScorer(
                front_end=base.front_end, backend=ScoringEngine(model, forward, base.engine.head)
            )
            runs = 1 if DRY else 3  # the streamed batches' graphs are captured on their second sight
            for _ in range(runs - 1):
                rerank_scores(scorer, sets[0])
            got[f"genscore, {name}{default}"] = [rerank_scores(scorer, work) for work in sets]
        for who, per_set in got.items():
            for index, scores in enumerate(per_set):
                errs.setdefault(who, {})[f"model {seed} set {index}"] = errors(scores, references[index])
        del model, base
        if not DRY:
            torch.cuda.empty_cache()
        print(f"model {seed} done", flush=True)

    report = {"header": header, "errors": errs}
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_accuracy.json").write_text(json.dumps(report, indent=1))
    print(table(report), flush=True)


def table(report: dict[str, Any]) -> str:
    errs = report["errors"]
    names = list(errs[BASELINE])
    lines = [
        report["header"],
        "",
        "|scorer | " + " | ".join(f"{n} max / mean" for n in names) + " | average max / mean | "
        f"sets with max / mean <= {BASELINE} |",
        "|---|" + "---|" * len(names) + "---|---|",
    ]
    base = errs[BASELINE]
    for who, per_set in errs.items():
        cells = [f"{per_set[n][0]:.2e} / {per_set[n][1]:.2e}" for n in names]
        avg_max = statistics.mean(per_set[n][0] for n in names)
        avg_mean = statistics.mean(per_set[n][1] for n in names)
        max_ok = sum(per_set[n][0] <= base[n][0] for n in names)
        mean_ok = sum(per_set[n][1] <= base[n][1] for n in names)
        lines.append(
            f"| {who} | " + " | ".join(cells) + f" | {avg_max:.2e} / {avg_mean:.2e} | "
            f"{max_ok} / {mean_ok} of {len(names)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
