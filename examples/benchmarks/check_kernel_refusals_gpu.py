"""On a GPU: what the kernels do with inputs they cannot compute, where the CPU tests cannot look.

    PYTHONPATH=. python examples/benchmarks/check_kernel_refusals_gpu.py

Label ids on the GPU are not range-checked on the host (that would wait for the device), so an
unmasked id outside the vocabulary must come out NaN in its slot, through the Triton kernel and the
torch path alike, and never read past the weight; the valid slots must still equal a float64
log-softmax. A fused op given tensors of mismatched shapes must be refused before any kernel runs.
``tests/kernels`` checks both on the CPU (the Triton interpreter); this runs the compiled kernels.
Exits 1 when a check fails.
"""

from __future__ import annotations

import sys

import torch

from genscore_core.kernels import fused_ops
from genscore_core.kernels.label_logprobs import label_logprobs

VOCAB, HIDDEN = 151_669, 1024  # Qwen3-0.6B's LM head


def main() -> int:
    torch.manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    hidden = torch.randn(4, HIDDEN, device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([[9693, 2152], [9693, VOCAB], [-1, 2152], [0, VOCAB - 1]], device="cuda")
    outside = (ids < 0) | (ids >= VOCAB)
    exact = (hidden.double() @ weight.double().T).log_softmax(-1).gather(1, ids.clamp(0, VOCAB - 1))
    failures = []
    for impl in ("triton", "torch"):
        got = label_logprobs(hidden, weight, ids, impl=impl).logprobs
        if not bool(torch.isnan(got[outside]).all()) or bool(torch.isnan(got[~outside]).any()):
            failures.append(f"{impl}: NaN exactly where the id is outside the vocabulary: got {got.tolist()}")
        error = float((got[~outside].double() - exact[~outside]).abs().max())
        print(f"label_logprobs {impl}: ids outside -> NaN; valid slots within {error:.2e} of float64")
        if error > 1e-4:
            failures.append(f"{impl}: valid slots {error:.2e} from float64")
    residual = torch.randn(7, 1000, device="cuda")
    short_delta = torch.randn(7, 999, device="cuda", dtype=torch.bfloat16)
    try:
        fused_ops.add_rmsnorm(residual, short_delta, torch.ones(1000, device="cuda"), 1e-6, torch.bfloat16)
        failures.append("add_rmsnorm took a delta of another width")
    except ValueError as error:
        print(f"add_rmsnorm refused: {error}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
