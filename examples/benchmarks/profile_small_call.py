"""Where the time of one small call goes: ``rerank(query, 20 texts)`` (W4) on the GPU.

    PYTHONPATH=. python examples/benchmarks/profile_small_call.py [--tree PATH ...]

For each source tree given (default: this one) it loads that tree's ``genscore_core`` in a child
process and reports, for W4 (four sets of 20 documents of 128-512 words, a 20-word query, rotating so
no set runs twice in a row):

* the medians of the text-in call, the engine alone (token-id jobs) and the packed decoder alone
  (a batch already on the device), and of the front end (text to jobs) on its own;
* a torch.profiler trace of one text-in and one engine call: kernel time by kind, GPU idle time
  between the first and the last kernel, time to the first kernel, the host's launch time of the
  decoder against its GPU time (launch-bound or not);
* the decoder replayed from a CUDA graph (an upper bound on what removing launch gaps can give),
  with its scores compared to the eager run;
* GEMM micro-benchmarks at the W4 token count: q/k/v and gate/up as separate products and fused
  (``PROFILE_GEMMS=1``);
* with the packed forward's graphs (genscore_core.packed.graphs): scores with and without them, the
  first three calls of a new shape, and the replay time by padding step (``PROFILE_STEPS=1,128,256``);
* one HTTP client against a real ``genscore serve`` (``PROFILE_SERVER=<seconds>``, right after a
  warm-up of 4 clients: most request shapes are still new); in steady state with
  ``PROFILE_SERVER_STEADY=<seconds>`` (each of the 64 bodies sent twice first, so every shape's graph
  is captured before the window; ``PROFILE_SERVER_FLAGS`` adds ``genscore serve`` flags);
* with an engine that splits small calls (``ScoringEngine.overlap_share``): W4 text in whole against
  split at each share of ``PROFILE_SHARES`` (default ``0,0.25,0.35,0.5``), the scores' largest
  difference, and a torch.profiler summary of one call each way (GPU busy and idle time).

``PROFILE_LIGHT=1`` stops after the W4 figures, the graph checks and the server (no deep profiles).
Prints the figures last and writes ``$OUT/<tree>/result.json`` as it goes.
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
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def category(name: str) -> str:
    lowered = name.lower()
    if "segment_attention" in lowered:
        return "attention"
    if "add_rmsnorm" in lowered:
        return "add_rmsnorm"
    if "rope" in lowered:
        return "rope (q/k norm)"
    if "silu" in lowered:
        return "silu_mul"
    if any(k in lowered for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas", "matmul")):
        return "GEMM"
    if "index" in lowered or "gather" in lowered:
        return "index_select"
    if "memcpy" in lowered or "memset" in lowered:
        return "memcpy/memset"
    if "embedding" in lowered:
        return "embedding"
    return "other"


def trace_summary(trace: dict[str, Any]) -> dict[str, Any]:
    events = trace["traceEvents"]
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
        key=lambda e: e["ts"],
    )
    marks = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "call"]
    call_start = marks[0]["ts"] if marks else None
    call_end = marks[0]["ts"] + marks[0]["dur"] if marks else None
    by_kind: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for k in kernels:
        by_kind[category(k["name"])] += k["dur"]
        count[category(k["name"])] += 1
    busy = 0.0
    end = None
    gaps = []
    for k in kernels:
        start, stop = k["ts"], k["ts"] + k["dur"]
        if end is None or start > end:
            if end is not None:
                gaps.append((start - end, k["name"][:60]))
            busy += k["dur"]
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e]
    syncs: dict[str, list[float]] = defaultdict(list)
    for e in runtime:
        name = e["name"]
        if "ynchronize" in name or ("Memcpy" in name and "Async" not in name):
            syncs[name].append(e["dur"])
    launches = sum(1 for e in runtime if "aunch" in e["name"])
    gaps.sort(reverse=True)
    span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) if kernels else 0.0
    return {
        "kernel_us": sum(by_kind.values()),
        "by_kind_us": dict(by_kind),
        "by_kind_count": dict(count),
        "kernels": len(kernels),
        "launch_calls": launches,
        "gpu_span_us": span,
        "gpu_busy_us": busy,
        "gpu_idle_in_span_us": span - busy,
        "first_kernel_after_us": kernels[0]["ts"] - call_start if kernels and call_start else None,
        "after_last_kernel_us": call_end - (kernels[-1]["ts"] + kernels[-1]["dur"])
        if kernels and call_end
        else None,
        "call_us": (call_end - call_start) if call_start else None,
        "largest_gaps_us": gaps[:8],
        "sync_calls": {k: [len(v), sum(v)] for k, v in syncs.items()},
    }


def child(tree: str, out: str) -> None:
    sys.path.insert(0, tree)
    sys.path.insert(0, str(HERE))
    import torch
    from bench_text import QWEN3_06B, TINY, build_model, load_tokenizer, make_text, word_list

    import genscore_core
    from genscore_core import GenerativeScorer

    assert Path(genscore_core.__file__).resolve().is_relative_to(Path(tree).resolve()), genscore_core.__file__
    torch.backends.cuda.matmul.allow_tf32 = False
    smoke = not torch.cuda.is_available()  # a CPU run checks this script's code, tiny shapes
    device = torch.device("cpu" if smoke else "cuda")
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    rng = random.Random(4)
    sets = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]
    model = build_model(TINY if smoke else QWEN3_06B, device, torch.float32 if smoke else torch.bfloat16)
    scorer = GenerativeScorer.from_model(model, tokenizer, forward="packed")
    engine = scorer.backend
    forward = engine.forward
    report: dict[str, Any] = {"tree": tree, "forward": type(forward).__name__}

    def sync() -> None:
        if not smoke:
            torch.cuda.synchronize()

    def text_call(i: int) -> Any:
        w = sets[i % 4]
        return scorer.rerank(w.queries[0], w.documents[0])

    jobs = [scorer.prepare_pairs(w.pairs).jobs for w in sets]
    report["tokens"] = [sum(len(p) for p in j[0].prompts) for j in jobs]

    def engine_call(i: int) -> Any:
        return engine.score_jobs(jobs[i % 4])

    def front_call(i: int) -> Any:
        w = sets[i % 4]
        return scorer.front_end.prepare_rerank(w.queries[0], w.documents[0])

    def median_ms(fn: Any, n: int, do_sync: bool = True) -> tuple[float, list[float]]:
        for i in range(4):
            fn(i)
        if do_sync:
            sync()
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            fn(i)
            if do_sync:
                sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), times

    # Interleave text-in and engine-alone so machine drift hits both alike.
    t_text, t_engine = [], []
    for i in range(4):
        text_call(i)
        engine_call(i)
    for i in range(40):
        for fn, acc in ((text_call, t_text), (engine_call, t_engine)):
            sync()
            t0 = time.perf_counter()
            fn(i)
            sync()
            acc.append((time.perf_counter() - t0) * 1e3)
    report["w4_text_ms"] = statistics.median(t_text)
    report["w4_engine_ms"] = statistics.median(t_engine)
    report["w4_text_all"] = t_text
    report["front_end_ms"] = median_ms(front_call, 40, do_sync=False)[0]

    # The host's timeline of a call: when each step began and ended (no syncs added inside).
    import genscore_core.packed.forward as packed_forward_module

    marks: list[tuple[str, float, float]] = []

    def traced(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                marks.append((name, t0, time.perf_counter()))

        return wrapper

    originals: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, name: str) -> None:
        originals.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, traced(name, getattr(owner, attr)))

    patch(scorer.front_end, "prepare_rerank", "front_end.prepare_rerank")
    patch(engine, "score_jobs", "engine.score_jobs")
    patch(forward, "last_hidden_states", "forward.last_hidden_states")
    patch(packed_forward_module, "build_batch", "build_batch")
    if hasattr(packed_forward_module, "DeviceBatch"):
        patch(packed_forward_module.DeviceBatch, "from_batch", "DeviceBatch.from_batch")
    if hasattr(forward, "decoder"):
        patch(forward.decoder, "run", "decoder.run (launch)")
    if getattr(forward, "graphs", None) is not None:
        patch(forward.graphs, "run", "graphs.run (replay)")
    patch(engine.head, "scores", "head.scores")
    phases: dict[str, list[float]] = defaultdict(list)
    for kind, fn in (("text", text_call), ("engine", engine_call)):
        for i in range(24):
            marks.clear()
            sync()
            t0 = time.perf_counter()
            fn(i)
            sync()
            t1 = time.perf_counter()
            phases[f"{kind}: whole call"].append((t1 - t0) * 1e3)
            for name, a, b in marks:
                phases[f"{kind}: {name}"].append((b - a) * 1e3)
            starts = {name: a for name, a, _ in marks}
            ends = {name: b for name, _, b in marks}
            if "engine.score_jobs" in starts:
                phases[f"{kind}: call start -> engine start"].append((starts["engine.score_jobs"] - t0) * 1e3)
                phases[f"{kind}: engine end -> call end (sync)"].append(
                    (t1 - ends["engine.score_jobs"]) * 1e3
                )
            if "forward.last_hidden_states" in ends and "head.scores" in starts:
                phases[f"{kind}: forward end -> head start"].append(
                    (starts["head.scores"] - ends["forward.last_hidden_states"]) * 1e3
                )
            if "head.scores" in ends and "engine.score_jobs" in ends:
                phases[f"{kind}: head end -> engine end (sync, tolist)"].append(
                    (ends["engine.score_jobs"] - ends["head.scores"]) * 1e3
                )
    for owner, attr, original in reversed(originals):
        setattr(owner, attr, original)
    report["phases_ms"] = {k: statistics.median(v) for k, v in phases.items()}

    # Does the engine slow down right after a tokenization (the tokenizer's threads still busy)?
    backend_tokenizer = tokenizer.backend_tokenizer
    bodies = [[f"<Query>: {w.queries[0]}\n<Document>: {d}" for d in w.documents[0]] for w in sets]
    after_tok = []
    for i in range(24):
        backend_tokenizer.encode_batch_fast(bodies[i % 4], add_special_tokens=False)
        sync()
        t0 = time.perf_counter()
        engine_call(i)
        sync()
        after_tok.append((time.perf_counter() - t0) * 1e3)
    report["engine_after_tokenize_ms"] = statistics.median(after_tok)
    report["engine_loop_ms"] = median_ms(engine_call, 24)[0]

    graphs = getattr(forward, "graphs", None)
    if graphs is not None:
        from genscore_core.engine import ScoringEngine
        from genscore_core.packed import PackedForward, PackedOptions
        from genscore_core.scoring import LabelHead

        eager_engine = ScoringEngine(
            model, PackedForward(model, options=PackedOptions(graph_tokens=0)), LabelHead(model)
        )
        eager = GenerativeScorer(front_end=scorer.front_end, backend=eager_engine)
        diffs = []
        for w in sets:
            with_graphs = {r.index: r.score for r in scorer.rerank(w.queries[0], w.documents[0])}
            without = {r.index: r.score for r in eager.rerank(w.queries[0], w.documents[0])}
            diffs.append(max(abs(with_graphs[k] - without[k]) for k in without))
        report["graph_vs_eager_max_abs_score_diff"] = max(diffs)
        report["eager_text_ms"] = median_ms(
            lambda i: eager.rerank(sets[i % 4].queries[0], sets[i % 4].documents[0]), 24
        )[0]
        fresh = make_text(random.Random(99), words, 1, 20, (128, 512))
        firsts = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            scorer.rerank(fresh.queries[0], fresh.documents[0])
            sync()
            firsts.append((time.perf_counter() - t0) * 1e3)
        report["new_shape_calls_ms (eager, capture, replay)"] = firsts
        report["graph_stats"] = {
            "captures": graphs.captures, "replays": graphs.replays, "kept": len(graphs.graphs),
            "disabled": graphs.disabled,
        }  # fmt: skip
        del eager, eager_engine
        if not smoke:
            torch.cuda.empty_cache()
        # The decoder's replay time by padding step: step 1 pads nothing (the kernels of the exact
        # shape), larger steps pad more but need fewer graphs.
        if os.environ.get("PROFILE_STEPS"):
            try:
                from genscore_core.engine import group_prompts as group_of
                from genscore_core.packed.graphs import DecoderGraphs
                from genscore_core.packed.plan import build_batch as layout
                from genscore_core.packed.plan import plan_batches as plan

                batches = []
                for j in jobs:
                    groups_j = [group_of(j[0].prompts)]
                    [slices_j] = plan(groups_j, forward.max_batch_tokens)
                    batches.append(layout(groups_j, slices_j))
                steps = {}
                with torch.inference_mode():
                    for step in [int(x) for x in os.environ["PROFILE_STEPS"].split(",")]:
                        trial = DecoderGraphs(
                            forward.decoder, max_tokens=32768, token_step=step, capture_after=1
                        )
                        for b in batches:
                            trial.run(b)
                        steps[step] = median_ms(lambda i, t=trial: t.run(batches[i % 4]), 20)[0]
                        del trial
                report["replay_ms_by_token_step"] = steps
            except Exception as error:  # reported: the other numbers still come back
                report["replay_ms_by_token_step"] = repr(error)

    if hasattr(engine, "overlap_share"):
        try:
            overlap_variants(report, scorer, engine, sets, sync, smoke)
        except Exception as error:  # reported: the server figures still come back
            report["overlap_error"] = repr(error)

    Path(out, "result.json").write_text(json.dumps(report, indent=1, default=str))

    def on_saved_model(key: str, measure: Callable[[Path], Any]) -> None:
        """Save the model to a folder, free this process's GPU copy (a server loads its own), and keep
        what ``measure(folder)`` returns, or its error, under ``report[key]``."""
        nonlocal scorer, engine, forward
        import shutil
        import tempfile

        from bench_text import save_model

        folder = Path(tempfile.mkdtemp(prefix="genscore-small-"))
        try:
            save_model(model, tokenizer, folder)
            scorer = engine = forward = None  # type: ignore[assignment]
            model.cpu()
            torch.cuda.empty_cache()
            report[key] = measure(folder)
        except Exception as error:  # reported: the rest of the numbers still come back
            report[key] = repr(error)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        Path(out, "result.json").write_text(json.dumps(report, indent=1, default=str))

    def one_client(folder: Path) -> list[Any]:
        from bench_text import Report, server_benchmark

        server = Report()
        server_benchmark(server, folder, words, [1], float(os.environ["PROFILE_SERVER"]))
        return [vars(r) for r in server.rows] + server.notes

    def serve() -> None:
        """One client against a real ``genscore serve`` on this model: in steady state
        (PROFILE_SERVER_STEADY seconds) and/or in a window with captures (PROFILE_SERVER seconds)."""
        if os.environ.get("PROFILE_SERVER_STEADY") and not smoke:
            seconds = float(os.environ["PROFILE_SERVER_STEADY"])
            flags = os.environ.get("PROFILE_SERVER_FLAGS", "").split()
            on_saved_model("server_steady", lambda folder: steady_server(folder, words, seconds, flags))
        if os.environ.get("PROFILE_SERVER") and not smoke:
            on_saved_model("server_1_client", one_client)

    if os.environ.get("PROFILE_LIGHT"):  # the numbers above, then the server; no deep profiles
        serve()
        return

    # The packed decoder alone on a batch already on the device, and its host launch time.
    decoder_report: dict[str, Any] = {}
    if hasattr(forward, "decoder"):
        from genscore_core.engine import group_prompts
        from genscore_core.packed.decoder import DeviceBatch
        from genscore_core.packed.plan import build_batch, plan_batches

        groups = [[group_prompts(j[0].prompts)] for j in jobs]
        plans = [plan_batches(g, forward.max_batch_tokens) for g in groups]
        assert all(len(p) == 1 for p in plans), "W4 should be one batch"
        packed = [build_batch(g, p[0]) for g, p in zip(groups, plans)]
        decoder_report["host_build_batch_ms"] = median_ms(
            lambda i: build_batch(groups[i % 4], plans[i % 4][0]), 40, do_sync=False
        )[0]
        decoder_report["host_from_batch_ms"] = median_ms(
            lambda i: DeviceBatch.from_batch(packed[i % 4], device), 40
        )[0]
        devs = [DeviceBatch.from_batch(p, device) for p in packed]
        sync()
        dec = forward.decoder

        def run_dec(i: int) -> Any:
            return dec.run(devs[i % 4])[0]

        with torch.inference_mode():
            decoder_report["decoder_ms"] = median_ms(run_dec, 40)[0]
            launch, total = [], []
            for i in range(20):
                sync()
                t0 = time.perf_counter()
                dec.run(devs[i % 4])
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                launch.append((t1 - t0) * 1e3)
                total.append((t2 - t0) * 1e3)
            decoder_report["decoder_host_launch_ms"] = statistics.median(launch)
            decoder_report["decoder_total_ms"] = statistics.median(total)
            # Kernel time of the decoder alone, by events around a graph replay.
            try:
                if smoke:
                    raise RuntimeError("no CUDA")
                graphs = []
                outs = []
                eager = []
                for i in range(4):
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(2):
                            dec.run(devs[i])
                    torch.cuda.current_stream().wait_stream(stream)
                    eager.append(dec.run(devs[i])[0].clone())
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        captured, _ = dec.run(devs[i])
                    graphs.append(graph)
                    outs.append(captured)
                for g in graphs:
                    g.replay()
                sync()
                diffs = [float((o - e).abs().max()) for o, e in zip(outs, eager)]
                decoder_report["graph_max_abs_diff"] = max(diffs)
                decoder_report["graph_replay_ms"] = median_ms(lambda i: graphs[i % 4].replay(), 40)[0]
            except Exception as error:  # reported: the capture is an experiment
                decoder_report["graph_error"] = repr(error)[:500]

    if hasattr(forward, "decoder") and not smoke and os.environ.get("PROFILE_GEMMS"):
        import triton.testing

        # GEMMs at the W4 token count: separate against fused (what fused weights would save).
        t = report["tokens"][0]
        x = torch.randn(t, 1024, device=device, dtype=torch.bfloat16)
        wq = torch.randn(2048, 1024, device=device, dtype=torch.bfloat16)
        wk = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
        wv = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
        wqkv = torch.cat([wq, wk, wv])
        wg = torch.randn(3072, 1024, device=device, dtype=torch.bfloat16)
        wu = torch.randn(3072, 1024, device=device, dtype=torch.bfloat16)
        wgu = torch.cat([wg, wu])
        wd = torch.randn(1024, 3072, device=device, dtype=torch.bfloat16)
        wo = torch.randn(1024, 2048, device=device, dtype=torch.bfloat16)
        a = torch.randn(t, 3072, device=device, dtype=torch.bfloat16)
        a2 = torch.randn(t, 2048, device=device, dtype=torch.bfloat16)
        bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")  # noqa: E731
        gm = {
            "q": bench(lambda: x @ wq.T),
            "k": bench(lambda: x @ wk.T),
            "v": bench(lambda: x @ wv.T),
            "qkv fused": bench(lambda: x @ wqkv.T),
            "o": bench(lambda: a2 @ wo.T),
            "gate": bench(lambda: x @ wg.T),
            "up": bench(lambda: x @ wu.T),
            "gate_up fused": bench(lambda: x @ wgu.T),
            "down": bench(lambda: a @ wd.T),
        }
        flops = {
            "q": 2048, "k": 1024, "v": 1024, "qkv fused": 4096, "o": 1024 * 2, "gate": 3072, "up": 3072,
            "gate_up fused": 6144, "down": 1024 * 3,
        }  # fmt: skip
        decoder_report["gemm_ms"] = gm
        decoder_report["gemm_tflops"] = {k: 2 * t * 1024 * flops[k] / (gm[k] * 1e-3) / 1e12 for k in gm}
        decoder_report["gemm_tokens"] = t
        sep = gm["q"] + gm["k"] + gm["v"] + gm["o"] + gm["gate"] + gm["up"] + gm["down"]
        fused = gm["qkv fused"] + gm["o"] + gm["gate_up fused"] + gm["down"]
        decoder_report["gemm_layer_sep_ms"] = sep
        decoder_report["gemm_layer_fused_ms"] = fused
        n = 8192
        big = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        decoder_report["ceiling_tflops_8192"] = 2 * n**3 / (bench(lambda: big @ big) * 1e-3) / 1e12
        del big
    report["decoder"] = decoder_report

    # Host functions of the text-in call (cProfile, own time).
    import cProfile
    import io
    import pstats

    text_call(3)
    sync()
    cprof = cProfile.Profile()
    cprof.enable()
    for i in range(8):
        text_call(i)
        sync()
    cprof.disable()
    stream = io.StringIO()
    pstats.Stats(cprof, stream=stream).sort_stats("tottime").print_stats(22)
    report["cprofile_text_x8"] = stream.getvalue()
    print(stream.getvalue()[:5000])

    # Profiles of one text-in and one engine call.
    from torch.profiler import ProfilerActivity, profile, record_function

    for name, fn in (("text", text_call), ("engine", engine_call)):
        fn(1)
        sync()
        path = Path(out) / f"trace_{name}.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function("call"):
                fn(2)
                sync()
        prof.export_chrome_trace(str(path))
        report[f"profile_{name}"] = trace_summary(json.loads(path.read_text()))
        table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
        report[f"profile_{name}_cpu_table"] = table
        path.unlink()
    print(report["profile_text_cpu_table"][:3000])
    Path(out, "result.json").write_text(json.dumps(report, indent=1, default=str))
    serve()


def overlap_variants(
    report: dict[str, Any], scorer: Any, engine: Any, sets: list[Any], sync: Any, smoke: bool
) -> None:
    """W4 text in with the call whole against split in two at several shares (the engine's
    ``overlap_share``; same forward, same graphs), interleaved; scores against the whole call; the
    GPU's work and idle time of one call each way (torch.profiler)."""
    import torch

    from genscore_core import GenerativeScorer
    from genscore_core.engine import ScoringEngine

    shares = [float(x) for x in os.environ.get("PROFILE_SHARES", "0,0.25,0.35,0.5").split(",")]
    scorers = {
        share: GenerativeScorer(
            front_end=scorer.front_end,
            backend=ScoringEngine(engine.model, engine.forward, engine.head, overlap_share=share),
        )
        for share in shares
    }

    def call(share: float, i: int) -> Any:
        w = sets[i % 4]
        return scorers[share].rerank(w.queries[0], w.documents[0])

    diffs = []
    for i in range(4):  # twice per set: every shape of every variant captured before timing
        for _ in range(2):
            for share in shares:
                call(share, i)
        whole = {r.index: r.score for r in call(0.0, i)}
        for share in shares:
            split = {r.index: r.score for r in call(share, i)}
            diffs.append(max(abs(split[k] - whole[k]) for k in whole))
    report["overlap_vs_whole_max_abs_score_diff"] = max(diffs)
    times: dict[float, list[float]] = {share: [] for share in shares}
    for i in range(40):
        for share in shares:
            sync()
            t0 = time.perf_counter()
            call(share, i)
            sync()
            times[share].append((time.perf_counter() - t0) * 1e3)
    report["w4_text_ms_by_overlap_share"] = {str(k): statistics.median(v) for k, v in times.items()}
    if smoke:
        return
    from torch.profiler import ProfilerActivity, profile, record_function

    split_shares = [share for share in shares if share > 0]
    best = min(split_shares, key=lambda share: statistics.median(times[share])) if split_shares else 0.0
    report["best_overlap_share"] = best
    for share in (0.0, best):
        call(share, 1)
        sync()
        path = Path(os.environ.get("CHILD_OUT", "/tmp")) / "trace_overlap.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function("call"):
                call(share, 1)
                torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        summary = trace_summary(json.loads(path.read_text()))
        path.unlink()
        report[f"profile_text_{'whole' if share == 0 else 'split'}"] = {
            k: summary[k]
            for k in ("call_us", "kernel_us", "gpu_span_us", "gpu_busy_us", "gpu_idle_in_span_us",
                      "first_kernel_after_us", "after_last_kernel_us", "kernels")
        }  # fmt: skip


