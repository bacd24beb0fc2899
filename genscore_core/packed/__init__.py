"""The packed forward: variable-length batches without padding, shared prefixes computed once.

``PackedForward`` meets the forward contract (:class:`~genscore_core.forward.ForwardStrategy`) for Qwen3,
Qwen2 and Llama-style models; ``supports(model)`` says whether a model can use it (the engine falls back
to the padded forward). Its kernels live in :mod:`genscore_core.kernels`; ``PackedOptions`` picks them.
"""

from genscore_core.packed.decoder import PackedDecoder, PackedOptions, supports, unsupported_reason
from genscore_core.packed.forward import DEFAULT_MAX_BATCH_TOKENS, PackedForward
from genscore_core.packed.plan import GroupSlice, PackedBatch, build_batch, plan_batches

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "GroupSlice",
    "PackedBatch",
    "PackedDecoder",
    "PackedForward",
    "PackedOptions",
    "build_batch",
    "plan_batches",
    "supports",
    "unsupported_reason",
]
