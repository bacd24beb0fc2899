"""``PackedForward``: the engine's forward strategy without padding, with shared prefixes computed once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from genscore_core.forward import ForwardStrategy, PrefixGroup, ProgressCallback
from genscore_core.packed.decoder import (
    DeviceBatch,
    HostBatch,
    PackedDecoder,
    PackedOptions,
    unsupported_reason,
)
from genscore_core.packed.graphs import DecoderGraphs, GraphLadder
from genscore_core.packed.plan import GroupSlice, PackedBatch, build_batch, plan_batches
from genscore_core.streaming import RowKey, RowReduction, StreamBatch

DEFAULT_MAX_BATCH_TOKENS = 65536


@dataclass(frozen=True)
class PreparedBatches:
    """The batches of one call planned and laid out on the host ahead (:meth:`PackedForward.prepare`)."""

    budget: int
    """The token budget they were planned with."""
    batches: dict[tuple[GroupSlice, ...], HostBatch]
    """Each planned batch's slices (prefix flags included) -> its host layout."""


@dataclass
class _PackedCall:
    groups: Sequence[PrefixGroup]
    prepared: dict[tuple[GroupSlice, ...], HostBatch] = field(default_factory=dict)
    """Batches laid out ahead, by their slices; a batch planned otherwise is built when it runs."""
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    """(group, first prompt) of each finished slice -> its rows."""
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """K/V [layers, P, Hkv, D] of the prefixes of groups that go on in a later batch."""


