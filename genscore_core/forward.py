"""Prefill-only forward passes that return the hidden state at the last position of each prompt.

Nothing here computes logits: the scoring head reads only the label rows of the LM head afterwards.
:class:`ForwardStrategy` is the contract every forward meets; :class:`PaddedForward` (any Hugging Face
causal LM) and :class:`~genscore_core.packed.PackedForward` (no padding, shared prefixes computed once)
implement it, and :func:`~genscore_core.engine.select_forward` is the one place that picks one.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

from genscore_core.batching import is_out_of_memory, left_pad, length_sorted_batches
from genscore_core.prefixes import PrefixGroup

if TYPE_CHECKING:
    from genscore_core.streaming import RowReduction, StreamBatch

__all__ = [
    "ForwardStrategy",
    "PaddedForward",
    "PrefixGroup",
    "ProgressCallback",
    "StreamingForward",
    "decoder_of",
]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int], None]

BatchT = TypeVar("BatchT")
CallT = TypeVar("CallT")


class ForwardStrategy(ABC, Generic[CallT, BatchT]):
    """The contract of a forward: token ids in, final-norm hidden states out.

    ``last_hidden_states(groups, on_progress)`` returns, for every prompt (group order, then prompt
    order within a group), the hidden state after the model's final norm at the prompt's last
    position, as **float32** ``[prompts, hidden]`` on the model's device, whatever the model's dtype:
    the final norm is computed in float32, so the label logits the head takes from it (a float32
    product with the label rows) do not depend on which forward ran beyond the decoder layers' own
    arithmetic. It returns hidden states rather than label logits because the full-vocabulary score
    (``apply_softmax=False``) needs the whole LM head, which the head's kernel reads in one pass.

    Every forward shares, through this class:

    * **the token budget**: ``max_batch_tokens`` bounds the token positions one batch runs through
      the model, which is what activation memory grows with. The padded forward runs rows x longest
      prompt (padding included); the packed forward runs each prompt's own tokens plus each shared
      prefix once. A single prompt longer than the budget runs alone rather than failing.
    * **the out-of-memory policy**: a batch that runs out of device memory is split in two halves
      that are retried in its place, and the budget of this forward is lowered to half of what
      failed (for the batches still to come in this call, which are planned again, and for later
      calls). Work already done is kept: no batch is run twice after it succeeded, and progress
      is reported once per prompt. A single prompt that does not fit re-raises the error.
    * **inference mode**: set here, once, around the whole call (the engine does not set it again).
    * **progress**: ``on_progress(n)`` is called after each batch with the ``n`` prompts it finished.

    Subclasses say how to plan, cost, split and run their batches; ``CallT`` is the per-call state
    (outputs, caches) and ``BatchT`` one batch.
    """

    max_batch_tokens: int

    def rebuild(self) -> None:
        """Build again what this forward derived from the model's tensors (its device, fused weights)
        once the model was moved, cast or given other parameters; the engine calls it when it sees
        that (:mod:`genscore_core.weights_seen`). Nothing to do by default."""

    def prepare(self, groups: Sequence[PrefixGroup]) -> object | None:
        """Host work of a later :meth:`last_hidden_states` of ``groups`` done now (the batches planned
        and laid out), on any thread, while the device runs something else; None where a forward has
        nothing to do ahead. Pass the result as ``prepared``."""
        return None

    @torch.inference_mode()
    def last_hidden_states(
        self,
        groups: Sequence[PrefixGroup],
        on_progress: ProgressCallback | None = None,
        prepared: object | None = None,
    ) -> torch.Tensor:
        """Float32 final-norm hidden states at each prompt's last position: [prompts, hidden].

        ``prepared``: what :meth:`prepare` made of the same groups; a batch planned differently by
        now (the budget was lowered after running out of memory) is laid out again.
        """
        call = self._start(groups, prepared)
        queue = deque(self._plan(call, None, self.max_batch_tokens))
        while queue:
            batch = queue.popleft()
            error = self._try_batch(call, batch)
            if error is not None:
                halves = self._split(call, batch)
                if halves is None:
                    raise error
                # Dropping the error frees the failed attempt's tensors (its traceback holds them).
                del error
                self._lower_budget(self._cost(call, batch))
                queue = deque([*halves, *self._plan(call, list(queue), self.max_batch_tokens)])
                continue
            if on_progress is not None:
                on_progress(self._prompts(batch))
        hidden = self._finish(call)
        assert hidden.dtype == torch.float32, "the forward contract is float32 out"
        return hidden

    def _try_batch(self, call: CallT, batch: BatchT) -> BaseException | None:
        """Run one batch; the error when it ran out of memory (anything else propagates)."""
        try:
            self._run_batch(call, batch)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            return error
        return None

    def _lower_budget(self, failed_cost: int) -> None:
        budget = max(1, min(self.max_batch_tokens, failed_cost // 2))
        if budget < self.max_batch_tokens:
            logger.warning(
                "out of memory on a batch of %d tokens: max_batch_tokens lowered from %d to %d",
                failed_cost, self.max_batch_tokens, budget,
            )  # fmt: skip
            self.max_batch_tokens = budget
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @abstractmethod
    def _start(self, groups: Sequence[PrefixGroup], prepared: object | None = None) -> CallT:
        """The per-call state (with :meth:`prepare`'s result, where there is one)."""

    @abstractmethod
    def _plan(self, call: CallT, remaining: list[BatchT] | None, budget: int) -> list[BatchT]:
        """Batches of at most ``budget`` tokens: of every prompt (``remaining`` None), or of the
        prompts of ``remaining``, the batches not yet run, in the same order."""

    @abstractmethod
    def _cost(self, call: CallT, batch: BatchT) -> int:
        """Token positions ``batch`` runs through the model (what ``max_batch_tokens`` bounds)."""

    @abstractmethod
    def _split(self, call: CallT, batch: BatchT) -> tuple[BatchT, BatchT] | None:
        """Two halves of ``batch`` in order, or None for a single prompt."""

    @abstractmethod
    def _prompts(self, batch: BatchT) -> int:
        """How many prompts ``batch`` finishes."""

    @abstractmethod
    def _run_batch(self, call: CallT, batch: BatchT) -> None:
        """Run ``batch`` and keep its outputs in ``call``; on an exception ``call`` is unchanged."""

    @abstractmethod
    def _finish(self, call: CallT) -> torch.Tensor:
        """The outputs of every prompt in order, float32."""


@runtime_checkable
class StreamingForward(Protocol):
    """An optional capability of a forward: it runs batches as a producer thread lays them out
    (:class:`~genscore_core.packed.PackedForward`), so the engine streams text calls
    (:meth:`~genscore_core.engine.ScoringEngine.score_stream`, :mod:`genscore_core.streaming`)."""

    max_batch_tokens: int

    def prepare_stream_batch(self, batch: StreamBatch) -> Any:
        """Lay out ``batch`` and start its copy to the device (called on the producer thread)."""

    def run_stream(
        self,
        batches: Iterable[Any],
        on_progress: ProgressCallback | None = None,
        reduce: RowReduction | None = None,
    ) -> Any:
        """Run prepared batches in order; (float32 hidden states [rows, H], the row keys in order), or
        with ``reduce``, its results of each batch's hidden states concatenated in their place."""


def decoder_of(model: Any) -> Any:
    """The causal LM's backbone (``model.model`` for Qwen/Llama), whose output is already normed."""
    decoder = getattr(model, model.base_model_prefix, None)
    if decoder is None:
        raise TypeError(f"{type(model).__name__} exposes no decoder under {model.base_model_prefix!r}")
    return decoder


@dataclass
class _PaddedCall:
    prompts: list[list[int]]
    rows: list[torch.Tensor | None]


class PaddedForward(ForwardStrategy[_PaddedCall, list[int]]):
    """Left-padded batches through the model's own forward; works for any Hugging Face causal LM.

    Batches are length-sorted; ``max_batch_tokens`` bounds rows x longest prompt of a batch and
    ``max_batch_size`` its rows. The decoder's final norm (``decoder.norm``, where the model has
    one) is computed again in float32 on the last positions, from the input the model's own norm
    received, with the model's own norm code and float32 copies of its weights; models without such
    a module (or whose norm is offloaded or quantised) return their last hidden state cast to float32.
    """

    def __init__(self, model: Any, *, pad_token_id: int, max_batch_tokens: int, max_batch_size: int) -> None:
        if max_batch_tokens <= 0 or max_batch_size <= 0:
            raise ValueError(
                f"max_batch_tokens and max_batch_size must be positive, got {max_batch_tokens}, {max_batch_size}"
            )
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.rebuild()

    def rebuild(self) -> None:
        """Note the model's decoder, device and final norm again (they are read at each batch)."""
        model = self.model
        self.decoder = decoder_of(model)
        self.device = next(model.parameters()).device
        self.hidden_size = int(model.get_input_embeddings().weight.shape[1])
        norm = getattr(self.decoder, "norm", None)
        self.final_norm: torch.nn.Module | None = None
        # Offloading hooks (accelerate) or quantised weights would not survive a float32 copy.
        if isinstance(norm, torch.nn.Module) and not hasattr(norm, "_hf_hook"):
            if all(p.is_floating_point() and not p.is_meta for p in norm.parameters()):
                self.final_norm = norm

    def _start(self, groups: Sequence[PrefixGroup], prepared: object | None = None) -> _PaddedCall:
        prompts = [prompt for group in groups for prompt in group.prompts()]
        return _PaddedCall(prompts, [None] * len(prompts))

    def _plan(self, call: _PaddedCall, remaining: list[list[int]] | None, budget: int) -> list[list[int]]:
        indices = list(range(len(call.prompts))) if remaining is None else [i for b in remaining for i in b]
        lengths = [len(call.prompts[i]) for i in indices]
        return [
            [indices[j] for j in batch]
            for batch in length_sorted_batches(lengths, budget, self.max_batch_size)
        ]

    def _cost(self, call: _PaddedCall, batch: list[int]) -> int:
        return len(batch) * max(len(call.prompts[i]) for i in batch)

    def _split(self, call: _PaddedCall, batch: list[int]) -> tuple[list[int], list[int]] | None:
        if len(batch) < 2:
            return None
        middle = len(batch) // 2
        return batch[:middle], batch[middle:]

    def _prompts(self, batch: list[int]) -> int:
        return len(batch)

    def _run_batch(self, call: _PaddedCall, batch: list[int]) -> None:
        input_ids, attention_mask, position_ids = left_pad(
            [call.prompts[i] for i in batch], self.pad_token_id, self.device
        )
        captured: list[torch.Tensor] = []
        handle = None
        if self.final_norm is not None:
            handle = self.final_norm.register_forward_pre_hook(
                lambda _module, args: captured.append(args[0][:, -1])
            )
        try:
            output = self.decoder(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )
        finally:
            if handle is not None:
                handle.remove()
        if self.final_norm is not None and len(captured) == 1:
            params = {name: p.float() for name, p in self.final_norm.named_parameters()}
            last = torch.func.functional_call(self.final_norm, params, (captured[0].float(),))
        else:
            last = output.last_hidden_state[:, -1]
        for index, row in zip(batch, last.float().unbind(0)):
            call.rows[index] = row

    def _finish(self, call: _PaddedCall) -> torch.Tensor:
        if not call.rows:
            return torch.empty(0, self.hidden_size, dtype=torch.float32, device=self.device)
        return torch.stack([row for row in call.rows if row is not None])
