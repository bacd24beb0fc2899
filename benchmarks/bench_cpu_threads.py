"""W1 on the CPU under three thread settings, each in a fresh process, interleaved and repeated.

    python benchmarks/bench_cpu_threads.py                 # 1 x 256 documents, 3 rounds
    python benchmarks/bench_cpu_threads.py --docs 2000     # the issue's 2,000 documents

* ``torch default``: torch's own thread count (one per core of the machine), given as ``cpu_threads``
  so that genscore keeps it: what genscore did before it chose;
* ``genscore default``: no setting (``genscore_core.cpu_threads``);
* ``OMP_NUM_THREADS=1``: the environment variable, which genscore leaves alone.

The model is ``bench_text.py --cpu``'s (the real Qwen3 vocabulary, hidden 256, 4 layers, fp32); each
process times ``rerank`` of one query and ``--docs`` documents of 128-512 words, text in, after one
untimed call, and reports the median of ``--calls`` calls and the CPU seconds the process spent a call
(all its threads; on a machine shared with other jobs the wall time also holds the time its threads
waited for a core, which the CPU seconds do not).

Each round runs the settings in a turned order (the first of one round is the last of the next): on a
shared machine whose load rises or falls during the run, a fixed order hands one setting the quieter
moments every round (docs/benchmarks.md, "CPU threads").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from common import Report, Texts, build_model, call_times, load_tokenizer, median, run_reported, word_list

MODES = ("torch default", "genscore default", "OMP_NUM_THREADS=1")


def child(mode: str, docs: int, calls: int) -> None:
    import torch

    from genscore_core import GenerativeScorer

    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    work = (texts.query(), texts.documents(docs))
    model = build_model("cpu", "cpu", torch.float32)
    settings: dict[str, Any] = {"cpu_threads": torch.get_num_threads()} if mode == "torch default" else {}
    scorer = GenerativeScorer.from_model(model, tokenizer, **settings)
    scorer.rerank(*work)
    cpu = time.process_time()
    seconds = median(call_times([lambda: scorer.rerank(*work)] * calls))
    cpu = (time.process_time() - cpu) / calls
    print(json.dumps({"seconds": seconds, "cpu": cpu, "threads": torch.get_num_threads()}))


def run(args: argparse.Namespace, report: Report) -> None:
    docs, calls, rounds = (8, 1, 1) if args.dry_run else (args.docs, args.calls, args.rounds)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    threads: dict[str, int] = {}
    for turn in range(rounds):
        shift = turn % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
            if mode == "OMP_NUM_THREADS=1":
                env["OMP_NUM_THREADS"] = "1"
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--docs", str(docs), "--calls", str(calls)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            result = json.loads(done.stdout.strip().splitlines()[-1])
            times[mode].append(result["seconds"])
            cpu[mode].append(result["cpu"])
            threads[mode] = result["threads"]
            print(
                f"round {turn + 1}, {mode}: {result['seconds']:.2f} s a call, {result['cpu']:.2f} CPU s",
                flush=True,
            )
    one = median(times["OMP_NUM_THREADS=1"])
    for mode in MODES:
        seconds = median(times[mode])
        report.add(
            f"W1 CPU, {mode}", f"seconds a call, 1 x {docs}", seconds, "s",
            note=f"{threads[mode]} torch threads, {os.cpu_count()} cores; {seconds / one:.2f}x OMP_NUM_THREADS=1's; "
            f"each round: {', '.join(f'{t:.2f}' for t in times[mode])} s; CPU seconds a call "
            f"{median(cpu[mode]):.2f} (each round: {', '.join(f'{t:.2f}' for t in cpu[mode])})",
        )  # fmt: skip


def main() -> None:
    if "--child" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--child", choices=MODES)
        parser.add_argument("--docs", type=int)
        parser.add_argument("--calls", type=int)
        args = parser.parse_args()
        child(args.child, args.docs, args.calls)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=256, help="documents of a call (default 256)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls in each process (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each setting (default 3)")
    run_reported(parser, "cpu_threads.py", run, dry_run="8 documents, one call, one round: checks the script")


if __name__ == "__main__":
    main()
