"""W1-W4 as users run them: text in through ``GenerativeScorer``, the official recipe in the same run.

    python benchmarks/bench_text.py                      # one GPU: the 0.6B shape, bf16
    python benchmarks/bench_text.py --fresh              # new documents every call from the first call
    python benchmarks/bench_text.py --shape 8b           # the 8B shape (untied head), W1 1 x 128
    python benchmarks/bench_text.py --cpu                # W1-W4 on the CPU: a small Qwen3 shape, fp32
    python benchmarks/bench_text.py --dry-run            # the same code on the CPU with a tiny model
    python benchmarks/bench_text.py --fp8                # and quantization="fp8" beside bf16, accuracy at 4 scales

W1: ``rerank`` of 1 query x 256 documents (128 x 1 for the 4B and 8B shapes); W2: ``score_pairs`` of
16 queries x 64 documents (4 x 64 for 4B and 8B; ``--w2-large``: 64 x 100 too) and of 1,024 distinct
queries of one document each (256 for 4B and 8B), new pairs every call; W3: W1 with ``score_mode="vocab-softmax"``
(the full-vocabulary normaliser); W4: ``rerank`` of 1 x 20, milliseconds a call. Documents are
128-512 one-token words, queries 20 words (``common.Texts``). Beside them: the Qwen3-Reranker model
card's transformers recipe (left-padded batches of 32, SDPA, bf16), and W1's accuracy against that
recipe in fp32 on the same weights. Without ``--fresh`` W1 and W4 repeat their documents (two untimed
calls first, so captured CUDA graphs replay); with it every call brings new text from the first call
after the model loads, and the first 20 calls are reported apart from calls 21-40.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from common import (
    SHAPES,
    OfficialRecipe,
    Report,
    Texts,
    build_model,
    call_times,
    errors,
    load_tokenizer,
    matmul_tflops,
    median,
    peak_beyond,
    quantile,
    run_reported,
    scored_in_order,
    word_list,
)

from genscore_core import GenerativeScorer


def per_call(n: int, make: Callable[[], Callable[[], Any]]) -> list[Callable[[], Any]]:
    return [make() for _ in range(n)]


def fresh_calls(
    report: Report, scorer: GenerativeScorer, texts: Texts, name: str, docs: int,
    bf16: dict[str, float] | None = None,
) -> dict[str, float]:  # fmt: skip
    """40 calls, each on a query and documents never seen before (text made before the timing): the
    p50 seconds of calls 1-20 and 21-40. ``bf16``: those of the bf16 scorer, to set beside."""
    work = [(texts.query(), texts.documents(docs)) for _ in range(40)]
    times = call_times([lambda q=q, d=d: scorer.rerank(q, d) for q, d in work])
    spans = {"calls 1-20": times[:20], "calls 21-40": times[20:]}
    p50 = {span: median(part) for span, part in spans.items()}
    for span, part in spans.items():
        against = "" if bf16 is None else f"{bf16[span] / p50[span]:.2f}x bf16's {span} in this run"
        if docs >= 100:
            report.add(f"{name} fresh", f"p50 pairs/s, {span}", docs / p50[span], "pairs/s", note=against)
        else:
            report.add(f"{name} fresh", f"p50 latency, {span}", p50[span] * 1e3, "ms",
                       note=f"p99 {quantile(part, 0.99) * 1e3:.1f} ms, max {max(part) * 1e3:.1f} ms"
                       + (f"; {against}" if against else ""))  # fmt: skip
    return p50


def built_and_reported(report: Report, model: Any, tokenizer: Any, device: str) -> GenerativeScorer:
    """The scorer, built as a user builds it (on a GPU: the CUDA-graph ladder captured now); its
    build time and the device memory the build kept are reported."""
    if device == "cuda":
        torch.cuda.synchronize()
        # Cached blocks of the official recipe's calls would otherwise count: a capture empties the
        # cache, and the 8B run reported -12.3 GiB kept.
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
    started = time.perf_counter()
    scorer = GenerativeScorer.from_model(model, tokenizer)
    seconds = time.perf_counter() - started
    if device == "cuda":
        kept = (torch.cuda.memory_reserved() - reserved) / 2**30
        graphs = getattr(scorer.engine.forward, "graphs", None)
        rungs, capture = len(getattr(graphs, "graphs", ())), getattr(graphs, "capture_seconds", 0.0)
        report.add("load", "seconds to build the scorer", seconds, "s",
                   note=f"{rungs} CUDA graphs captured in {capture:.1f} s; {kept:.2f} GiB of device memory kept"
                        + launch_costs(graphs))  # fmt: skip
    return scorer


def launch_costs(graphs: Any) -> str:
    """The costs the ladder measured when captured, which decide when a batch runs eagerly."""
    costs = getattr(graphs, "costs", None)
    if costs is None:
        return ""
    return f"; {costs.per_token * 1e6:.2f} us a token, launches {costs.launch * 1e3:.2f} ms"


def eager_runs(scorer: GenerativeScorer) -> str:
    """How many batches the ladder ran eagerly (padding cost more than launches) so far."""
    graphs = getattr(scorer.engine.forward, "graphs", None)
    runs = getattr(graphs, "eager_runs", None)
    return "" if runs is None else f"; {runs} batches eager, {getattr(graphs, 'replays', 0)} replayed so far"


def distinct_queries(report: Report, scorer: GenerativeScorer, texts: Texts, pairs: int, calls: int) -> None:
    """``score_pairs`` of ``pairs`` pairs of distinct queries, one document each, new every call."""
    work = [[(texts.query(), d) for d in texts.documents(pairs)] for _ in range(calls + 1)]
    scorer.score_pairs(work[0])
    times = call_times([lambda p=p: scorer.score_pairs(p) for p in work[1:]])
    report.add(f"W2 {pairs} distinct queries", "pairs/s, score_pairs, new pairs every call",
               pairs / median(times), "pairs/s")  # fmt: skip
    # The front end alone on new pairs: what tokenizing and templating distinct queries costs.
    fresh = [[(texts.query(), d) for d in texts.documents(pairs)] for _ in range(calls)]
    front = median(call_times([lambda p=p: scorer.prepare_pairs(p) for p in fresh]))
    report.add(f"W2 {pairs} distinct queries, front end alone", "pairs/s, prepare_pairs, new pairs every call",
               pairs / front, "pairs/s", note=f"{front * 1e3:.0f} ms a call")  # fmt: skip


def engine_alone(scorer: GenerativeScorer, pairs: list[tuple[str, str]], repeats: int) -> float:
    """Median seconds of the backend scoring the call's prompts, built once beforehand: the
    figure text in is measured against (the front end's public ``prepare_pairs``, then the backend
    contract's ``score_jobs``)."""
    jobs = scorer.prepare_pairs(pairs).jobs
    call = lambda: scorer.backend.score_jobs(jobs)  # noqa: E731
    call(), call()
    return median(call_times([call] * repeats))


def run(args: argparse.Namespace, report: Report) -> None:
    # On the CPU (--cpu, --dry-run): fp32, fewer documents and calls.
    dry = args.dry_run or args.cpu
    shape = "tiny" if args.dry_run else "cpu" if args.cpu else args.shape
    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    torch.backends.cuda.matmul.allow_tf32 = False
    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    w1_docs = args.w1_docs or (16 if dry else 256 if shape == "0.6b" else 128)
    w1 = (texts.query(), texts.documents(w1_docs))
    w1_pairs = [(w1[0], d) for d in w1[1]]
    model = build_model(shape, device, dtype)
    repeats = 2 if dry else 11

    official = OfficialRecipe(model, tokenizer)
    off_scores = official(w1_pairs)  # warm-up
    off_w1 = w1_docs / median(call_times([lambda: official(w1_pairs)] * (1 if dry else 3)))
    w4_sets = [(texts.query(), texts.documents(20)) for _ in range(4)]
    off_w4 = median(
        call_times([lambda: official([(w4_sets[0][0], d) for d in w4_sets[0][1]])] * (2 if dry else 10))
    )

    ref: list[float] | None = None
    if not args.no_accuracy:
        # The accuracy reference: the official recipe in fp32 arithmetic on the same (rounded) weights.
        ref_model = build_model(shape, device, torch.float32)
        ref_model.load_state_dict(model.state_dict())
        ref = OfficialRecipe(ref_model, tokenizer)(w1_pairs)
        del ref_model
        if not dry:
            torch.cuda.empty_cache()

    scorer = built_and_reported(report, model, tokenizer, device)
    fresh_w1 = fresh_w4 = None
    if args.fresh:  # before any other call, so that the first call after loading is timed
        fresh_w1 = fresh_calls(report, scorer, texts, "W1", w1_docs)
        fresh_w4 = fresh_calls(report, scorer, texts, "W4", 20)

    def w1_call() -> Any:
        return scorer.rerank(*w1)

    w1_call(), w1_call()  # a CUDA graph is captured the second time its shape is seen
    w1_s = median(call_times([w1_call] * repeats))
    got = scored_in_order(w1_call(), w1_docs)
    note = f"peak {peak_beyond(w1_call):.2f} GiB beyond the weights" if device == "cuda" else ""
    if ref is not None:
        e, e_off = errors(got, ref), errors(off_scores, ref)
        note += (f"{'; ' if note else ''}vs fp32 recipe max {e[0]:.2e} mean {e[1]:.2e} "
                 f"(official recipe in {str(dtype).removeprefix('torch.')} {e_off[0]:.2e} / {e_off[1]:.2e})")  # fmt: skip
    report.add("W1", f"pairs/s, 1 x {w1_docs}, documents repeated", w1_docs / w1_s, "pairs/s", off_w1,
               note + eager_runs(scorer))  # fmt: skip
    engine_s = engine_alone(scorer, w1_pairs, repeats)
    report.add("W1 engine alone", "pairs/s, the same prompts as token ids into the backend", w1_docs / engine_s,
               "pairs/s", note=f"text in is {engine_s / w1_s:.1%} of it")  # fmt: skip
    if shape in ("4b", "8b") and not dry:
        non_embedding = sum(
            p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n
        )
        tokens = sum(len(ids) for ids in tokenizer([d for _, d in w1_pairs])["input_ids"]) + 12 * w1_docs
        rate = 2 * non_embedding * tokens / w1_s / 1e12
        ceiling = matmul_tflops(device)
        report.add("W1", "dense TFLOP/s (document and suffix tokens)", rate, "TFLOP/s",
                   note=f"{rate / ceiling:.0%} of the bf16 matmul rate measured here ({ceiling:.0f} TFLOP/s)")  # fmt: skip

    # W2: many queries in one call.
    large = shape in ("4b", "8b")  # W2 scaled down with W1, so that a run stays within minutes
    w2 = (4, 8) if dry else (4, 64) if large else (16, 64)
    for n_q, n_d in [w2] + ([(64, 100)] if args.w2_large else []):
        # n_q queries of n_d documents each (not a new query for every pair: that is the row below)
        pairs = [(q, d) for q in [texts.query() for _ in range(n_q)] for d in texts.documents(n_d)]
        scorer.score_pairs(pairs), scorer.score_pairs(pairs)
        t2 = median(call_times([lambda p=pairs: scorer.score_pairs(p)] * (2 if dry else 5)))
        report.add(f"W2 {n_q}x{n_d}", "pairs/s, score_pairs", len(pairs) / t2, "pairs/s",
                   note=f"{len(pairs) / t2 / (w1_docs / w1_s):.0%} of W1")  # fmt: skip

    distinct_queries(
        report, scorer, texts, 64 if dry else 256 if large else 1024, 2 if dry else 3 if large else 5
    )

    # W3: the full-vocabulary normaliser (a second scorer on the same model).
    try:
        vocab = GenerativeScorer.from_model(model, tokenizer, score_mode="vocab-softmax")
    except Exception as error:  # an older tree without the setting
        print(f"W3 skipped: {error!r}", file=sys.stderr)
    else:
        vocab.rerank(*w1), vocab.rerank(*w1)
        t3 = median(call_times([lambda: vocab.rerank(*w1)] * repeats))
        report.add("W3", "pairs/s, score_mode vocab-softmax", w1_docs / t3, "pairs/s",
                   note=f"{w1_s / t3:.0%} of W1")  # fmt: skip
        del vocab

    # W4: small calls, four sets of documents in turn, each seen twice before the timing.
    w4_calls = [lambda s=s: scorer.rerank(*s) for s in w4_sets]
    call_times(w4_calls * 2)
    t4 = call_times(w4_calls * (2 if dry else 5))
    report.add(
        "W4",
        "median latency, 1 x 20, documents repeated",
        median(t4) * 1e3,
        "ms",
        off_w4 * 1e3,
        f"p90 {quantile(t4, 0.9) * 1e3:.1f} ms, p99 {quantile(t4, 0.99) * 1e3:.1f} ms",
    )

    if args.fp8:  # FP8 beside the bf16 figures above (benchmarks/fp8_common.py)
        from fp8_common import allow_fp8_on_the_cpu, fp8_section

        if dry:
            allow_fp8_on_the_cpu()

        def fp8_fresh(fp8: GenerativeScorer) -> None:  # the FP8 scorer's first calls, as bf16's above
            fresh_calls(report, fp8, texts, "W1 FP8", w1_docs, fresh_w1)
            fresh_calls(report, fp8, texts, "W4 FP8", 20, fresh_w4)

        fp8_section(
            report, build=lambda d: build_model(shape, device, d), model=model, tokenizer=tokenizer, w1=w1,
            w4_sets=w4_sets, bf16_w1_s=w1_s, bf16_w4_s=median(t4), repeats=repeats,
            scales=[float(s) for s in args.fp8_scales.split(",") if s],
            fresh=fp8_fresh if args.fresh else None,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if s not in ("tiny", "cpu")], default="0.6b")
    parser.add_argument(
        "--fresh", action="store_true", help="W1/W4 on new documents every call from the first"
    )
    parser.add_argument("--w1-docs", type=int, default=0, help="documents of W1 (default 256; 128 for 4b/8b)")
    parser.add_argument("--w2-large", action="store_true", help="W2 64 x 100 as well as 16 x 64")
    parser.add_argument(
        "--no-accuracy", action="store_true", help="skip the fp32 reference (memory of the 8B)"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="on the CPU: hidden 256, 4 layers, fp32 (OMP_NUM_THREADS)"
    )
    parser.add_argument(
        "--fp8", action="store_true",
        help="also quantization='fp8': W1/W4 speed beside bf16, W1 accuracy against fp32 at --fp8-scales",
    )  # fmt: skip
    parser.add_argument(
        "--fp8-scales", default="1,1.5,2,3", help="weight scales of the FP8 accuracy rows (comma-separated)"
    )
    run_reported(parser, "bench_text.py", run, dry_run="tiny model on the CPU: checks the script")


if __name__ == "__main__":
    main()
