"""The host's share of one small text call (W4: ``rerank(query, 20 texts)``), step by step, on the CPU.

    PYTHONPATH=<tree> python examples/benchmarks/profile_small_host.py [--repeats 40]

Times each host step of a W4 call on its own (medians over W4's four document sets, bench_text.py's
text and the real Qwen3 tokenizer), in the order a call runs them: the request checks, the tokenizer's
batch call on the 20 bodies, the rest of prompt building, prefix detection and duplicates, batch
planning and layout, the padded host layout a CUDA graph's ``fill`` copies, the scores put back in
input order and ranked. Then the whole front end and the whole text call over a tiny model on the
CPU (whose forward is real work here, unlike on a GPU). What it shows is the host's work, not the
GPU's: read the figures for what each step costs relative to the others, and which ones scale with
cores (only the tokenizer's batch call runs on several threads).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_text import TINY, build_model, load_tokenizer, make_text, word_list

from genscore_core import GenerativeScorer
from genscore_core.engine import distinct_prompts, group_prompts
from genscore_core.frontend import check_pairs
from genscore_core.packed.decoder import host_layout
from genscore_core.packed.graphs import static_shape
from genscore_core.packed.plan import build_batch, plan_batches
from genscore_core.prompts import token_ids
from genscore_core.protocol import check_text
from genscore_core.results import rank_results


def median_ms(fn: Callable[[int], Any], repeats: int) -> float:
    for i in range(4):
        fn(i)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--label", default="tree")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    rng = random.Random(4)
    sets = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]
    model = build_model(TINY, torch.device("cpu"), torch.float32)
    scorer = GenerativeScorer.from_model(model, tokenizer, forward="packed")
    front = scorer.front_end
    builder = front._builder
    engine = scorer.engine
    queries = [w.queries[0] for w in sets]
    documents = [w.documents[0] for w in sets]
    pairs = [[(q, d) for d in docs] for q, docs in zip(queries, documents)]
    bodies = [
        [builder.template.render_body(q, d, builder.instruction) for d in docs]
        for q, docs in zip(queries, documents)
    ]
    texts = [[b.text for b in body] for body in bodies]
    jobs = [front.prepare_pairs(p).jobs for p in pairs]
    groups = [[group_prompts(distinct_prompts(j[0].prompts)[0])] for j in jobs]
    plans = [plan_batches(g, 65536) for g in groups]
    batches = [build_batch(g, p[0]) for g, p in zip(groups, plans)]
    shapes = [static_shape(b, 128) for b in batches]
    scored = [front.prepare_pairs(p).assemble([[0.5] * 20]) for p in pairs]
    n = args.repeats

    def k(i: int) -> int:
        return i % 4

    steps: list[tuple[str, float]] = [
        ("pairs built and checked (check_pairs, 20 pairs)", median_ms(lambda i: check_pairs(pairs[k(i)]), n)),
        ("check_text of the 20 documents again (encode)", median_ms(
            lambda i: [check_text(d, "documents", x) for x, d in enumerate(documents[k(i)])], n)),
        ("PairStream built (stream_pairs, then unused)", median_ms(lambda i: front.stream_pairs(pairs[k(i)]), n)),
        ("bodies rendered (render_body x 20)", median_ms(
            lambda i: [builder.template.render_body(queries[k(i)], d, builder.instruction) for d in documents[k(i)]], n)),
        ("tokenizer batch call (encode_batch_fast, 20 bodies)", median_ms(
            lambda i: token_ids(tokenizer, texts[k(i)], builder._lock), n)),
        ("builder.build whole (bounded, render, tokenize, fit)", median_ms(
            lambda i: builder.build(queries[k(i)], documents[k(i)]), n)),
        ("front end whole (prepare_pairs)", median_ms(lambda i: front.prepare_pairs(pairs[k(i)]), n)),
        ("duplicates (distinct_prompts)", median_ms(lambda i: distinct_prompts(jobs[k(i)][0].prompts), n)),
        ("shared prefix (group_prompts)", median_ms(lambda i: group_prompts(jobs[k(i)][0].prompts), n)),
        ("plan_batches", median_ms(lambda i: plan_batches(groups[k(i)], 65536), n)),
        ("build_batch", median_ms(lambda i: build_batch(groups[k(i)], plans[k(i)][0]), n)),
        ("static_shape", median_ms(lambda i: static_shape(batches[k(i)], 128), n)),
        ("host_layout padded (graph fill)", median_ms(lambda i: host_layout(batches[k(i)], shapes[k(i)]), n)),
        ("assemble + rank_results (20)", median_ms(
            lambda i: rank_results(queries[k(i)], documents[k(i)], scored[k(i)]), n)),
        ("text call whole (tiny model, CPU)", median_ms(lambda i: scorer.rerank(queries[k(i)], documents[k(i)]), n)),
        ("engine alone (tiny model, CPU)", median_ms(lambda i: engine.score_jobs(jobs[k(i)]), n)),
    ]  # fmt: skip
    tokens = [sum(len(p) for p in j[0].prompts) for j in jobs]
    print(f"{args.label}: W4 host steps, medians of {n} (ms); prompt tokens {tokens}")
    for name, ms in steps:
        print(f"  {ms:8.3f}  {name}")


if __name__ == "__main__":
    main()
