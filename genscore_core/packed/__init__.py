"""The packed forward: variable-length batches without padding, shared prefixes computed once.

``PackedForward`` implements the engine's ``ForwardStrategy`` for Qwen3, Qwen2 and Llama-style models;
``supports(model)`` says whether a model can use it (the engine falls back to the padded forward).
"""

from genscore_core.packed.decoder import PackedDecoder, supports, unsupported_reason
from genscore_core.packed.forward import DEFAULT_MAX_BATCH_TOKENS, PackedForward
from genscore_core.packed.plan import GroupSlice, PackedBatch, build_batch, plan_batches

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "GroupSlice",
    "PackedBatch",
    "PackedDecoder",
    "PackedForward",
    "build_batch",
    "plan_batches",
    "supports",
    "unsupported_reason",
]
