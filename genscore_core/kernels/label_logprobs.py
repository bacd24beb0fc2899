"""Log-probabilities of a few label tokens under the full-vocabulary softmax.

log P(label | h) = h . W[label] (+ b[label]) - logsumexp_v(h . W[v] (+ b[v]))

``label_logprobs`` is the one entry point: it runs the fused Triton kernel
(``label_logprobs_triton.py``) or the plain-torch reference below, as ``impl`` asks
(:mod:`genscore_core.kernels.dispatch`). Neither path ever holds a [B, V] tensor: the kernel keeps a running
max and sum per (row, vocabulary split), and the reference walks the vocabulary in chunks.

Example:
    >>> h = torch.randn(3, 8)
    >>> w = torch.randn(50, 8)
    >>> out = label_logprobs(h, w, torch.tensor([[4, 7]] * 3))
    >>> out.logprobs.shape, out.log_normalizer.shape
    (torch.Size([3, 2]), torch.Size([3]))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from genscore_core.kernels.dispatch import KernelImpl, use_triton

_VOCAB_CHUNK = 16384


class LabelLogprobs(NamedTuple):
    logprobs: torch.Tensor  # [B, K] float32; masked-out labels are -inf
    log_normalizer: torch.Tensor  # [B] float32


def label_logprobs_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> LabelLogprobs:
    """Plain-torch label log-probabilities; fp32 accumulation, vocabulary processed in chunks."""
    # hidden: [B, H], weight: [V, H], label_ids: [B, K], label_mask: [B, K] bool, bias: [V]
    h = hidden.float()
    vocab = weight.shape[0]
    running = torch.full((h.shape[0],), float("-inf"), device=h.device)
    for start in range(0, vocab, _VOCAB_CHUNK):
        w = weight[start : start + _VOCAB_CHUNK].float()
        logits = h @ w.T  # [B, chunk]
        if bias is not None:
            logits = logits + bias[start : start + _VOCAB_CHUNK].float()
        running = torch.logaddexp(running, torch.logsumexp(logits, dim=-1))
    if label_mask is not None:
        # Padded slots may hold any id (-1, V, ...): look up a valid row, then mask the result.
        label_ids = label_ids.masked_fill(~label_mask, 0)
    # NaN for an id outside the vocabulary (only device ids get here unchecked, see label_logprobs),
    # not W[-1] (what indexing makes of -1) or a device-side assert.
    outside = (label_ids < 0) | (label_ids >= vocab)
    label_ids = label_ids.masked_fill(outside, 0)
    rows = weight[label_ids].float()  # [B, K, H]
    label_logits = torch.einsum("bh,bkh->bk", h, rows)
    if bias is not None:
        label_logits = label_logits + bias[label_ids].float()
    logprobs = (label_logits - running[:, None]).masked_fill(outside, float("nan"))
    if label_mask is not None:
        logprobs = logprobs.masked_fill(~label_mask, float("-inf"))
    return LabelLogprobs(logprobs, running)


def _check_inputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden [B, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if label_ids.dim() != 2 or label_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"expected label_ids [B={hidden.shape[0]}, K], got {tuple(label_ids.shape)}")
    if label_ids.dtype.is_floating_point or label_ids.dtype == torch.bool:
        raise TypeError(f"label_ids must be an integer tensor, got {label_ids.dtype}")
    if label_mask is not None and (label_mask.shape != label_ids.shape or label_mask.dtype != torch.bool):
        raise ValueError(
            f"label_mask must be a bool tensor shaped like label_ids {tuple(label_ids.shape)}, "
            f"got {label_mask.dtype} {tuple(label_mask.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"expected bias [V={weight.shape[0]}], got {tuple(bias.shape)}")
    tensors = [hidden, weight, label_ids] + [t for t in (label_mask, bias) if t is not None]
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted({str(t.device) for t in tensors})}")
    if label_ids.device.type == "cpu":  # on a GPU this would wait for the device: NaN there instead
        vocab = weight.shape[0]
        outside = (label_ids < 0) | (label_ids >= vocab)
        if label_mask is not None:
            outside &= label_mask
        if outside.any():
            row, slot = (int(i) for i in outside.nonzero()[0])
            raise ValueError(
                f"label id {int(label_ids[row, slot])} (row {row}, slot {slot}) is outside the "
                f"vocabulary [0, {vocab})"
            )


def label_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    impl: KernelImpl = "auto",
) -> LabelLogprobs:
    """Label log-probabilities on whatever implementation suits the device.

    Args:
        hidden: [B, H] last-position hidden states (bf16, fp16 or fp32).
        weight: [V, H] LM head weight (the embedding matrix when embeddings are tied).
        label_ids: [B, K] integer label ids per row; rows may have different label sets. An
            unmasked id outside [0, V) is a ValueError for CPU ids; GPU ids are not checked (that
            would wait for the device) and such a slot's log-probability is NaN.
        label_mask: Optional [B, K] bool; False marks padding (its id is never read).
        bias: Optional [V] LM head bias.
        impl: "auto" runs the Triton kernel on CUDA tensors when triton works and the torch
            reference otherwise; "triton" forces the kernel (on CPU tensors it needs
            ``TRITON_INTERPRET=1`` set before triton is imported) and raises
            :class:`~genscore_core.errors.KernelUnavailableError` where it cannot run; "torch" forces
            the reference. See :mod:`genscore_core.kernels.dispatch`.

    Returns:
        ``LabelLogprobs(logprobs [B, K] fp32, -inf where masked; log_normalizer [B] fp32)``.
    """
    _check_inputs(hidden, weight, label_ids, label_mask, bias)
    if not use_triton(impl, hidden.device, kernel="label_logprobs"):
        return label_logprobs_reference(hidden, weight, label_ids, label_mask, bias)
    # Imported here so that the package works without triton installed.
    from genscore_core.kernels.label_logprobs_triton import label_logprobs_triton

    return label_logprobs_triton(hidden, weight, label_ids, label_mask, bias)
