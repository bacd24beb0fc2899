"""How much of a W1 / W4 call the Python garbage collector takes, and what freezing it changes.

    PYTHONPATH=. python examples/benchmarks/probe_gc.py [--rounds 12] [--dry-run]

bench_text.py's model (random-init Qwen3-Reranker-0.6B shape, bf16, real tokenizer) and texts (W1: one
query and 256 documents; W4: four sets of 20). After warm-up calls (every CUDA graph captured), rounds
of W1 text in (``rerank``), W1 engine alone (token ids) and W4 text in, in turn, under three settings
one after the other, then the first again:

* ``default``: the collector as the process has it;
* ``frozen``: ``gc.collect(); gc.freeze()`` once before the rounds (what vLLM and SGLang do after
  start-up: objects alive then, the model and tokenizer among them, are never walked again);
* ``disabled``: ``gc.disable()`` during the rounds (a bound, not a setting anyone should ship).

``gc.callbacks`` time every collection, by generation, so each call's time spent collecting is read
directly. Prints per setting: medians and ranges of each call, collections per call by generation and
their milliseconds per call; the number of objects the collector tracks. ``--dry-run``: CPU, tiny model.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_text import QWEN3_06B, TINY, build_model, load_tokenizer, make_text, word_list  # noqa: E402

from genscore_core import GenerativeScorer  # noqa: E402


class CollectorClock:
    """Milliseconds spent in collections of each generation since the last :meth:`take`."""

    def __init__(self) -> None:
        self.started = 0.0
        self.ms = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            generation = info["generation"]
            self.ms[generation] += (time.perf_counter() - self.started) * 1e3
            self.count[generation] += 1

    def take(self) -> tuple[list[float], list[int]]:
        got = (self.ms, self.count)
        self.ms, self.count = [0.0, 0.0, 0.0], [0, 0, 0]
        return got


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    device = torch.device("cpu" if DRY else "cuda")
    rounds = 2 if DRY else args.rounds
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    rng = random.Random(0)
    docs, lengths = (8, (16, 48)) if DRY else (256, (128, 512))
    w1 = make_text(rng, words, 1, docs, lengths)
    w4 = [make_text(rng, words, 1, 20 if not DRY else 4, lengths) for _ in range(4)]
    model = build_model(TINY if DRY else QWEN3_06B, device, torch.bfloat16)
    scorer = GenerativeScorer.from_model(model, tokenizer, **({"forward": "packed"} if DRY else {}))
    jobs = scorer.prepare_pairs(w1.pairs).jobs
    turn = {"i": 0}

    def w4_call() -> Any:
        turn["i"] += 1
        work = w4[turn["i"] % 4]
        return scorer.rerank(work.queries[0], work.documents[0])

    calls: dict[str, Callable[[], Any]] = {
        "W1 text in": lambda: scorer.rerank(w1.queries[0], w1.documents[0]),
        "W1 engine alone": lambda: scorer.backend.score_jobs(jobs),
        "W4 text in": w4_call,
    }
    for _ in range(3):  # eager, capture, replay of every shape
        for name, call in calls.items():
            for _ in range(4 if name == "W4 text in" else 1):
                call()
    sync()
    clock = CollectorClock()
    results: list[tuple[str, str, list[float], list[float], list[float]]] = []
    for setting in ("default", "frozen", "disabled", "default again"):
        if setting == "frozen":
            gc.collect()
            gc.freeze()
        if setting == "disabled":
            gc.unfreeze()
            gc.disable()
        if setting == "default again":
            gc.enable()
        tracked = len(gc.get_objects())
        times: dict[str, list[float]] = {n: [] for n in calls}
        gc_ms: dict[str, list[float]] = {n: [] for n in calls}
        gen2: dict[str, list[float]] = {n: [] for n in calls}
        clock.take()
        for _ in range(rounds):
            for name, call in calls.items():
                for _ in range(4 if name == "W4 text in" else 1):
                    sync()
                    start = time.perf_counter()
                    call()
                    sync()
                    times[name].append((time.perf_counter() - start) * 1e3)
                    ms, count = clock.take()
                    gc_ms[name].append(sum(ms))
                    gen2[name].append(count[2])
        for name in calls:
            results.append((setting, name, times[name], gc_ms[name], gen2[name]))
        print(
            f"{setting}: the collector tracks {tracked:,} objects, {gc.get_freeze_count():,} frozen",
            flush=True,
        )
    gc.unfreeze()
    gc.enable()
    print("| setting | call | median ms | range ms | collecting ms per call (mean, max) | full collections |")
    print("|---|---|---:|---:|---:|---:|")
    for setting, name, t, g, g2 in results:
        print(
            f"| {setting} | {name} | {statistics.median(t):.1f} | {min(t):.1f}-{max(t):.1f} | "
            f"{statistics.mean(g):.2f}, {max(g):.2f} | {int(sum(g2))} in {len(t)} calls |"
        )


if __name__ == "__main__":
    main()
