"""The one switch between a kernel's Triton implementation and its plain-torch reference.

Every kernel entry point of this package takes ``impl: KernelImpl`` and asks :func:`use_triton`
which implementation runs, so every kernel behaves the same way:

* ``"torch"`` always runs the reference;
* ``"auto"`` runs Triton on CUDA tensors when triton imports and the kernel takes the inputs, and the
  reference otherwise (a CPU, no triton, an unsupported shape);
* ``"triton"`` runs Triton or raises :class:`~genscore_core.errors.KernelUnavailableError` saying what
  to install or set: an explicit request never falls back silently.
"""

from __future__ import annotations

import functools
import os
from typing import Literal, get_args

import torch

from genscore_core.errors import KernelUnavailableError

KernelImpl = Literal["auto", "triton", "torch"]
"""Which implementation a kernel runs; see :func:`use_triton`."""

_IMPLS = get_args(KernelImpl)

INSTALL_HINT = 'pip install "genscore[triton]"'


@functools.cache
def triton_import_error() -> str | None:
    """Why ``import triton`` fails here, or None when it works (checked once per process)."""
    try:
        import triton  # noqa: F401
    except Exception as error:  # a broken install raises more than ImportError
        return f"{type(error).__name__}: {error}"
    return None


def use_triton(
    impl: KernelImpl, device: torch.device, *, kernel: str, unsupported: str | None = None
) -> bool:
    """Whether ``kernel`` runs its Triton implementation on tensors on ``device``.

    Args:
        impl: The caller's request.
        device: Where the kernel's inputs live.
        kernel: The kernel's name, for error messages.
        unsupported: Why the Triton kernel cannot take these particular inputs (a head dimension that
            is not a power of two, ...), or None when it can.

    Raises:
        ValueError: ``impl`` is not one of "auto", "triton", "torch".
        KernelUnavailableError: ``impl="triton"`` and the kernel cannot run here.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "torch":
        return False
    if impl == "auto" and device.type != "cuda":
        return False  # decided without importing triton, which takes a while
    problem = triton_import_error()
    if problem is not None:
        if impl == "triton":
            raise KernelUnavailableError(
                f"impl='triton' for {kernel} needs a working triton ({problem}): {INSTALL_HINT}, "
                "or pass impl='auto' or 'torch'",
                setting="impl",
            )
        return False
    # The interpreter flag is read when kernels are defined, so it only counts if it was set before.
    on_device = device.type == "cuda" or (impl == "triton" and os.environ.get("TRITON_INTERPRET") == "1")
    if not on_device:
        if impl == "triton":
            raise KernelUnavailableError(
                f"impl='triton' for {kernel} needs CUDA tensors (got {device.type}); to run Triton on "
                "the CPU set TRITON_INTERPRET=1 before triton is imported, or pass impl='auto' or 'torch'",
                setting="impl",
            )
        return False
    if unsupported is not None:
        if impl == "triton":
            raise KernelUnavailableError(f"impl='triton' cannot run {kernel}: {unsupported}", setting="impl")
        return False
    return True
