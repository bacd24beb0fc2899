"""The tokenizer's batch call on whole texts against the same texts in pieces (no GPU needed).

    PYTHONPATH=. python examples/benchmarks/bench_token_pieces.py [--repeats 40]

Texts as the front end builds them (Qwen3-Reranker's body: instruction, query, document; the real
Qwen3 tokenizer; bench_text.py's words): W4's four sets of 20 documents (profile_small_call.py's),
the first part of a streamed W1 call (its first 10 documents, about 24k characters) and all of W1's
256. Each is tokenized whole (``prompts.token_ids``) and in pieces (``prompts.token_ids_in_pieces``)
in turn, back to back and after a pause like a small call's GPU wait (the tokenizer's threads go
idle meanwhile); the ids are checked equal. Medians and quartiles in ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from bench_text import load_tokenizer, make_text, word_list

from genscore_core.prompts import token_ids, token_ids_in_pieces
from genscore_core.templates import QWEN3_RERANKER


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.2f} ({q[0]:.2f}-{q[2]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--pause-ms", type=float, default=13.0, help="idle time before the paused calls")
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    lock = threading.Lock()

    def bodies(query: str, documents: list[str]) -> list[str]:
        return [QWEN3_RERANKER.render_body(query, d).text for d in documents]

    rng = random.Random(4)
    w4 = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]
    w1 = make_text(random.Random(0), words, 1, 256, (128, 512))
    workloads = {
        "W4 (20 documents)": [bodies(w.queries[0], w.documents[0]) for w in w4],
        "W1 first part (10 documents)": [bodies(w1.queries[0], w1.documents[0][:10])],
        "W1 (256 documents)": [bodies(w1.queries[0], w1.documents[0])],
    }
    print(f"{os.cpu_count()} CPUs; medians (quartiles), ms")
    print("| texts | pause | whole | pieces |\n|---|---|---:|---:|")
    for name, sets in workloads.items():
        repeats = args.repeats if len(sets[0]) < 100 else max(4, args.repeats // 8)
        for pause in (0.0, args.pause_ms / 1e3):
            times: dict[str, list[float]] = {"whole": [], "pieces": []}
            calls: dict[str, Callable[[list[str]], Any]] = {
                "whole": lambda t: token_ids(tokenizer, t, lock),
                "pieces": lambda t: token_ids_in_pieces(tokenizer, t, lock),
            }
            for i in range(repeats + 2):
                texts = sets[i % len(sets)]
                got = []
                for kind, call in calls.items():
                    if pause:
                        time.sleep(pause)
                    start = time.perf_counter()
                    got.append(call(texts))
                    if i >= 2:
                        times[kind].append((time.perf_counter() - start) * 1e3)
                assert got[0] == got[1], "pieces must give the ids of the whole texts"
            label = f"after {pause * 1e3:.0f} ms idle" if pause else "back to back"
            print(f"| {name} | {label} | {spread(times['whole'])} | {spread(times['pieces'])} |", flush=True)


if __name__ == "__main__":
    main()