def steady_server(folder: Path, words: list[str], seconds: float, flags: list[str]) -> dict[str, Any]:
    """One client against ``genscore serve`` once every request shape has been seen twice (each
    body sent twice, one at a time, before the window: the first runs eagerly, the second captures
    its graph): the server in steady state, not its warm-up."""
    import asyncio

    import httpx
    from bench_text import client_load, make_text, start_server
    from bench_workloads import stop_server

    work = make_text(random.Random(5), words, 64, 20, (128, 512))
    bodies = [{"query": q, "documents": docs} for q, docs in zip(work.queries, work.documents)]
    proc, url = start_server(folder, flags)
    try:
        warm: list[list[float]] = []
        with httpx.Client(base_url=url, timeout=120.0) as client:
            for _ in range(2):
                warm.append([])
                for body in bodies:
                    t0 = time.perf_counter()
                    client.post("/v1/rerank", json=body).raise_for_status()
                    warm[-1].append((time.perf_counter() - t0) * 1e3)
        before = httpx.get(f"{url}/stats").json()
        latencies = [x * 1e3 for x in asyncio.run(client_load(url, bodies, 1, 0.0, seconds)).latencies]
        after = httpx.get(f"{url}/stats").json()
    finally:
        stop_server(proc)
    n = len(latencies)
    return {
        "flags": flags,
        "requests": n,
        "p50_ms": latencies[n // 2] if n else None,
        "p90_ms": latencies[int(n * 0.9)] if n else None,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] if n else None,
        "max_ms": latencies[-1] if n else None,
        "warm_pass_medians_ms": [statistics.median(w) for w in warm],
        "requests_a_call": (after["requests"] - before["requests"])
        / max(1, after["batches"] - before["batches"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", default=None)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    out_root = Path(os.environ.get("OUT", "/tmp/profile_small"))
    if args.child:
        child(args.child, os.environ["CHILD_OUT"])
        return
    trees = args.tree or [str(HERE.parent.parent)]
    results = {}
    for tree in trees:
        label = Path(tree).resolve().name
        folder = out_root / label  # written as it goes: a run cut short still leaves its numbers
        folder.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ, CHILD_OUT=str(folder), PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", "")
        )
        subprocess.run([sys.executable, __file__, "--child", tree], env=env, check=False)
        result_file = folder / "result.json"
        if result_file.exists():
            results[label] = json.loads(result_file.read_text())
            out_root.mkdir(parents=True, exist_ok=True)
            (out_root / f"profile_{label}.json").write_text(result_file.read_text())
    for label, r in results.items():
        d = r.get("decoder", {})
        print(f"\n== {label} ({r['forward']}), W4 tokens per call {r['tokens']}")
        for key in (
            "w4_text_ms", "w4_engine_ms", "front_end_ms", "engine_loop_ms", "engine_after_tokenize_ms",
            "eager_text_ms", "graph_vs_eager_max_abs_score_diff", "overlap_vs_whole_max_abs_score_diff",
        ):  # fmt: skip
            if key in r:
                print(f"{key:28s} {r[key]:8.4g}")
        for key in (
            "new_shape_calls_ms (eager, capture, replay)", "graph_stats", "replay_ms_by_token_step",
            "server_1_client", "w4_text_ms_by_overlap_share", "best_overlap_share", "profile_text_whole",
            "profile_text_split", "server_steady", "overlap_error",
        ):  # fmt: skip
            if key in r:
                print(f"{key}: {r[key]}")
        for key, value in r.get("phases_ms", {}).items():
            print(f"   {key:52s} {value:8.3f}")
        for key, value in d.items():
            if isinstance(value, float):
                print(f"{key:28s} {value:8.2f}")
            else:
                print(f"{key:28s} {value}")
        for name in ("text", "engine"):
            if f"profile_{name}" not in r:  # PROFILE_LIGHT
                continue
            p = r[f"profile_{name}"]
            print(f"-- profile {name}: call {p['call_us'] / 1e3:.2f} ms, kernels {p['kernel_us'] / 1e3:.2f} ms "
                  f"({p['kernels']} kernels, {p['launch_calls']} launch calls), GPU span {p['gpu_span_us'] / 1e3:.2f}, "
                  f"idle in span {p['gpu_idle_in_span_us'] / 1e3:.2f}, first kernel after "
                  f"{(p['first_kernel_after_us'] or 0) / 1e3:.2f}, after last kernel {(p['after_last_kernel_us'] or 0) / 1e3:.2f}")  # fmt: skip
            for kind, us in sorted(p["by_kind_us"].items(), key=lambda kv: -kv[1]):
                print(f"   {kind:20s} {us / 1e3:7.2f} ms  x{p['by_kind_count'][kind]}")
            print(
                f"   largest gaps (us, next kernel): {[(round(g), n) for g, n in p['largest_gaps_us'][:5]]}"
            )
            print(f"   syncs: {p['sync_calls']}")


if __name__ == "__main__":
    main()
