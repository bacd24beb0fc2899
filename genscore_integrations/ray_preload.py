"""What Ray's pooled workers import ahead of a scoring actor (listed in ``WORKER_PRELOAD_MODULES``).

Importing this module imports the Ray integration and does the GPU-free part of a process's first
Triton kernel launch (:func:`genscore_core.kernels.dispatch.prepare_triton`: about half a second on
an H200 machine), so that an actor later started in such a worker skips both. Nothing here touches
CUDA: the actor still sees only the GPU Ray gives it.
"""

from __future__ import annotations

import genscore_integrations.ray  # noqa: F401 - imported to be preloaded
from genscore_core.kernels.dispatch import prepare_triton

prepare_triton()
