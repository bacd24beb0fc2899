"""W1 on the CPU under three thread settings, each in a fresh process, interleaved and repeated.

    python benchmarks/bench_cpu_threads.py                 # 1 x 256 documents, 3 rounds
    python benchmarks/bench_cpu_threads.py --docs 2000     # the issue's 2,000 documents
    python benchmarks/bench_cpu_threads.py --side-by-side 6 --docs 64 --calls 6

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

``--side-by-side N`` instead runs N pairs of processes, ``genscore default`` and ``OMP_NUM_THREADS=1``
at the same time (which one starts first alternates), their timed calls starting together once both
have warmed up: both meet the same load, so the ratio of their times is steadier than that of
processes run one after the other. It reports the median ratio and each pair's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Report, Texts, build_model, call_times, load_tokenizer, median, run_reported, word_list

MODES = ("torch default", "genscore default", "OMP_NUM_THREADS=1")


def child(mode: str, docs: int, calls: int, barrier: str | None) -> None:
    import torch

    from genscore_core import GenerativeScorer

    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    work = (texts.query(), texts.documents(docs))
    model = build_model("cpu", "cpu", torch.float32)
    settings: dict[str, Any] = {"cpu_threads": torch.get_num_threads()} if mode == "torch default" else {}
    scorer = GenerativeScorer.from_model(model, tokenizer, **settings)
    scorer.rerank(*work)
    if barrier:  # side by side: the timed calls start once both processes are ready
        Path(barrier, mode).touch()
        given_up = time.monotonic() + 600  # the other process failed: time alone rather than hang
        while len(list(Path(barrier).iterdir())) < 2 and time.monotonic() < given_up:
            time.sleep(0.01)
    cpu = time.process_time()
    seconds = median(call_times([lambda: scorer.rerank(*work)] * calls))
    cpu = (time.process_time() - cpu) / calls
    print(json.dumps({"seconds": seconds, "cpu": cpu, "threads": torch.get_num_threads()}))


def _environment(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if mode == "OMP_NUM_THREADS=1":
        env["OMP_NUM_THREADS"] = "1"
    return env


def _command(mode: str, docs: int, calls: int) -> list[str]:
    return [sys.executable, __file__, "--child", mode, "--docs", str(docs), "--calls", str(calls)]


def _result(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.strip().splitlines()[-1])


def side_by_side(pairs: int, docs: int, calls: int, report: Report) -> None:
    """``pairs`` pairs of genscore's default and ``OMP_NUM_THREADS=1`` run at the same time."""
    ratios = []
    for pair in range(pairs):
        modes = MODES[1:] if pair % 2 == 0 else MODES[:0:-1]
        with tempfile.TemporaryDirectory() as barrier:
            started = [
                subprocess.Popen(
                    [*_command(mode, docs, calls), "--barrier", barrier],
                    env=_environment(mode),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for mode in modes
            ]
            outputs = [process.communicate() for process in started]
        for process, (_, stderr) in zip(started, outputs):
            if process.returncode:
                raise SystemExit(f"a child failed:\n{stderr}")
        seconds = dict(zip(modes, (_result(stdout)["seconds"] for stdout, _ in outputs)))
        ratios.append(seconds["genscore default"] / seconds["OMP_NUM_THREADS=1"])
        print(
            f"pair {pair + 1}: genscore default {seconds['genscore default']:.2f} s, "
            f"OMP_NUM_THREADS=1 {seconds['OMP_NUM_THREADS=1']:.2f} s a call: {ratios[-1]:.3f}",
            flush=True,
        )
    report.add(
        "W1 CPU side by side", f"genscore default's seconds a call over OMP_NUM_THREADS=1's, 1 x {docs}",
        median(ratios), "x", note=f"median of {pairs} pairs run at the same time; each pair: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}; {os.cpu_count()} cores",
    )  # fmt: skip


def run(args: argparse.Namespace, report: Report) -> None:
    docs, calls, rounds = (8, 1, 1) if args.dry_run else (args.docs, args.calls, args.rounds)
    if args.side_by_side:
        side_by_side(1 if args.dry_run else args.side_by_side, docs, calls, report)
        return
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    threads: dict[str, int] = {}
    for turn in range(rounds):
        shift = turn % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            done = subprocess.run(
                _command(mode, docs, calls),
                env=_environment(mode),
                capture_output=True,
                text=True,
                check=True,
            )
            result = _result(done.stdout)
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
        parser.add_argument("--barrier")
        args = parser.parse_args()
        child(args.child, args.docs, args.calls, args.barrier)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=256, help="documents of a call (default 256)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls in each process (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each setting (default 3)")
    parser.add_argument(
        "--side-by-side", type=int, default=0, metavar="N",
        help="instead: N pairs of genscore's default and OMP_NUM_THREADS=1 run at the same time",
    )  # fmt: skip
    run_reported(
        parser, "bench_cpu_threads.py", run, dry_run="8 documents, one call, one round: checks the script"
    )


if __name__ == "__main__":
    main()
