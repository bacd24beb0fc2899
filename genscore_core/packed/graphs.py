"""CUDA graphs of the packed decoder: a fixed ladder of batch sizes, captured when the model loads.

A small call (``rerank`` of 20 documents, about 8k tokens on a Qwen3-0.6B shape) is launch-bound on
an H200: the host takes as long to launch its ~480 kernels as the GPU takes to run them
(docs/benchmarks.md, "CUDA graphs"). Replaying a captured graph takes the host out of that loop.

A graph has fixed sizes, so a batch is padded to the smallest rung of a :class:`GraphLadder` that it
fits: tokens up to the rung's, segments up to its (one per prompt and per prefix computed), and
prefix rows loaded from or saved for other batches up to :attr:`GraphLadder.prefix_rows`. Spare
tokens form a segment of their own and no real segment reads them with weight, so the real rows are
what the unpadded batch gives. The planner fills batches up to rungs
(:func:`~genscore_core.packed.plan.plan_batches`, :class:`~genscore_core.streaming.BatchPlanner`),
so padding costs little.

Every rung is captured up front (:meth:`DecoderGraphs.capture_all`, when the packed forward is
built), never inside a user's call: a capture runs the batch eagerly, then records it, and
``torch.cuda.graph`` synchronises the device and empties the allocator's cache, about 60-125 ms each
(docs/benchmarks.md, "CUDA graphs"). A batch that fits no rung runs eagerly, and so does one whose
padding to its rung costs more than the launches a graph saves (:class:`LaunchCosts`, measured once
the ladder is captured; docs/benchmarks.md, "Eager or replay"). The graphs share one memory pool and
one set of output buffers, so together they hold about the memory of the largest rung's run, not the sum; the
load time and memory of the ladder are in docs/benchmarks.md, "CUDA-graph ladder". If a capture
fails, graphs are switched off for this decoder with a warning and every batch runs eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from genscore_core.packed.decoder import (
    KV,
    DeviceBatch,
    PackedDecoder,
    StaticOutputs,
    StaticShape,
    save_rows,
)
from genscore_core.packed.plan import GroupSlice, PackedBatch, build_batch, rung_segments
from genscore_core.prefixes import PrefixGroup

logger = logging.getLogger(__name__)

TOKEN_STEPS = ((4096, 512), (8192, 1024), (16384, 2048), (32768, 4096), (65536, 8192))
"""(up to, step): the rungs' token sizes, every ``step`` tokens up to ``up to`` (and every 8,192
beyond): 24 rungs up to 64k. The planner fills batches up to a rung, so only a call's last batch
pads by more than a prompt (at most a quarter of it). 512 below 4k, where a small call's latency
is mostly the launch, not the tokens. The streamed planner's targets (4k, 8k, ... 64k) are rungs.
Twice as many rungs (steps of 1/16) took 16 s and 3.7 GB to capture on an H200."""

PREFIX_ROWS = 1024
"""Prefix rows every rung loads and saves at most: a few queries' shared prefixes (the Qwen3 template
and a 20-word query take about 90)."""


EAGER_STEP = 512
"""A batch run eagerly is padded to a multiple of this many tokens (:attr:`GraphLadder.eager_step`),
the rungs' smallest step: its sizes then divide as the rungs' do, and the Triton kernels, which
specialise on that, need no new compilation inside a call."""


@dataclass(frozen=True)
class GraphLadder:
    """The batch sizes the packed forward captures a CUDA graph of, smallest first."""

    tokens: tuple[int, ...]
    """Each rung's stream tokens, ascending."""
    prefix_rows: int = PREFIX_ROWS
    eager_step: int = EAGER_STEP
    """What a batch run eagerly instead of on its rung is padded to a multiple of (:data:`EAGER_STEP`)."""

    @classmethod
    def up_to(cls, max_tokens: int, smallest: int = 512) -> GraphLadder:
        """The rungs of :data:`TOKEN_STEPS` from ``smallest`` below ``max_tokens``, and ``max_tokens``."""
        if max_tokens <= 0 or smallest <= 0:
            raise ValueError(f"max_tokens and smallest must be positive, got {max_tokens}, {smallest}")
        rungs: list[int] = []
        tokens = 0
        while True:
            step = next((step for limit, step in TOKEN_STEPS if tokens < limit), 8192)
            tokens += step
            if tokens >= max_tokens:
                break
            if tokens >= smallest:
                rungs.append(tokens)
        return cls((*rungs, max_tokens))

    def shape(self, tokens: int) -> StaticShape:
        """The static shape of the rung of ``tokens`` tokens."""
        return StaticShape(tokens, rung_segments(tokens), load=self.prefix_rows, save=self.prefix_rows)

    def shapes(self) -> list[StaticShape]:
        return [self.shape(tokens) for tokens in self.tokens]

    def rung_for(self, batch: PackedBatch) -> StaticShape | None:
        """The smallest rung ``batch`` fits, or None (it runs eagerly)."""
        for tokens in self.tokens:
            if tokens >= batch.num_tokens:
                shape = self.shape(tokens)
                if shape.fits(batch):
                    return shape
        return None

    def batch_tokens(self, tokens: int) -> int:
        """The rung a batch of ``tokens`` tokens is padded to (``tokens`` itself past the top): what
        a planner fills batches up to."""
        return next((rung for rung in self.tokens if rung >= tokens), tokens)


