"""Small calls and a call's host tail, several source trees in one run: W4 and W1 text in against the
engine alone, and where a W4 call's front end stands.

    OUT=out python examples/benchmarks/bench_small.py --tree main=/path/to/main --tree branch=.
    python examples/benchmarks/bench_small.py --dry-run --tree main=/path/to/main --tree branch=.

Each tree runs in a child process of its own (its ``genscore_core`` first on the path), one after
the other, on bench_text.py's model (random-init Qwen3-Reranker-0.6B shape, bf16, the real Qwen3
tokenizer; ``--dry-run``: a tiny fp32 model on the CPU, for checking this script). Per tree:

* W4: ``rerank(query, 20 texts)`` over profile_small_call.py's four document sets (128-512 words,
  rotated), text in and the engine alone on the same token ids timed in turn (medians, quartiles);
* W1: ``rerank(query, 256 texts)`` (bench_text.py's W1 text), text in and the engine alone in turn;
* the front end alone (``prepare_rerank`` of a W4 set) back to back, and right after an engine
  call has waited for the GPU (the tokenizer's threads idle meanwhile): what a W4 call pays;
* the scores, so that trees can be compared (largest difference).

Prints a table of the trees side by side and writes ``$OUT/bench_small.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(tree: str, out: str, dry: bool) -> None:
    sys.path.insert(0, tree)
    sys.path.insert(0, str(HERE))
    import torch
    from bench_text import QWEN3_06B, TINY, build_model, load_tokenizer, make_text, word_list

    import genscore_core
    from genscore_core import GenerativeScorer

    assert Path(genscore_core.__file__).resolve().is_relative_to(Path(tree).resolve()), genscore_core.__file__
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cpu" if dry else "cuda")

    def sync() -> None:
        if not dry:
            torch.cuda.synchronize()

    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    w1 = make_text(random.Random(0), words, 1, 32 if dry else 256, (128, 512))
    rng = random.Random(4)
    sets = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]
    model = build_model(TINY if dry else QWEN3_06B, device, torch.float32 if dry else torch.bfloat16)
    scorer = GenerativeScorer.from_model(model, tokenizer, forward="packed")
    engine = scorer.backend
    w4_jobs = [scorer.prepare_pairs(w.pairs).jobs for w in sets]
    w1_jobs = scorer.prepare_pairs(w1.pairs).jobs
    report: dict[str, Any] = {"tree": tree, "w4_tokens": [sum(len(p) for p in j[0].prompts) for j in w4_jobs]}

    def w4_text(i: int) -> Any:
        w = sets[i % 4]
        return scorer.rerank(w.queries[0], w.documents[0])

    def w4_engine(i: int) -> Any:
        return engine.score_jobs(w4_jobs[i % 4])

    def w1_text(i: int) -> Any:
        return scorer.rerank(w1.queries[0], w1.documents[0])

    def w1_engine(i: int) -> Any:
        return engine.score_jobs(w1_jobs)

    def in_turn(name: str, text: Any, alone: Any, warmup: int, repeats: int) -> None:
        for i in range(warmup):  # every shape seen twice: its CUDA graph is captured
            text(i)
            alone(i)
        t_text, t_engine = [], []
        for i in range(repeats):
            for fn, acc in ((text, t_text), (alone, t_engine)):
                sync()
                start = time.perf_counter()
                fn(i)
                sync()
                acc.append((time.perf_counter() - start) * 1e3)
        report[f"{name}_text_ms"] = t_text
        report[f"{name}_engine_ms"] = t_engine

    in_turn("w4", w4_text, w4_engine, 8, 6 if dry else 40)
    in_turn("w1", w1_text, w1_engine, 3, 2 if dry else 7)

    front = scorer.front_end
    back_to_back, after_wait = [], []
    for i in range(4 if dry else 24):
        w = sets[i % 4]
        start = time.perf_counter()
        front.prepare_rerank(w.queries[0], w.documents[0])
        back_to_back.append((time.perf_counter() - start) * 1e3)
    for i in range(4 if dry else 24):
        w = sets[i % 4]
        w4_engine(i + 1)
        sync()
        start = time.perf_counter()
        front.prepare_rerank(w.queries[0], w.documents[0])
        after_wait.append((time.perf_counter() - start) * 1e3)
    report["front_end_back_to_back_ms"] = back_to_back
    report["front_end_after_engine_ms"] = after_wait

    # The tokenizer's batch call on W4's 20 bodies (its threads take a document each): in input
    # order, longest first, shortest first, and the longest body alone (a lower bound).
    builder = front._builder
    bodies = [[builder.template.render_body(w.queries[0], d, builder.instruction).text for d in w.documents[0]]
              for w in sets]  # fmt: skip
    fast = tokenizer.backend_tokenizer.encode_batch_fast
    orders = {
        "tokenize_input_order_ms": lambda b: b,
        "tokenize_longest_first_ms": lambda b: sorted(b, key=len, reverse=True),
        "tokenize_shortest_first_ms": lambda b: sorted(b, key=len),
        "tokenize_longest_alone_ms": lambda b: [max(b, key=len)],
    }
    for key, order in orders.items():
        ordered = [order(b) for b in bodies]
        times = []
        for i in range(4 if dry else 32):
            start = time.perf_counter()
            fast(ordered[i % 4], add_special_tokens=False)
            times.append((time.perf_counter() - start) * 1e3)
        report[key] = times

    report["w4_scores"] = [[r.score for r in sorted(w4_text(i), key=lambda r: r.index)] for i in range(4)]
    report["w1_scores"] = [r.score for r in sorted(w1_text(0), key=lambda r: r.index)]
    Path(out, "result.json").write_text(json.dumps(report))


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.2f} ({q[0]:.2f}-{q[2]:.2f})"


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = [
        "| figure (ms, median (quartiles)) | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    rows = [
        ("W4 text in, `rerank` 1 x 20", "w4_text_ms"),
        ("W4 engine alone", "w4_engine_ms"),
        ("W1 text in, `rerank` 1 x 256", "w1_text_ms"),
        ("W1 engine alone", "w1_engine_ms"),
        ("front end of W4, back to back", "front_end_back_to_back_ms"),
        ("front end of W4, right after an engine call", "front_end_after_engine_ms"),
        ("tokenizer batch call, W4's 20 bodies in input order", "tokenize_input_order_ms"),
        ("the same, longest body first", "tokenize_longest_first_ms"),
        ("the same, shortest body first", "tokenize_shortest_first_ms"),
        ("the longest body alone", "tokenize_longest_alone_ms"),
    ]
    for label, key in rows:
        if all(key in results[n] for n in names):
            lines.append(f"| {label} | " + " | ".join(spread(results[n][key]) for n in names) + " |")
    diffs = []
    for key in ("w4_text_ms", "w1_text_ms"):
        cells = []
        for n in names:
            text = statistics.median(results[n][key])
            engine = statistics.median(results[n][key.replace("text", "engine")])
            cells.append(f"{text - engine:.2f} ms, {engine / text:.1%}")
        label = "W4" if key.startswith("w4") else "W1"
        diffs.append(f"| {label} text in minus engine alone, engine / text | " + " | ".join(cells) + " |")
    lines += diffs
    pairs = ["| W1 pairs/s text in (engine) | " + " | ".join(
        f"{256 / statistics.median(results[n]['w1_text_ms']) * 1e3:,.0f} "
        f"({256 / statistics.median(results[n]['w1_engine_ms']) * 1e3:,.0f})" for n in names) + " |"]  # fmt: skip
    return "\n".join(lines + pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.dry_run)
        return
    out = Path(os.environ.get("OUT") or "bench_small_out")
    trees = [spec.split("=", 1) for spec in args.tree] or [["this tree", str(HERE.parent.parent)]]
    results: dict[str, dict[str, Any]] = {}
    for name, tree in trees:
        folder = out / name.replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        paths = [str(Path(tree).resolve()), str(HERE), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        cmd = [sys.executable, __file__, "--child", str(Path(tree).resolve()), str(folder)]
        started = time.perf_counter()
        done = subprocess.run(cmd + (["--dry-run"] if args.dry_run else []), env=env)
        print(f"{name}: {time.perf_counter() - started:.1f} s, exit {done.returncode}", flush=True)
        if done.returncode == 0:
            results[name] = json.loads((folder / "result.json").read_text())
    notes = []
    names = list(results)
    for other in names[1:]:
        a, b = results[names[0]], results[other]
        w4 = max(abs(x - y) for s, t in zip(a["w4_scores"], b["w4_scores"]) for x, y in zip(s, t))
        w1 = max(abs(x - y) for x, y in zip(a["w1_scores"], b["w1_scores"]))
        notes.append(f"scores of {other} against {names[0]}: W4 largest difference {w4:.2e}, W1 {w1:.2e}")
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (dry run)"
    header = (
        f"bench_small {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; GPU {gpu}; {os.cpu_count()} CPUs"
    )
    text = (
        header
        + "\n\n"
        + (table(results) if results else "no tree finished")
        + "\n\n"
        + "\n".join(notes)
        + "\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_small.md").write_text(text)
    (out / "bench_small.json").write_text(json.dumps(results))
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
