"""Compute kernels used by the scoring engine, each beside its plain-torch reference."""

from genscore_core.kernels.label_logprobs import LabelLogprobs, label_logprobs, label_logprobs_reference

__all__ = ["LabelLogprobs", "label_logprobs", "label_logprobs_reference"]
