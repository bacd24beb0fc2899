"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter; no other test does.

TRITON_INTERPRET is read twice. ``@triton.jit`` reads it when a kernel module is imported (the
kernel becomes an interpreted function for the life of the process), and
:func:`genscore_core.kernels.dispatch.use_triton` reads it at each call (``impl="triton"`` on CPU
tensors needs it). So this conftest imports the kernel modules under the setting when the folder is
collected, before any test module here imports them, and takes the setting back at once; each test
here then has it for its own duration only (``_triton_interpreter``). The rest of the process never
sees it (tests/test_suite_layout.py checks that). A value the caller set is kept, whatever it is.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest
import torch

from genscore_core.kernels.dispatch import TRITON_MODULES, triton_import_error


def _import_kernels_interpreted() -> None:
    caller_set = "TRITON_INTERPRET" in os.environ
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        if triton_import_error() is None:
            for name in TRITON_MODULES:
                importlib.import_module(name)
    finally:
        if not caller_set:
            del os.environ["TRITON_INTERPRET"]


_import_kernels_interpreted()


@pytest.fixture(autouse=True)
def _triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if "TRITON_INTERPRET" not in os.environ:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
