"""The front end alone: ``prepare_pairs`` of fresh text, one query against many distinct queries,
this tree against another checkout in the same run.

    python benchmarks/bench_front_end.py                               # 1,024 pairs, 5 rounds
    python benchmarks/bench_front_end.py --baseline /path/to/old/tree  # an older tree beside it

What it times is the work before any model runs: templating, tokenizing and truncating W2's pairs
(``score_pairs`` builds them the same way, part by part when it streams). 1,024 distinct queries of one
document each were built in 2,048 tokenizer calls of one text until 2026-12-04, one call for all of
them since (docs/benchmarks.md, "Distinct queries"). Each tree runs in its own process (the baseline's
on ``PYTHONPATH``), the two alternating round by round; each process reports the median of ``--calls``
calls on new pairs after one untimed call. The model is the tiny CPU one: it is never run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import Report, Texts, build_model, call_times, load_tokenizer, median, run_reported, word_list

KINDS = ("1 query", "distinct queries")


def child(pairs: int, calls: int) -> None:
    import torch

    from genscore_core import GenerativeScorer

    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    scorer = GenerativeScorer.from_model(build_model("tiny", "cpu", torch.float32), tokenizer)

    def work(kind: str) -> list[tuple[str, str]]:
        if kind == "1 query":
            query = texts.query()
            return [(query, document) for document in texts.documents(pairs)]
        return [(texts.query(), document) for document in texts.documents(pairs)]

    seconds = {}
    for kind in KINDS:
        scorer.prepare_pairs(work(kind))
        fresh = [work(kind) for _ in range(calls)]
        seconds[kind] = median(call_times([lambda p=p: scorer.prepare_pairs(p) for p in fresh]))
    print(json.dumps(seconds))


def run(args: argparse.Namespace, report: Report) -> None:
    pairs, calls, rounds = (32, 1, 1) if args.dry_run else (args.pairs, args.calls, args.rounds)
    trees = {"this tree": str(Path(__file__).resolve().parents[1])}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline).resolve())
    times: dict[str, dict[str, list[float]]] = {tree: {kind: [] for kind in KINDS} for tree in trees}
    for round_number in range(rounds):
        order = list(trees) if round_number % 2 == 0 else list(trees)[::-1]
        for tree in order:
            env = dict(os.environ, PYTHONPATH=trees[tree])
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--pairs", str(pairs), "--calls", str(calls)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            for kind, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                times[tree][kind].append(seconds)
    for kind in KINDS:
        ours = median(times["this tree"][kind])
        base = median(times["baseline"][kind]) if "baseline" in times else None
        rounds_note = "; ".join(
            f"{tree}: {', '.join(f'{s * 1e3:.0f}' for s in times[tree][kind])} ms" for tree in trees
        )
        report.add(
            f"front end, {kind}", f"pairs/s, prepare_pairs of {pairs} new pairs", pairs / ours, "pairs/s",
            pairs / base if base else None, note=f"{ours * 1e3:.0f} ms a call; each round: {rounds_note}",
        )  # fmt: skip


def main() -> None:
    if "--child" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--child", action="store_true")
        parser.add_argument("--pairs", type=int)
        parser.add_argument("--calls", type=int)
        args = parser.parse_args()
        child(args.pairs, args.calls)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1024, help="pairs a call (default 1,024)")
    parser.add_argument("--calls", type=int, default=5, help="timed calls a process (default 5)")
    parser.add_argument("--rounds", type=int, default=5, help="processes of each tree (default 5)")
    parser.add_argument("--baseline", help="another checkout's root, timed in the same run")
    run_reported(parser, "bench_front_end.py", run, dry_run="32 pairs, one round", baseline_name="baseline")


if __name__ == "__main__":
    main()
