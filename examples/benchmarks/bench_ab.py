"""Engine W1 and W4 of whatever ``genscore_core`` is importable: one side of an A/B comparison.

    PYTHONPATH=OLD_CHECKOUT python examples/benchmarks/bench_ab.py --label old
    PYTHONPATH=NEW_CHECKOUT python examples/benchmarks/bench_ab.py --label new

Run both sides alternately in one session on one GPU (``docs/benchmarks.md``, "Before and after the
kernel/forward restructuring"). Token-id prompts go straight to the scoring engine, so the same
script runs on code from before and after the engine's constructor changed: a random-init model of the
Qwen3-Reranker-0.6B shape in bf16, W1 = one query and 256 documents of 128-512 tokens after a
110-token shared part (plus a 12-token suffix), W4 = one query and 20 such documents. Prints one
JSON line: median seconds per engine call and the pairs per second it means.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from genscore_core import ScorerConfig, ScoringEngine, ScoringJob
from genscore_core.engine import select_forward
from genscore_core.scoring import LabelHead

YES, NO = 9693, 2152
QWEN3_06B = dict(
    vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
)  # fmt: skip


def engine_for(model: Any) -> Any:
    """The default engine, through whichever constructor this version of the code has."""
    if hasattr(ScoringEngine, "for_model"):
        return ScoringEngine.for_model(model, ScorerConfig(), pad_token_id=0)
    return ScoringEngine(select_forward(model, ScorerConfig(), 0), LabelHead(model))  # type: ignore[call-arg]


def job(rng: random.Random, docs: int) -> ScoringJob:
    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, 150000) for _ in range(n)]

    shared, suffix = ids(110), ids(12)
    return ScoringJob([shared + ids(rng.randint(128, 512)) + suffix for _ in range(docs)], [YES, NO])


def median_seconds(engine: Any, jobs: list[ScoringJob], repeats: int) -> tuple[float, list[float]]:
    for _ in range(2):  # warm-up: kernel compilation, allocator
        engine.score_jobs(jobs)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.score_jobs(jobs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--w1-repeats", type=int, default=7)
    parser.add_argument("--w4-repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_06B)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    engine = engine_for(model)
    rng = random.Random(0)
    w1, w4 = job(rng, 256), job(rng, 20)
    t1, times1 = median_seconds(engine, [w1], args.w1_repeats)
    t4, times4 = median_seconds(engine, [w4], args.w4_repeats)
    scores = engine.score_jobs([w4])[0][:3]
    print(
        json.dumps(
            {
                "label": args.label,
                "forward": type(engine.forward).__name__,
                "w1_ms": t1 * 1e3,
                "w1_pairs_per_s": 256 / t1,
                "w4_ms": t4 * 1e3,
                "w1_times_ms": [round(t * 1e3, 2) for t in times1],
                "w4_times_ms": [round(t * 1e3, 2) for t in times4],
                "w4_first_scores": scores,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
