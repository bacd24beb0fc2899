"""Compute kernels of the scoring engine, each a Triton kernel beside its plain-torch reference.

=====================  ===========================  ============================  =====================
kernel                 entry point (``impl=``)      Triton implementation         torch reference
=====================  ===========================  ============================  =====================
label log-probs        ``label_logprobs``           ``label_logprobs_triton.py``  ``label_logprobs_reference``
segment attention      ``segment_attention``        ``attention_triton.py``       ``segment_attention_reference``
add + RMSNorm          ``add_rmsnorm``              ``fused_ops_triton.py``       ``fused_ops.add_rmsnorm``
q/k norm + rotary      ``rope``                     ``fused_ops_triton.py``       ``fused_ops.rope``
silu * mul             ``silu_mul``                 ``fused_ops_triton.py``       ``fused_ops.silu_mul``
gate/up + silu*mul     ``gated_mlp``                ``gated_mlp_triton.py``       ``gated_mlp.gated_mlp``
=====================  ===========================  ============================  =====================

Every entry point takes ``impl: KernelImpl`` ("auto", "triton", "torch"), resolved by the one function
:func:`~genscore_core.kernels.dispatch.use_triton`. The Triton modules import triton at the top and are
imported only when a Triton kernel runs, so the package works without triton.
"""

from genscore_core.kernels.attention import (
    DEFAULT_TILING,
    LAST_TOKEN_TILING,
    AttentionTiling,
    Segments,
    segment_attention,
    segment_attention_reference,
)
from genscore_core.kernels.dispatch import KernelImpl, use_triton
from genscore_core.kernels.fused_ops import add_rmsnorm, rope, silu_mul
from genscore_core.kernels.gated_mlp import gated_mlp
from genscore_core.kernels.label_logprobs import LabelLogprobs, label_logprobs, label_logprobs_reference

__all__ = [
    "DEFAULT_TILING",
    "LAST_TOKEN_TILING",
    "AttentionTiling",
    "KernelImpl",
    "LabelLogprobs",
    "Segments",
    "add_rmsnorm",
    "gated_mlp",
    "label_logprobs",
    "label_logprobs_reference",
    "rope",
    "segment_attention",
    "segment_attention_reference",
    "silu_mul",
    "use_triton",
]
