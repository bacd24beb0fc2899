"""Peak memory and time of one ``rerank(..., long_documents="chunk")`` call on one huge document, in a
fresh process (a process's peak RSS only grows, so a test process that ran others cannot measure it).

    python -m tests.helpers.chunk_memory --model DIR --megabytes 8 [--chunk-max-tokens none]

prints one JSON object: ``rss_growth_mb`` (the peak RSS the call added, from ``resource.getrusage``),
``seconds``, and ``outcome`` (the windows scored, or the refusal's message). ``tests/test_long_documents.py``
runs it; run with the code of another commit on ``PYTHONPATH`` to compare.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

SENTENCE = "The river flows past the old museum while visitors walk along the stone bridge at dusk. "


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def measure(model: str, megabytes: float, max_length: int, chunk_max_tokens: int | None) -> dict[str, object]:
    from genscore_core import GenerativeScorer, PromptTooLongError

    cap = {} if chunk_max_tokens == -1 else {"chunk_max_tokens": chunk_max_tokens}
    scorer = GenerativeScorer(
        model, device="cpu", dtype="float32", max_length=max_length, long_documents="chunk", **cap
    )
    # One call first: what every call sets up once (the tokenizer's bounds, the engine) is not the call's.
    scorer.rerank("where does the river flow", [SENTENCE * 200])
    document = (SENTENCE * (int(megabytes * 1e6) // len(SENTENCE) + 1))[: int(megabytes * 1e6)]
    before = peak_rss_mb()
    started = time.perf_counter()
    try:
        [result] = scorer.rerank("where does the river flow", [document])
        outcome = f"scored in {result.windows} windows"
    except PromptTooLongError as error:
        outcome = f"refused: {error.message}"
    return {
        "megabytes": megabytes,
        "rss_growth_mb": round(peak_rss_mb() - before, 1),
        "seconds": round(time.perf_counter() - started, 2),
        "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--megabytes", type=float, default=8.0)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument(
        "--chunk-max-tokens",
        default="default",
        help="a number, 'none' (no cap), or 'default' (the setting's default; also for code without it)",
    )
    args = parser.parse_args()
    cap = {"default": -1, "none": None}.get(args.chunk_max_tokens, None)
    if args.chunk_max_tokens not in {"default", "none"}:
        cap = int(args.chunk_max_tokens)
    print(json.dumps(measure(args.model, args.megabytes, args.max_length, cap)))


if __name__ == "__main__":
    main()
