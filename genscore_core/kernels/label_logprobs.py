"""Log-probabilities of a few label tokens under the full-vocabulary softmax.

log P(label | h) = h . W[label] (+ b[label]) - logsumexp_v(h . W[v] (+ b[v]))

The reference walks the vocabulary in chunks with a running logsumexp, so even the fallback never
holds a [B, V] tensor.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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
    rows = weight[label_ids].float()  # [B, K, H]
    label_logits = torch.einsum("bh,bkh->bk", h, rows)
    if bias is not None:
        label_logits = label_logits + bias[label_ids].float()
    logprobs = label_logits - running[:, None]
    if label_mask is not None:
        logprobs = logprobs.masked_fill(~label_mask, float("-inf"))
    return LabelLogprobs(logprobs, running)


def label_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> LabelLogprobs:
    """Label log-probabilities on whatever implementation suits the device."""
    return label_logprobs_reference(hidden, weight, label_ids, label_mask, bias)