@dataclass(frozen=True)
class LaunchCosts:
    """What a batch costs on this device, measured on the ladder once it is captured
    (:meth:`DecoderGraphs.capture_all`): whether padding a batch to its rung costs more than the
    launches its graph saves.

    On a large model a batch is compute-bound and its launches hide behind the kernels, so the
    tokens padded to the rung are pure loss (an 8B's 42k-token batch on the 49k rung: 16%,
    docs/benchmarks.md, "Eager or replay"); on a small one the launches are most of a small batch.
    """

    per_token: float
    """Seconds a token adds to a replay (between the smallest rung and the one nearest 8k tokens)."""
    launch: float
    """Seconds an eager run of the smallest rung takes beyond its replay: the host's launches."""

    def eager_pays(self, rung_tokens: int, eager_tokens: int) -> bool:
        """Whether running ``eager_tokens`` eagerly costs less than replaying ``rung_tokens``: the
        tokens saved outweigh twice the launches (the margin: a host busy with other threads, such as
        a streamed call's tokenizer, launches slower than when this was measured)."""
        return self.per_token * (rung_tokens - eager_tokens) > 2 * self.launch


@dataclass
class _Graph:
    dev: DeviceBatch
    """The static input buffer the graph reads."""
    replay: Callable[[], tuple[torch.Tensor, KV | None]]
    """Runs the decoder on :attr:`dev` (and the loaded buffer) and returns its static outputs."""
    keep: tuple[Any, ...] = ()
    """What the captured kernels read and must outlive the graph (the rotary tables it saw)."""


