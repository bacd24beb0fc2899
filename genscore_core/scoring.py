"""The scoring head: label-token probabilities from last-position hidden states.

Label-normalised scores need only the label rows of the LM head: with two labels the score is
sigmoid(h . (w0 - w1)), exactly softmax([l0, l1])[0], and K labels need K rows. Only the
full-vocabulary probability needs the whole head, and that goes through the label log-prob kernel,
which never holds a [batch, vocabulary] tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from genscore_core.kernels import label_logprobs


class LabelHead:
    """Reads label scores off the LM head of a causal LM without computing full logits."""

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise TypeError(f"{type(model).__name__} has no LM head with a weight to score with")
        config = model.config
        if getattr(config, "final_logit_softcapping", None):
            raise ValueError(
                f"{type(model).__name__} caps its logits (final_logit_softcapping); genscore does not support "
                "soft-capped LM heads yet"
            )
        self.weight: torch.Tensor = head.weight  # [V, H]
        self.bias: torch.Tensor | None = getattr(head, "bias", None)
        # Some heads multiply logits by a constant; folding it into h keeps every path exact.
        self.logit_scale = float(getattr(config, "logit_scale", None) or 1.0)
        self.vocab_size = int(self.weight.shape[0])

    def _prepare(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.to(device=self.weight.device, dtype=torch.float32)
        return h * self.logit_scale if self.logit_scale != 1.0 else h

    def label_logits(self, hidden: torch.Tensor, label_ids: list[int]) -> torch.Tensor:
        """Logits of the label tokens only, in float32: [N, K]."""
        ids = torch.as_tensor(label_ids, device=self.weight.device)
        rows = self.weight.index_select(0, ids).float()  # [K, H]
        logits = self._prepare(hidden) @ rows.T
        if self.bias is not None:
            logits = logits + self.bias.index_select(0, ids).float()
        return logits

    def scores(self, hidden: torch.Tensor, label_ids: list[int], apply_softmax: bool) -> torch.Tensor:
        """Probability of ``label_ids[0]`` for each row: [N] float32.

        ``apply_softmax``: normalise over the label tokens; otherwise over the whole vocabulary.
        """
        if apply_softmax:
            logits = self.label_logits(hidden, label_ids)
            if logits.shape[1] == 1:
                return torch.ones(logits.shape[0], device=logits.device)
            if logits.shape[1] == 2:
                return torch.sigmoid(logits[:, 0] - logits[:, 1])
            return torch.softmax(logits, dim=-1)[:, 0]
        # The kernel accumulates in fp32 but reads h in the head's dtype.
        h = self._prepare(hidden).to(self.weight.dtype)
        ids = torch.as_tensor(label_ids[:1], device=self.weight.device).expand(h.shape[0], 1)
        result = label_logprobs(h, self.weight, ids, bias=self.bias)
        return result.logprobs[:, 0].exp()
