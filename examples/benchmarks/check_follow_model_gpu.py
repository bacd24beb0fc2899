"""On a GPU: a scorer follows its model when the model moves to the GPU or gets other weights after the build.

    PYTHONPATH=. GENSCORE_TOKENIZER_DIR=DIR python examples/benchmarks/check_follow_model_gpu.py

The CPU tests (``tests/test_follow_model.py``) cover casts and ``load_state_dict``; a move between
devices and the CUDA graphs that a rebuild must drop need a GPU. A random Qwen3 (the 0.6B's layer
shape, 4 layers, the real vocabulary and tokenizer, bf16) scores 20 real-word pairs three times (the
second call captures the batch's graph, the third replays it) in each case:

* **moved**: scorer built on the CPU, then ``model.to("cuda")``;
* **fresh**: a scorer built on the GPU from the same weights (what "moved" must equal);
* **swapped**: the fresh scorer, graphs captured, then ``load_state_dict(other, assign=True)``
  with the weights of another seed; it must score as a scorer built on those weights does
  (**fresh other**), not as it did before.

Each is also compared with the model card's recipe (``bench_text.OfficialRecipe``) on the model as it
is; those differences are bf16 noise (~1e-2). Exits 1 if a case differs from its expectation by more
than ``--atol``. ``--dry-run`` runs on the CPU only (no move; the swap after two calls).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_text import QWEN3_06B, TINY, OfficialRecipe, build_model, load_tokenizer, word_list

from genscore_core import GenerativeScorer

SHAPE = {**QWEN3_06B, "num_hidden_layers": 4}


def pairs_of(tokenizer: Any, count: int = 20, seed: int = 0) -> list[tuple[str, str]]:
    words = word_list(tokenizer)
    rng = random.Random(seed)
    query = " ".join(rng.choices(words, k=20))
    return [(query, " ".join(rng.choices(words, k=rng.randrange(60, 200)))) for _ in range(count)]


def three_calls(scorer: GenerativeScorer, pairs: list[tuple[str, str]]) -> list[float]:
    """The third call's scores, after checking that all three agree (eager, capture, replay)."""
    calls = [scorer.score_pairs(pairs) for _ in range(3)]
    spread = max(abs(a - b) for call in calls[1:] for a, b in zip(call, calls[0], strict=True))
    if spread > 1e-6:
        raise SystemExit(f"the three calls of one scorer differ by {spread:.2e}")
    return calls[2]


def largest_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--dry-run", action="store_true", help="CPU only, tiny shape")
    args = parser.parse_args()
    gpu = torch.device("cpu" if args.dry_run else "cuda")
    shape = TINY if args.dry_run else SHAPE
    tokenizer = load_tokenizer()
    pairs = pairs_of(tokenizer)
    rows: list[tuple[str, float, float]] = []

    # Every model is initialised on the CPU and copied: the CPU and CUDA generators draw other
    # numbers from the same seed, so "the same weights" must be the same tensors, moved.
    def weights(seed: int) -> Any:
        return build_model(shape, torch.device("cpu"), torch.bfloat16, seed=seed)

    first, second = weights(0), weights(1)
    fresh_model = copy.deepcopy(first).to(gpu)
    fresh = three_calls(GenerativeScorer.from_model(fresh_model, tokenizer), pairs)
    if not args.dry_run:
        moved_model = copy.deepcopy(first)
        scorer = GenerativeScorer.from_model(moved_model, tokenizer)
        scorer.score_pairs(pairs[:4])
        moved_model.to(gpu)
        moved = three_calls(scorer, pairs)
        official = OfficialRecipe(moved_model, tokenizer)(pairs)
        rows.append(("moved to the GPU after the build vs fresh", largest_difference(moved, fresh),
                     largest_difference(moved, official)))  # fmt: skip

    swapped_scorer = GenerativeScorer.from_model(fresh_model, tokenizer)
    three_calls(swapped_scorer, pairs)  # graphs captured on the first weights
    fresh_other = three_calls(GenerativeScorer.from_model(copy.deepcopy(second).to(gpu), tokenizer), pairs)
    fresh_model.load_state_dict(copy.deepcopy(second).to(gpu).state_dict(), assign=True)
    swapped = three_calls(swapped_scorer, pairs)
    official = OfficialRecipe(fresh_model, tokenizer)(pairs)
    rows.append(("other weights assigned after graphs vs fresh other", largest_difference(swapped, fresh_other),
                 largest_difference(swapped, official)))  # fmt: skip
    rows.append(
        (
            "(before the swap vs fresh other: must be large)",
            largest_difference(fresh, fresh_other),
            float("nan"),
        )
    )

    device = torch.cuda.get_device_name() if gpu.type == "cuda" else "cpu"
    print(f"{device}; torch {torch.__version__}; {len(pairs)} pairs; atol {args.atol}")
    print("| case | vs expected | vs official recipe |\n|---|---:|---:|")
    for name, expected, official_diff in rows:
        print(f"| {name} | {expected:.2e} | {official_diff:.2e} |")
    out = os.environ.get("OUT")
    if out:
        Path(out, "check_follow_model_gpu.json").write_text(json.dumps(rows, indent=1))
    failed = [name for name, expected, _ in rows[:-1] if expected > args.atol]
    if rows[-1][1] <= args.atol:
        failed.append("the two seeds score alike: the check cannot tell them apart")
    if failed:
        raise SystemExit(f"FAILED: {failed}")


if __name__ == "__main__":
    main()