class DecoderGraphs:
    """Runs packed batches through graphs of ``decoder.run``, one per rung of ``ladder``.

    A decoder on the CPU has no CUDA graphs: its "replay" runs the decoder on the same static
    buffers, which is what tests on the CPU check the padding and the buffer reuse with.
    """

    def __init__(self, decoder: PackedDecoder, ladder: GraphLadder) -> None:
        self.decoder = decoder
        self.ladder = ladder
        self.cuda_graphs = decoder.device.type == "cuda"
        self.disabled: str | None = None
        """Why graphs were switched off (a capture failed), or None."""
        self.graphs: dict[StaticShape, _Graph] = {}
        self.captures = 0
        self.replays = 0
        self.capture_seconds = 0.0
        """Wall time :meth:`capture_all` took."""
        self.costs: LaunchCosts | None = None
        """Measured when the ladder is captured on a GPU; None: every batch that fits a rung replays."""
        self.eager_runs = 0
        """Batches run eagerly (padded to :attr:`GraphLadder.eager_step`) because :attr:`costs` said it pays."""
        self._pool: Any = None
        shape = (len(decoder.layers), ladder.prefix_rows, decoder.num_kv_heads, decoder.head_dim)
        tensors = [torch.zeros(shape, dtype=decoder.dtype, device=decoder.device) for _ in range(4)]
        self._loaded: KV = (tensors[0], tensors[1])
        top = rung_segments(max(ladder.tokens))
        width = decoder.final_norm.shape[0]
        rows = torch.zeros((top, width), dtype=torch.float32, device=decoder.device)
        self._outputs = StaticOutputs(rows, (tensors[2], tensors[3]))

    def capture_all(self) -> None:
        """Capture every rung, the largest first (the pool then holds its run, which the smaller
        ones' runs reuse). On a failure, graphs are switched off with a warning."""
        started = time.perf_counter()
        for shape in reversed(self.ladder.shapes()):
            if self.disabled is not None:
                break
            if shape not in self.graphs:
                self._capture(shape)
        if self.cuda_graphs and self.graphs:
            self.costs = self._measured_costs()
            torch.cuda.synchronize(self.decoder.device)
            # The eager warm-up runs left blocks in the allocator's cache outside the graphs' pool.
            torch.cuda.empty_cache()
        self.capture_seconds += time.perf_counter() - started

    def decode(self, batch: PackedBatch, loaded: KV | None = None) -> tuple[torch.Tensor, KV | None] | None:
        """:meth:`PackedDecoder.run` of ``batch`` through a graph: its output rows and the prefix
        keys/values it saves (fresh tensors), or None when no captured rung fits it (run it eagerly)."""
        if (loaded is None) != (not batch.load):
            raise ValueError("loaded prefix keys/values must come with a batch that loads them")
        if self.disabled is not None or batch.num_tokens == 0:
            return None
        shape = self.ladder.rung_for(batch)
        graph = None if shape is None else self.graphs.get(shape)
        if shape is None or graph is None:
            return None
        eager = self._eager_shape(batch, shape)
        if eager is not None:
            self._load(loaded)
            self.eager_runs += 1
            # Buffers laid out as a rung's (static inputs, loaded rows), outputs of the run's own.
            dev = DeviceBatch.static(eager, self.decoder.device, batch)
            return self._batch_rows(batch, *self.decoder.run(dev, self._loaded), copy=False)
        graph.dev.fill(batch, shape)
        self._load(loaded)
        self.replays += 1
        # The static outputs are overwritten by the next replay: hand out copies.
        return self._batch_rows(batch, *graph.replay(), copy=True)

    def _load(self, loaded: KV | None) -> None:
        """Copy a batch's loaded prefix keys/values into the rows every rung reads them from."""
        if loaded is not None:
            rows = loaded[0].shape[1]
            self._loaded[0][:, :rows].copy_(loaded[0])
            self._loaded[1][:, :rows].copy_(loaded[1])

    @staticmethod
    def _batch_rows(
        batch: PackedBatch, output: torch.Tensor, saved: KV | None, *, copy: bool
    ) -> tuple[torch.Tensor, KV | None]:
        """The rows of ``batch``'s own prompts and the prefix keys/values it saves, out of a padded run
        (copies, with ``copy``, of outputs that another run overwrites)."""
        kept = None
        if batch.save and saved is not None:
            rows = save_rows(batch)
            kept = (saved[0][:, :rows], saved[1][:, :rows])
        output = output[: batch.num_prompts]
        if copy:
            output, kept = output.clone(), None if kept is None else (kept[0].clone(), kept[1].clone())
        return output, kept

    def _eager_shape(self, batch: PackedBatch, rung: StaticShape) -> StaticShape | None:
        """The shape ``batch`` runs eagerly at when that costs less than replaying ``rung``, else None."""
        step = self.ladder.eager_step
        tokens = -(-batch.num_tokens // step) * step
        if self.costs is None or not self.costs.eager_pays(rung.tokens, tokens):
            return None
        shape = self.ladder.shape(tokens)
        return shape if shape.fits(batch) else None

    def _measured_costs(self) -> LaunchCosts | None:
        """:class:`LaunchCosts` of this device: replays of the smallest rung and of the one nearest
        8k tokens, and an eager run of the smallest (a few of each, the median; about a second on an
        8B shape)."""
        shapes = sorted(self.graphs, key=lambda shape: shape.tokens)
        if len(shapes) < 2:
            return None
        small = shapes[0]
        mid = min(shapes[1:], key=lambda shape: abs(shape.tokens - 8192))
        device = self.decoder.device

        def seconds(run: Callable[[], object]) -> float:
            times = []
            for _ in range(3):
                torch.cuda.synchronize(device)
                started = time.perf_counter()
                run()
                torch.cuda.synchronize(device)
                times.append(time.perf_counter() - started)
            return sorted(times)[1]

        replay_small = seconds(self.graphs[small].replay)
        replay_mid = seconds(self.graphs[mid].replay)
        eager_small = seconds(lambda: self.decoder.run(self.graphs[small].dev, self._loaded))
        per_token = max(replay_mid - replay_small, 0.0) / (mid.tokens - small.tokens)
        return LaunchCosts(per_token=per_token, launch=max(eager_small - replay_small, 0.0))

    def _capture(self, shape: StaticShape) -> None:
        decoder = self.decoder
        dev = DeviceBatch.static(shape, decoder.device, _one_token_batch())
        try:
            if not self.cuda_graphs:
                graph = _Graph(dev, lambda: decoder.run(dev, self._loaded, self._outputs))
            else:
                graph = self._cuda_graph(dev)
        except Exception as error:  # any capture failure: run eagerly from now on, and say why
            self.disabled = f"{type(error).__name__}: {error}"
            self.graphs.clear()
            logger.warning("CUDA graphs of the packed decoder switched off: %s", self.disabled)
            return
        self.captures += 1
        self.graphs[shape] = graph

    def _cuda_graph(self, dev: DeviceBatch) -> _Graph:
        decoder = self.decoder
        cos, sin = decoder.rope_tables(dev.max_position)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # A warm-up run on a side stream compiles what this shape needs before capture.
        stream = torch.cuda.Stream(decoder.device)
        stream.wait_stream(torch.cuda.current_stream(decoder.device))
        with torch.cuda.stream(stream):
            decoder.run(dev, self._loaded, self._outputs)
        torch.cuda.current_stream(decoder.device).wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        # thread_local: a server's other threads may touch CUDA (a client's copy) meanwhile.
        with torch.cuda.graph(cuda_graph, pool=self._pool, capture_error_mode="thread_local"):
            output, saved = decoder.run(dev, self._loaded, self._outputs)

        def replay() -> tuple[torch.Tensor, KV | None]:
            cuda_graph.replay()
            return output, saved

        return _Graph(dev, replay, keep=(cos, sin, cuda_graph))


def _one_token_batch() -> PackedBatch:
    """A batch of one token: any batch of a rung's sizes lays out the same static buffer."""
    return build_batch(
        [PrefixGroup([], [[0]])], [GroupSlice(0, 0, 1, compute_prefix=False, save_prefix=False)]
    )
