"""Two ways of keeping the residual stream, side by side: engine speed and scores, one process.

    PYTHONPATH=. python examples/benchmarks/bench_residual.py [--variants float32,model] [--dry-run]

The variants (``VARIANTS``; the first named is the baseline): "float32", the float32 stream (the
default); "model", the stream in the model's dtype (``residual_dtype="model"``). Until bd7b74e was
reverted there was a third, "matmul": the o and down products added into the float32 stream by the
product itself (``torch.addmm`` with ``out_dtype``; docs/benchmarks.md, "Products added in the
matmul").

A random-init Qwen3-Reranker-0.6B shape in bf16 and the real Qwen3 tokenizer, with bench_text.py's
text workloads drawn the same way (seed 0: W1 = one query and 256 documents of 128-512 words, W4 = four
sets of one query and 20 documents). Two engines over the same weights, built alike but for the two
variants' options. In one process:

* **scores**: W1 and each W4 set through ``rerank`` with each engine, and through the official
  Qwen3-Reranker recipe in bf16, each against the official recipe in float32 arithmetic on the same
  (bf16-rounded) weights: max and mean |score - reference| (the accuracy target of docs/benchmarks.md);
* **engine alone**: the same prompts as token-id jobs (``prepare_pairs``), calls alternating between
  the two engines (ABBA order), medians and the paired differences; W1 (the balanced batches of
  ``score_jobs``, eager) and W4 (rotating over the four sets, CUDA graphs of small batches);
* **text in**: W1 through ``rerank`` with each engine alternating (the streamed path, CUDA graphs of
  large batches);
* per engine: graph captures, replays and eager batches over the timed calls, the memory reserved by
  warming it up (its graphs' pool), the peak of a W1 text-in call beyond what was allocated before, and
  kernel time by kind over one profiled W1 engine call.

``--dry-run`` runs the same code on the CPU (a tiny bf16 model, torch kernels, few documents) to check
the script. Prints the tables last and writes ``$OUT/bench_residual.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_gated_mlp import kernel_times  # noqa: E402
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
from bench_workloads import errors, peak_beyond  # noqa: E402

from genscore_core import GenerativeScorer, ScoringEngine  # noqa: E402
from genscore_core.packed import PackedForward, PackedOptions  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "float32": {"residual_dtype": "float32"},
    "model": {"residual_dtype": "model"},
}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def workloads(tokenizer: Any) -> tuple[TextWork, list[TextWork]]:
    """bench_text.py's W1 and W4 texts: the same generator, drawn in the same order (W2's two sets
    are drawn and dropped in between, so that W4's sets are bench_text's too)."""
    words = word_list(tokenizer)
    rng = random.Random(0)
    if DRY:  # the official recipe's full-vocabulary logits are slow on the CPU: a few short texts
        return make_text(rng, words, 1, 6, (16, 48)), [
            make_text(rng, words, 1, 3, (16, 48)) for _ in range(4)
        ]
    w1 = make_text(rng, words, 1, 256, (128, 512))
    make_text(rng, words, 16, 64, (128, 512))
    make_text(rng, words, 64, 100, (128, 512))
    w4 = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]
    return w1, w4


def rerank_scores(scorer: GenerativeScorer, work: TextWork) -> list[float]:
    """Scores in input order from ``rerank`` (what users call)."""
    got = [0.0] * len(work.documents[0])
    for r in scorer.rerank(work.queries[0], work.documents[0]):
        got[r.index] = r.score
    return got


def alternate(calls: dict[str, Callable[[int], Any]], pairs: int) -> dict[str, Any]:
    """Seconds of each call, alternating A B B A ..., and the paired differences (second - first)."""
    a, b = calls
    times: dict[str, list[float]] = {a: [], b: []}
    for i in range(pairs):
        for name in (a, b) if i % 2 == 0 else (b, a):
            sync()
            start = time.perf_counter()
            calls[name](i)
            sync()
            times[name].append(time.perf_counter() - start)
    diffs = [tb - ta for ta, tb in zip(times[a], times[b])]
    return {
        "median_ms": {n: statistics.median(t) * 1e3 for n, t in times.items()},
        "times_ms": {n: [round(x * 1e3, 3) for x in t] for n, t in times.items()},
        "paired_diff_median_ms": statistics.median(diffs) * 1e3,
        "paired_diff_ms": [round(d * 1e3, 3) for d in diffs],
        "paired_faster": sum(d < 0 for d in diffs),
        "pairs": pairs,
    }


def graph_counts(engine: ScoringEngine) -> dict[str, int]:
    forward = engine.forward
    assert isinstance(forward, PackedForward)
    graphs = forward.graphs
    return {
        "eager_batches": forward.eager_batches,
        "captures": graphs.captures if graphs is not None else 0,
        "replays": graphs.replays if graphs is not None else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny bf16 model, few documents")
    parser.add_argument("--w1-pairs", type=int, default=16, help="alternating pairs of W1 calls")
    parser.add_argument("--w4-pairs", type=int, default=60, help="alternating pairs of W4 calls")
    parser.add_argument("--label", default="", help="what is measured (a commit), printed in the header")
    parser.add_argument(
        "--variants", default="float32,model", help=f"baseline,candidate among {', '.join(VARIANTS)}"
    )
    args = parser.parse_args()
    variants = args.variants.split(",")
    if len(variants) != 2 or not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: two of {', '.join(VARIANTS)}, comma-separated")
    device = torch.device("cpu" if DRY else "cuda")
    w1_pairs, w4_pairs = (2, 4) if DRY else (args.w1_pairs, args.w4_pairs)
    torch.backends.cuda.matmul.allow_tf32 = False
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    label = f"{args.label}; " if args.label else ""
    report: dict[str, Any] = {"header": f"{label}{stamp}; GPU {gpu}; torch {torch.__version__}"}
    print(report["header"], flush=True)

    tokenizer = load_tokenizer()
    w1, w4 = workloads(tokenizer)
    shape = TINY if DRY else QWEN3_06B
    model = build_model(shape, device, torch.bfloat16)
    sets = {"W1": w1, **{f"W4 set {i}": w for i, w in enumerate(w4)}}

    # The accuracy reference: the official recipe in fp32 arithmetic on the same (rounded) weights.
    ref_model = build_model(shape, device, torch.float32)
    ref_model.load_state_dict(model.state_dict())
    official32 = OfficialRecipe(ref_model, tokenizer)
    reference = {name: official32(w.pairs) for name, w in sets.items()}
    del ref_model, official32
    if not DRY:
        torch.cuda.empty_cache()
    official = OfficialRecipe(model, tokenizer)
    scores: dict[str, dict[str, list[float]]] = {
        "official bf16": {n: official(w.pairs) for n, w in sets.items()}
    }

    base = GenerativeScorer.from_model(model, tokenizer, forward="packed")
    rerank_scores(base, w1)  # kernels compiled, workspaces allocated before the memory is read below
    scorers: dict[str, GenerativeScorer] = {}
    engines: dict[str, ScoringEngine] = {}
    reserved: dict[str, float] = {}
    report["variants"] = {}
    for residual in variants:
        sync()
        if not DRY:  # cached blocks of earlier work (the official recipe's logits) would be counted
            torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved() if not DRY else 0
        forward = PackedForward(model, options=PackedOptions(**VARIANTS[residual]))  # type: ignore[arg-type]
        decoder = forward.decoder
        report["variants"][residual] = {
            "options": VARIANTS[residual],
            "residual_dtype": str(decoder.residual_dtype),
        }
        print(residual, report["variants"][residual], flush=True)
        engine = ScoringEngine(model, forward, base.engine.head)
        scorer = GenerativeScorer(front_end=base.front_end, backend=engine)
        for _ in range(3):  # compile, then each shape's capture on its second sight
            rerank_scores(scorer, w1)
            for w in w4:
                rerank_scores(scorer, w)
        sync()
        reserved[residual] = ((torch.cuda.memory_reserved() if not DRY else 0) - before) / 2**30
        engines[residual], scorers[residual] = engine, scorer
        scores[residual] = {name: rerank_scores(scorer, w) for name, w in sets.items()}
    del base

    # Scores: each against the fp32 official recipe, per set.
    accuracy: dict[str, dict[str, tuple[float, float]]] = {
        who: {name: errors(got[name], reference[name]) for name in sets} for who, got in scores.items()
    }
    base_name, candidate = variants
    accuracy["candidate vs baseline (score diff)"] = {
        name: errors(scores[candidate][name], scores[base_name][name]) for name in sets
    }
    report["accuracy"] = accuracy
    print(json.dumps({"accuracy": accuracy}), flush=True)

    # The same prompts as token-id jobs (eager batches, not streamed) score as rerank did (streamed,
    # the graphs of large and small batches on CUDA), with either residual.
    w1_jobs = scorers[base_name].prepare_pairs(w1.pairs).jobs
    w4_jobs = [scorers[base_name].prepare_pairs(w.pairs).jobs for w in w4]
    report["rerank_vs_score_jobs_max_diff"] = {
        r: max(
            max(abs(a - b) for a, b in zip(e.score_jobs(jobs)[0], scores[r][name]))
            for name, jobs in (("W1", w1_jobs), *((f"W4 set {i}", j) for i, j in enumerate(w4_jobs)))
        )
        for r, e in engines.items()
    }

    # Speed: engine alone (token ids) on W1 and W4, text in on W1; the two engines alternate.
    counts_before = {r: graph_counts(e) for r, e in engines.items()}
    speed: dict[str, Any] = {}
    speed["W1 engine alone"] = alternate(
        {r: (lambda i, e=e: e.score_jobs(w1_jobs)) for r, e in engines.items()}, w1_pairs
    )
    speed["W4 engine alone"] = alternate(
        {r: (lambda i, e=e: e.score_jobs(w4_jobs[i % 4])) for r, e in engines.items()}, w4_pairs
    )
    speed["W1 text in"] = alternate(
        {r: (lambda i, s=s: s.rerank(w1.queries[0], w1.documents[0])) for r, s in scorers.items()}, w1_pairs
    )
    counts_after = {r: graph_counts(e) for r, e in engines.items()}
    report["speed"] = speed
    report["tokens"] = {
        "W1": sum(len(p) for j in w1_jobs for p in j.prompts),
        "W4": [sum(len(p) for j in jobs for p in j.prompts) for jobs in w4_jobs],
    }
    report["graphs_during_timing"] = {
        r: {k: counts_after[r][k] - counts_before[r][k] for k in counts_after[r]} for r in engines
    }
    report["reserved_by_warm_up_gib"] = reserved
    report["w1_text_peak_beyond_gib"] = {
        r: peak_beyond(lambda s=s: s.rerank(w1.queries[0], w1.documents[0])) for r, s in scorers.items()
    }
    if not DRY:
        report["w1_engine_kernels_ms"] = {
            r: kernel_times(lambda e=e: e.score_jobs(w1_jobs)) for r, e in engines.items()
        }
    report["rule"] = rule(report, list(sets), candidate)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_residual.json").write_text(json.dumps(report, indent=1))
    print(tables(report, list(sets), variants), flush=True)


def rule(report: dict[str, Any], names: Sequence[str], candidate: str) -> dict[str, Any]:
    """The decision rule fixed before the measurements (docs/benchmarks.md, "Residual stream in the
    model's dtype" and "Products added in the matmul"): the candidate's max and mean error <= the
    official bf16 recipe's on every score set, and W1 engine alone faster (median paired difference
    < 0, >= 2/3 of the pairs)."""
    acc = report["accuracy"]
    accuracy_ok = all(
        acc[candidate][n][0] <= acc["official bf16"][n][0]
        and acc[candidate][n][1] <= acc["official bf16"][n][1]
        for n in names
    )
    w1 = report["speed"]["W1 engine alone"]
    faster = w1["paired_diff_median_ms"] < 0 and 3 * w1["paired_faster"] >= 2 * w1["pairs"]
    return {"accuracy_ok": accuracy_ok, "faster": faster, "switch_default": accuracy_ok and faster}


def tables(report: dict[str, Any], names: Sequence[str], variants: Sequence[str]) -> str:
    acc = report["accuracy"]
    a, b = variants
    lines = [
        report["header"],
        f"variants: {report['variants']}",
        "",
        f"|score set | official bf16 max / mean | {a} max / mean | {b} max / mean | "
        f"{b} <= official (max, mean) | {b} vs {a}: max / mean diff |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        o, f, m = acc["official bf16"][name], acc[a][name], acc[b][name]
        d = acc["candidate vs baseline (score diff)"][name]
        lines.append(
            f"| {name} | {o[0]:.2e} / {o[1]:.2e} | {f[0]:.2e} / {f[1]:.2e} | {m[0]:.2e} / {m[1]:.2e} | "
            f"{m[0] <= o[0]}, {m[1] <= o[1]} | {d[0]:.1e} / {d[1]:.1e} |"
        )
    lines += [
        "",
        f"| workload | {a} median ms | {b} median ms | {b} / {a} | paired diff median ms | pairs {b} faster |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in report["speed"].items():
        f, m = s["median_ms"][a], s["median_ms"][b]
        lines.append(
            f"| {name} | {f:.2f} | {m:.2f} | {m / f:.3f} | {s['paired_diff_median_ms']:+.2f} | "
            f"{s['paired_faster']}/{s['pairs']} |"
        )
    lines += [
        "",
        f"decision rule: {report['rule']}",
        f"prompt tokens (a shared prefix counted in each prompt): {report['tokens']}",
        f"max |score_jobs (eager) - rerank (streamed, graphs)|: {report['rerank_vs_score_jobs_max_diff']}",
        f"graphs during the timed calls: {report['graphs_during_timing']}",
        f"memory reserved by each engine's warm-up (GiB): {report['reserved_by_warm_up_gib']}",
        f"W1 text in, peak beyond the allocation before it (GiB): {report['w1_text_peak_beyond_gib']}",
    ]
    for r, k in report.get("w1_engine_kernels_ms", {}).items():
        lines.append(f"W1 engine kernels, {r} residual (ms): {k}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
