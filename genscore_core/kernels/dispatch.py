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


TRITON_MODULES = (
    "genscore_core.kernels.attention_triton",
    "genscore_core.kernels.fused_ops_triton",
    "genscore_core.kernels.gated_mlp_triton",
    "genscore_core.kernels.label_logprobs_triton",
)
"""genscore's Triton kernels, one module per kernel family (each imports triton at the top)."""


def prepare_triton() -> bool:
    """Do ahead of time the host work of a process's first Triton launch that needs no GPU.

    Before its first launch finds a compiled kernel in Triton's on-disk cache, a process computes
    Triton's own cache key (hashing its installation, the 0.4 s of a 400 MB ``libtriton`` included,
    measured on an H200 machine), imports Triton's Gluon front end (0.13 s) and hashes each kernel's
    source and what it calls. None of it touches CUDA, so a worker can do it before it knows its GPU
    (Ray's pooled workers, ``genscore_integrations.ray_preload``). Repeating it costs nothing; where
    triton does not import it does nothing and returns False.
    """
    if triton_import_error() is not None:
        return False
    import importlib

    from triton.runtime import cache
    from triton.runtime.jit import JITFunction

    compiler_key = getattr(cache, "triton_key", None)  # functools.lru_cache'd in Triton 3.x
    if compiler_key is not None:
        compiler_key()
    try:
        importlib.import_module("triton.experimental.gluon")
    except ImportError:  # older Triton has no Gluon, and no Gluon to import at launch either
        pass
    for name in TRITON_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, JITFunction):
                getattr(value, "cache_key", None)  # computed once, then kept on the function
    return True
