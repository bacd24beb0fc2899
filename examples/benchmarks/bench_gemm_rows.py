"""The rate of a Qwen3-0.6B layer's four bf16 products against their row count (a batch's tokens).

    PYTHONPATH=. python examples/benchmarks/bench_gemm_rows.py [--rows 4096 8192 ...] [--dry-run]

Each product is ``F.linear`` of ``[rows, in]`` activations by an ``[out, in]`` weight (cuBLAS, as
the packed decoder runs them): q/k/v fused (1024 -> 4096), o (2048 -> 1024), gate/up fused (1024 ->
6144) and down (3072 -> 1024). Times are medians of CUDA-event pairs around each product (warm L2:
the activations of a batch stay where the kernel before left them, as in the forward). Printed per
row count: TFLOP/s of each product, the layer's four together in microseconds, and per 1,000 rows.
It tells what a batch's size costs per token before any stream schedule is chosen around it
(docs/benchmarks.md, "Batch sizes of the text stream"). ``--dry-run``: the CPU, small shapes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

PRODUCTS = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}
"""Name: (in features, out features) of a Qwen3-0.6B layer's products, as the decoder fuses them."""

ROWS = [3456, 4096, 8192, 8320, 8448, 8576, 8704, 9216, 16384, 16512, 24448, 24576, 32768, 49152, 65536]


def median_ms(run: Callable[[], object], device: torch.device, repeats: int = 25) -> float:
    for _ in range(5):
        run()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)
    ]
    for begin, end in pairs:
        begin.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=ROWS)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, small shapes")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    shrink = 16 if args.dry_run else 1
    rows_list = [max(1, r // 64) for r in args.rows[:3]] if args.dry_run else args.rows
    torch.backends.cuda.matmul.allow_tf32 = False
    weights = {
        name: torch.randn(n_out // shrink, n_in // shrink, device=device, dtype=dtype)
        for name, (n_in, n_out) in PRODUCTS.items()
    }
    lines = [
        "| rows | " + " | ".join(f"{name} TFLOP/s" for name in PRODUCTS) + " | layer us | us per 1k rows |"
    ]
    lines.append("|---:|" + "---:|" * (len(PRODUCTS) + 2))
    for rows in rows_list:
        rates, layer_ms = [], 0.0
        for weight in weights.values():
            x = torch.randn(rows, weight.shape[1], device=device, dtype=dtype)
            ms = median_ms(lambda x=x, weight=weight: F.linear(x, weight), device)
            layer_ms += ms
            rates.append(f"{2 * rows * weight.shape[0] * weight.shape[1] / ms / 1e9:.0f}")
        lines.append(
            f"| {rows} | " + " | ".join(rates) + f" | {layer_ms * 1e3:.0f} | {layer_ms * 1e6 / rows:.1f} |"
        )
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
