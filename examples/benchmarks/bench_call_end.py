"""Host time at the end of a streamed W1 text call, after the scores are in: putting them back in
input order, ranking, and freeing what the call built (the prompts' token ids), on the CPU.

    PYTHONPATH=<tree before> python examples/benchmarks/bench_call_end.py --label before
    PYTHONPATH=<tree after>  python examples/benchmarks/bench_call_end.py --label after

W1's text as in ``bench_text.py`` (1 query x 256 documents of 128-512 words, the Qwen3 tokenizer).
The parts are taken as the engine's producer takes them (copied into int32 buffers, then dropped),
so what is timed is only what follows the device's last batch on the caller's thread.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench_text import load_tokenizer, make_text, word_list

from genscore_core.config import ScorerConfig
from genscore_core.frontend import ScoringFrontEnd
from genscore_core.results import rank_results
from genscore_core.streaming import TokenRows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--label", default="tree")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    work = make_text(random.Random(0), word_list(tokenizer), 1, 256, (128, 512))
    config = ScorerConfig(model="Qwen/Qwen3-Reranker-0.6B")
    front_end = ScoringFrontEnd(tokenizer, config, max_length=8192, vocab_size=len(tokenizer))
    query, documents = work.queries[0], work.documents[0]
    scores = [[0.5 + i * 1e-4 for i in range(len(documents))]]
    times = []
    for _ in range(args.repeats):
        stream = front_end.stream_pairs([(query, d) for d in documents])
        for part in stream.parts():
            TokenRows.from_lists(part.prompts)
        del part
        start = time.perf_counter()
        scored = stream.assemble(scores)
        rank_results(query, documents, scored)
        del stream, scored
        times.append(time.perf_counter() - start)
    print(
        f"{args.label}: end of a W1 call (assemble, rank, free) median {statistics.median(times) * 1e3:.2f} ms, "
        f"{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f} ms over {args.repeats}"
    )


if __name__ == "__main__":
    main()
