"""``PackedForward``: the engine's forward strategy without padding, with shared prefixes computed once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from genscore_core.batching import is_out_of_memory
from genscore_core.forward import PrefixGroup, ProgressCallback
from genscore_core.packed.decoder import DeviceBatch, PackedDecoder
from genscore_core.packed.plan import build_batch, plan_batches

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_TOKENS = 65536
_MIN_BATCH_TOKENS = 1024


class PackedForward:
    """Variable-length batches by a token budget; each group's shared prefix is computed once.

    Implements :class:`~genscore_core.forward.ForwardStrategy` for Qwen3, Qwen2 and Llama-style causal
    LMs (see :func:`~genscore_core.packed.supports`), reading the loaded model's weights in place.

    Args:
        model: The causal LM.
        max_batch_tokens: Tokens computed per forward batch (no padding; a shared prefix counts once).
            Memory grows with it: about 24 KB a token for a Qwen3-0.6B shape in bf16 (0.97 GiB
            at 64k on W1, docs/benchmarks.md).
    """

    def __init__(self, model: Any, *, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> None:
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.decoder = PackedDecoder(model)
        self.max_batch_tokens = max_batch_tokens

    @torch.inference_mode()
    def last_hidden_states(
        self, groups: Sequence[PrefixGroup], on_progress: ProgressCallback | None = None
    ) -> torch.Tensor:
        """Final-norm hidden states (float32) at each prompt's last token: [prompts, hidden]."""
        while True:
            try:
                return self._run(groups, on_progress)
            except (torch.OutOfMemoryError, RuntimeError) as error:
                if not is_out_of_memory(error) or self.max_batch_tokens <= _MIN_BATCH_TOKENS:
                    raise
            # Fewer tokens per batch from now on; the whole call starts again.
            self.max_batch_tokens = max(self.max_batch_tokens // 2, _MIN_BATCH_TOKENS)
            logger.warning("out of memory: max_batch_tokens lowered to %d", self.max_batch_tokens)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _run(self, groups: Sequence[PrefixGroup], on_progress: ProgressCallback | None) -> torch.Tensor:
        decoder = self.decoder
        plans = plan_batches(groups, self.max_batch_tokens)
        last_batch = {part.group: b for b, slices in enumerate(plans) for part in slices}
        # K/V of prefixes whose group goes on in a later batch: [layers, P, Hkv, D] each.
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        outputs: list[torch.Tensor] = []
        for b, slices in enumerate(plans):
            batch = build_batch(groups, slices)
            dev = DeviceBatch.from_batch(batch, decoder.device)
            loaded = None
            if batch.load:
                keys = [cache[g] for g, _ in batch.load]
                loaded = (torch.cat([k for k, _ in keys], dim=1), torch.cat([v for _, v in keys], dim=1))
            hidden, saved = decoder.run(dev, loaded)
            if saved is not None:
                offset = 0
                for g, slots in batch.save:
                    n = slots.numel()
                    cache[g] = (saved[0][:, offset : offset + n], saved[1][:, offset : offset + n])
                    offset += n
            for part in slices:
                if last_batch[part.group] == b:
                    cache.pop(part.group, None)
            outputs.append(hidden)
            if on_progress is not None:
                on_progress(batch.num_prompts)
        if not outputs:
            return torch.empty(0, self.decoder.final_norm.shape[0], device=decoder.device)
        return torch.cat(outputs)
