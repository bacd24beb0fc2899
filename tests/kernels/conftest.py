"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

TRITON_INTERPRET is read when a ``@triton.jit`` function is defined, so it is set here, at
collection time, before any test imports the kernel module. It only changes how Triton runs
kernels; setdefault keeps a value the caller chose.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
