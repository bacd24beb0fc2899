"""Prefill-only forward passes that return the hidden state at the last position of each prompt.

Nothing here computes logits: the scoring head reads only the label rows of the LM head afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from genscore_core.batching import left_pad, length_sorted_batches, run_splitting_on_oom

ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class PrefixGroup:
    """Prompts that start with the same tokens: the shared prefix, then each prompt's own rest."""

    prefix_ids: list[int]
    suffix_ids: list[list[int]]
    """One entry per prompt; each non-empty."""

    def prompts(self) -> list[list[int]]:
        return [self.prefix_ids + suffix for suffix in self.suffix_ids]


class ForwardStrategy(Protocol):
    def last_hidden_states(
        self, groups: Sequence[PrefixGroup], on_progress: ProgressCallback | None = None
    ) -> torch.Tensor:
        """Hidden states after the final norm at each prompt's last position: [prompts, hidden].

        Rows follow group order, then prompt order within a group. ``on_progress(n)`` is called as
        ``n`` more prompts are done.
        """
        ...


def decoder_of(model: Any) -> Any:
    """The causal LM's backbone (``model.model`` for Qwen/Llama), whose output is already normed."""
    decoder = getattr(model, model.base_model_prefix, None)
    if decoder is None:
        raise TypeError(f"{type(model).__name__} exposes no decoder under {model.base_model_prefix!r}")
    return decoder


class PaddedForward:
    """Left-padded batches through the model's own forward; works for any Hugging Face causal LM."""

    def __init__(self, model: Any, *, pad_token_id: int, max_batch_tokens: int, max_batch_size: int) -> None:
        self.decoder = decoder_of(model)
        self.device = next(model.parameters()).device
        self.pad_token_id = pad_token_id
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size

    def _run(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        input_ids, attention_mask, position_ids = left_pad(prompts, self.pad_token_id, self.device)
        output = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        last = output.last_hidden_state[:, -1]  # [B, H]
        return list(last.unbind(0))

    @torch.inference_mode()
    def last_hidden_states(
        self, groups: Sequence[PrefixGroup], on_progress: ProgressCallback | None = None
    ) -> torch.Tensor:
        prompts = [prompt for group in groups for prompt in group.prompts()]
        rows: list[torch.Tensor | None] = [None] * len(prompts)
        batches = length_sorted_batches([len(p) for p in prompts], self.max_batch_tokens, self.max_batch_size)
        for batch in batches:
            hidden = run_splitting_on_oom(lambda b: self._run([prompts[i] for i in b]), batch)
            for index, row in zip(batch, hidden):
                rows[index] = row
            if on_progress is not None:
                on_progress(len(batch))
        return torch.stack([row for row in rows if row is not None])