class PackedForward(ForwardStrategy[_PackedCall, list[GroupSlice]]):
    """Variable-length batches by a token budget; each group's shared prefix is computed once.

    Meets :class:`~genscore_core.forward.ForwardStrategy` for Qwen3, Qwen2 and Llama-style causal LMs
    (see :func:`~genscore_core.packed.supports`), reading the loaded model's weights in place.

    Args:
        model: The causal LM.
        max_batch_tokens: Token positions run per batch: every prompt's own tokens, plus each shared
            prefix once, in the batch that computes it (a later batch of the same group reads its
            keys and values back). Memory grows with it: about 24 KB a token for a Qwen3-0.6B shape
            in bf16 (0.97 GiB at 64k on W1, docs/benchmarks.md, "Packed forward").
        options: Which implementation each of the decoder's kernels runs (tests run Triton's on the
            CPU through its interpreter).
        cuda_graphs: Capture the ladder of CUDA graphs now (:mod:`genscore_core.packed.graphs`;
            on CUDA with the Triton attention only), so that no call pays for a capture; False:
            every batch runs eagerly.
    """

    def __init__(
        self,
        model: Any,
        *,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        options: PackedOptions | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.decoder = decoder = PackedDecoder(model, options)
        self.max_batch_tokens = max_batch_tokens
        self.cuda_graphs = cuda_graphs
        self._unpadded_batches = 0
        self.graphs: DecoderGraphs | None = _graphs_of(decoder, max_batch_tokens, cuda_graphs)
        """The ladder of CUDA graphs, captured; only where the attention reads its segments on the
        device (the Triton kernel), since the torch attention's loop over segments would be frozen in."""

    @property
    def eager_batches(self) -> int:
        """Batches run eagerly, not through a CUDA graph (a server reports it in ``/stats``): those
        that fit no rung, and those the ladder ran eagerly because padding to their rung cost more
        (:attr:`~genscore_core.packed.graphs.DecoderGraphs.eager_runs`)."""
        graphs = self.graphs
        return self._unpadded_batches + (graphs.eager_runs if graphs is not None else 0)

    def rebuild(self) -> None:
        """A new decoder over the model as it is now, with the same options: its parameters fused
        again (in place, where a move or cast left them separate tensors), its device, dtype and
        kernels resolved again, its CUDA graphs dropped (they captured the old tensors' addresses).

        Raises ValueError when the packed forward cannot run the model any more (say, split over
        several devices), naming why.
        """
        options = self.decoder.options
        reason = unsupported_reason(self.model)
        if reason is not None:
            raise ValueError(
                f"the model changed after the scorer was built and the packed forward cannot run it now: "
                f"{reason}; build the scorer again from the model as it is (forward='padded' runs any model)"
            )
        if self.graphs is not None and self.graphs.graphs:
            # A replay launched by an earlier call may still run on the device (a server collects
            # scores on another thread): let it finish before its graph and memory pool go.
            torch.cuda.synchronize(self.decoder.device)
        self.graphs = None
        self.decoder = PackedDecoder(self.model, options)
        self.graphs = _graphs_of(self.decoder, self.max_batch_tokens, self.cuda_graphs)

    # -- the streamed entry point (genscore_core.streaming) -------------------------------------------

    def prepare_stream_batch(self, batch: StreamBatch) -> tuple[StreamBatch, DeviceBatch]:
        """Lay out a planned batch and start its copy to the device (on the producer thread)."""
        slices = [
            GroupSlice(g, 0, len(group.suffix_ids), batch.compute_prefix[g], batch.save_prefix[g])
            for g, group in batch.groups.items()
        ]
        return batch, DeviceBatch.from_batch(build_batch(batch.groups, slices), self.decoder.device)

    @torch.inference_mode()
    def run_stream(
        self,
        batches: Iterable[tuple[StreamBatch, DeviceBatch]],
        on_progress: ProgressCallback | None = None,
        reduce: RowReduction | None = None,
    ) -> tuple[torch.Tensor, list[RowKey]]:
        """Run batches in the order a producer hands them over (:meth:`prepare_stream_batch`).

        Returns the float32 final-norm hidden states of every row and each row's key; with
        ``reduce``, what it makes of each batch's hidden states and keys instead (the engine's
        scores, so that a call keeps a few bytes a row, not a hidden state). Nothing here
        waits for the GPU, so the producer lays out batch k+1 while batch k runs. A batch may replay
        a CUDA graph (:meth:`decode`); the producer's copy then goes unused. An out-of-memory
        error propagates: the engine then scores the call again through :meth:`last_hidden_states`,
        whose policy splits batches.
        """
        decoder = self.decoder
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        outputs: list[torch.Tensor] = []
        rows: list[RowKey] = []
        for planned, dev in batches:
            packed = dev.batch
            loaded = None
            if packed.load:
                keys = [cache[g] for g, _ in packed.load]
                loaded = (torch.cat([k for k, _ in keys], dim=1), torch.cat([v for _, v in keys], dim=1))
            hidden, saved = self.decode(packed, dev, loaded)
            if saved is not None:
                offset = 0
                for g, slots in packed.save:
                    n = slots.numel()
                    cache[g] = (saved[0][:, offset : offset + n], saved[1][:, offset : offset + n])
                    offset += n
            for g in planned.release:
                cache.pop(g, None)
            batch_rows = planned.ordered_rows()
            outputs.append(hidden if reduce is None else reduce(hidden, batch_rows))
            rows.extend(batch_rows)
            if on_progress is not None:
                on_progress(planned.num_prompts)
        if not outputs:
            width = (decoder.final_norm.shape[0],) if reduce is None else ()
            return torch.empty(0, *width, device=decoder.device), rows
        return torch.cat(outputs), rows

    def prepare(self, groups: Sequence[PrefixGroup]) -> PreparedBatches:
        """Plan the call's batches as :meth:`last_hidden_states` will and lay each out on the host
        (page-locked, ready for one copy): the host work before the first kernel and between
        batches, done while the device runs an earlier call."""
        budget = self.max_batch_tokens
        device = self.decoder.device
        batches = {
            _key(groups, slices): HostBatch.of(build_batch(groups, slices), device)
            for slices in plan_batches(groups, budget, rungs=self._rungs())
        }
        return PreparedBatches(budget, batches)

    def _start(self, groups: Sequence[PrefixGroup], prepared: object | None = None) -> _PackedCall:
        call = _PackedCall(groups)
        if isinstance(prepared, PreparedBatches) and prepared.budget == self.max_batch_tokens:
            call.prepared = dict(prepared.batches)
        return call

    def _plan(
        self, call: _PackedCall, remaining: list[list[GroupSlice]] | None, budget: int
    ) -> list[list[GroupSlice]]:
        if remaining is None:
            return plan_batches(call.groups, budget, rungs=self._rungs())
        ranges = [(s.group, s.start, s.stop) for slices in remaining for s in slices]
        return plan_batches(
            call.groups, budget, ranges=ranges, prefix_ready=call.cache.keys(), rungs=self._rungs()
        )

    def _rungs(self) -> tuple[int, ...]:
        """The token sizes batches are filled up to: the graphs' rungs (none without graphs)."""
        graphs = self.graphs
        return graphs.ladder.tokens if graphs is not None and graphs.disabled is None else ()

    def _cost(self, call: _PackedCall, batch: list[GroupSlice]) -> int:
        return build_batch(call.groups, self._flagged(call, batch)).num_tokens

    def _split(
        self, call: _PackedCall, batch: list[GroupSlice]
    ) -> tuple[list[GroupSlice], list[GroupSlice]] | None:
        prompts = [(s.group, i) for s in batch for i in range(s.start, s.stop)]
        if len(prompts) < 2:
            return None
        middle = len(prompts) // 2
        return _slices(prompts[:middle]), _slices(prompts[middle:])

    def _prompts(self, batch: list[GroupSlice]) -> int:
        return sum(s.stop - s.start for s in batch)

    def _flagged(self, call: _PackedCall, batch: list[GroupSlice]) -> list[GroupSlice]:
        """``batch`` with the prefix flags of this moment: a prefix is computed unless a previous
        batch kept it, and kept when the group goes on after this batch."""
        flagged = []
        for s in batch:
            has_prefix = len(call.groups[s.group].prefix_ids) > 0
            compute = s.group not in call.cache
            goes_on = s.stop < len(call.groups[s.group].suffix_ids)
            flagged.append(
                dataclasses.replace(s, compute_prefix=compute, save_prefix=compute and goes_on and has_prefix)
            )
        return flagged

    def _run_batch(self, call: _PackedCall, batch: list[GroupSlice]) -> None:
        slices = self._flagged(call, batch)
        host = call.prepared.pop(_key(call.groups, slices), None) if call.prepared else None
        packed = host.batch if host is not None else build_batch(call.groups, slices)
        loaded = None
        if packed.load:
            keys = [call.cache[g] for g, _ in packed.load]
            loaded = (torch.cat([k for k, _ in keys], dim=1), torch.cat([v for _, v in keys], dim=1))
        hidden, saved = self.decode(packed, None, loaded, host=host)
        # Only now, with the batch done, does the call's state change.
        if saved is not None:
            offset = 0
            for g, slots in packed.save:
                n = slots.numel()
                call.cache[g] = (saved[0][:, offset : offset + n], saved[1][:, offset : offset + n])
                offset += n
        offset = 0
        for s in slices:
            n = s.stop - s.start
            call.outputs[(s.group, s.start)] = hidden[offset : offset + n]
            offset += n
            if s.stop == len(call.groups[s.group].suffix_ids):
                call.cache.pop(s.group, None)

    def decode(
        self,
        packed: PackedBatch,
        dev: DeviceBatch | None,
        loaded: tuple[torch.Tensor, torch.Tensor] | None,
        *,
        host: HostBatch | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """One batch through the decoder: the replay of the graph of the smallest rung it fits,
        else eagerly (``dev``, when the caller already copied the batch to the device, or a copy of
        ``host``, its layout made ahead, or a new copy).

        Returns the decoder's rows of the batch's prompts and the prefix keys/values it saves.
        """
        if self.graphs is not None:
            done = self.graphs.decode(packed, loaded)
            if done is not None:
                return done
        self._unpadded_batches += 1
        if dev is None and host is not None:
            dev = DeviceBatch.from_host(host, self.decoder.device)
        if dev is None:
            dev = DeviceBatch.from_batch(packed, self.decoder.device)
        hidden, saved = self.decoder.run(dev, loaded)
        return hidden[: packed.num_prompts], saved

    def _finish(self, call: _PackedCall) -> torch.Tensor:
        if not call.outputs:
            return torch.empty(0, self.decoder.final_norm.shape[0], device=self.decoder.device)
        return torch.cat([call.outputs[key] for key in sorted(call.outputs)])


def _graphs_of(decoder: PackedDecoder, max_batch_tokens: int, cuda_graphs: bool) -> DecoderGraphs | None:
    """The CUDA graphs ``decoder`` replays, captured, or None where it runs eagerly (see
    ``PackedForward.graphs``)."""
    if cuda_graphs and decoder.device.type == "cuda" and decoder.attention_impl == "triton":
        graphs = DecoderGraphs(decoder, GraphLadder.up_to(max_batch_tokens))
        graphs.capture_all()
        return graphs
    return None


def _key(groups: Sequence[PrefixGroup], slices: Sequence[GroupSlice]) -> tuple[GroupSlice, ...]:
    """A batch's slices as the key of its layout: the planner flags an empty prefix as computed in
    a group's first batch, the run in each of its batches, and it lays out the same either way."""
    return tuple(
        s
        if len(groups[s.group].prefix_ids)
        else dataclasses.replace(s, compute_prefix=False, save_prefix=False)
        for s in slices
    )


def _slices(prompts: list[tuple[int, int]]) -> list[GroupSlice]:
    """Consecutive (group, prompt) pairs as slices; the prefix flags are set when the batch runs."""
    slices: list[GroupSlice] = []
    for group, index in prompts:
        if slices and slices[-1].group == group and slices[-1].stop == index:
            slices[-1] = dataclasses.replace(slices[-1], stop=index + 1)
        else:
            slices.append(GroupSlice(group, index, index + 1, compute_prefix=False, save_prefix=False))
    return slices
