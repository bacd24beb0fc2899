"""One implementation switch with one behaviour for every kernel (genscore_core.kernels.dispatch).

Each kernel is called through its public entry point with small CPU inputs: "torch" and "auto" give the
torch reference's result on the CPU, "triton" runs the kernel through the interpreter (conftest.py) and
matches it, an unknown value is a ValueError, and an explicit "triton" that cannot run raises
KernelUnavailableError saying what to set or install, never a silent fallback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from genscore_core import KernelUnavailableError
from tests.helpers.kernel_calls import KERNELS


def _seeded(call: Callable[[Any], torch.Tensor], impl: Any) -> torch.Tensor:
    torch.manual_seed(3)
    return call(impl)


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_switches_the_same_way(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    call = KERNELS[name]
    reference = _seeded(call, "torch")
    assert torch.equal(_seeded(call, "auto"), reference), "auto on the CPU is the torch reference"
    torch.testing.assert_close(_seeded(call, "triton"), reference, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="impl must be one of"):
        _seeded(call, "cuda")
    # The interpreter flag is what lets Triton take CPU tensors; without it an explicit request fails.
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(
        KernelUnavailableError, match=f"impl='triton' for {name} needs CUDA tensors.*TRITON_INTERPRET=1"
    ):
        _seeded(call, "triton")
    assert torch.equal(_seeded(call, "auto"), reference)


@pytest.mark.parametrize("name", ["segment_attention", "rope"])
def test_shapes_the_kernel_cannot_take(name: str) -> None:
    """A head dimension of 24: explicit Triton says why; auto runs the reference."""
    pytest.importorskip("triton")
    call = KERNELS[name]
    with pytest.raises(KernelUnavailableError, match=f"impl='triton' cannot run {name}: head dimension 24"):
        call("triton", 24)  # type: ignore[call-arg]
    torch.manual_seed(0)
    auto = call("auto", 24)  # type: ignore[call-arg]
    torch.manual_seed(0)
    assert torch.equal(auto, call("torch", 24))  # type: ignore[call-arg]


_WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # makes `import triton` fail, as on a machine without it
import torch
from genscore_core import KernelUnavailableError
from tests.helpers.kernel_calls import KERNELS
for name, call in KERNELS.items():
    torch.manual_seed(3)
    reference = call("torch")
    torch.manual_seed(3)
    assert torch.equal(call("auto"), reference), name
    try:
        call("triton")
    except KernelUnavailableError as error:
        assert 'pip install "genscore[triton]"' in str(error) and name in str(error), error
    else:
        raise AssertionError(f"{name}: impl='triton' without triton did not raise")
print("ok")
"""


def test_without_triton_installed() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRITON], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
