"""CUDA graphs of the packed decoder: one launch per batch instead of about 500.

A small call (``rerank`` of 20 documents, about 8k tokens on a Qwen3-0.6B shape) is launch-bound on
an H200: the host takes as long to launch its ~480 kernels as the GPU takes to run them
(docs/benchmarks.md, "CUDA graphs"). Large streamed calls are launch-bound too while the producer
thread tokenizes on every core: launching a batch took about 31 ms against 16 ms once the producer
was done (docs/benchmarks.md, "CUDA graphs"). Replaying a captured graph takes the host out of that loop.

A graph has fixed sizes, so batches are padded to a :class:`~genscore_core.packed.decoder.StaticShape`
(tokens rounded up to a multiple of ``token_step``, or of :data:`LARGE_TOKEN_STEP` over
``max_tokens``; segments to a multiple of 16, or 64; loaded and saved prefix rows to a multiple of
:data:`PREFIX_STEP`): spare tokens form a segment of their own and no real segment reads them with
weight, so the real rows are what the unpadded batch gives. A shape is captured the second time it is
seen (a one-off call does not pay for a capture it will not reuse), at most ``max_graphs`` are kept
(the least recently used goes first), and all of them share one memory pool, so they hold about the
memory of the largest, not the sum (about 24 KB a token on a Qwen3-0.6B shape: up to about 1.5 GB at
64k tokens, kept reserved while the graphs live). Batches that carry a group's prefix keys and values
to a later batch replay graphs too: the loaded rows are copied into a static buffer before the replay
and the saved ones copied out after it. If a capture fails, graphs are switched off for this decoder
with a warning and every batch runs eagerly.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from genscore_core.packed.decoder import DeviceBatch, PackedDecoder, StaticShape, save_rows
from genscore_core.packed.plan import PackedBatch

logger = logging.getLogger(__name__)

Saved = tuple[torch.Tensor, torch.Tensor]
"""Keys and values [layers, rows, kv heads, head dim] of prefixes carried between batches."""

GRAPH_TOKENS = 16384
"""The packed forward's batches of up to this many tokens (after padding) replay graphs."""

LARGE_GRAPH_TOKENS = 65536
"""Its batches over :data:`GRAPH_TOKENS` and up to this many tokens replay graphs too, padded to
coarser steps (a streamed call's batches fill fixed token targets, so their shapes repeat)."""

SEGMENT_STEP = 16
"""Segment rows are rounded up to a multiple of this."""

PREFIX_STEP = 128
"""Loaded and saved prefix rows are rounded up to a multiple of this."""

LARGE_TOKEN_STEP = 1024
LARGE_SEGMENT_STEP = 64
"""Steps of batches over ``max_tokens`` (up to ``large_tokens``): coarser, so that the batches a
stream fills up to its token targets repeat a few shapes across calls."""


def static_shape(batch: PackedBatch, token_step: int, segment_step: int = SEGMENT_STEP) -> StaticShape:
    """The shape ``batch`` is padded to: tokens up to a multiple of ``token_step``, segments up to a
    multiple of ``segment_step`` with at least two spare (the spare tokens' and an empty one), and
    loaded and saved prefix rows up to a multiple of :data:`PREFIX_STEP`."""
    if token_step <= 0 or segment_step <= 0:
        raise ValueError(f"token_step and segment_step must be positive, got {token_step}, {segment_step}")
    tokens = max(token_step, math.ceil(batch.num_tokens / token_step) * token_step)
    segments = math.ceil((len(batch.segments) + 2) / segment_step) * segment_step
    load = math.ceil((batch.kv_len - batch.num_tokens) / PREFIX_STEP) * PREFIX_STEP
    save = math.ceil(save_rows(batch) / PREFIX_STEP) * PREFIX_STEP
    return StaticShape(tokens=tokens, segments=segments, load=load, save=save)


@dataclass
class _Graph:
    dev: DeviceBatch
    """The static input buffer the graph reads."""
    replay: Callable[[], tuple[torch.Tensor, Saved | None]]
    """Runs the decoder on :attr:`dev` (and :attr:`loaded`) and returns its static outputs."""
    loaded: Saved | None = None
    """The static buffer of the prefixes the graph loads (shared by graphs of the same load rows)."""
    keep: tuple[Any, ...] = ()
    """What the captured kernels read and must outlive the graph (the rotary tables it saw)."""


class DecoderGraphs:
    """Runs packed batches of up to ``max_tokens`` tokens through graphs of ``decoder.run``.

    Args:
        decoder: The packed decoder.
        max_tokens: Largest padded batch run as a graph (larger ones return None: run them eagerly).
        token_step: Tokens are padded up to a multiple of this.
        max_graphs: Graphs kept at once.
        capture_after: A shape is captured the ``capture_after``-th time it is seen.
        large_tokens: Batches over ``max_tokens`` and up to this many tokens (after padding to
            :data:`LARGE_TOKEN_STEP`) replay graphs too; 0: none do.

    A decoder on the CPU has no CUDA graphs: its "replay" runs the decoder on the same static
    buffers, which is what tests on the CPU check the padding and the buffer reuse with.
    """

    def __init__(
        self,
        decoder: PackedDecoder,
        *,
        max_tokens: int,
        token_step: int = 128,
        max_graphs: int = 64,
        capture_after: int = 2,
        large_tokens: int = 0,
    ) -> None:
        if max_tokens <= 0 or token_step <= 0 or max_graphs <= 0 or capture_after <= 0:
            raise ValueError("max_tokens, token_step, max_graphs and capture_after must be positive")
        if large_tokens < 0:
            raise ValueError(f"large_tokens must not be negative, got {large_tokens}")
        self.large_tokens = large_tokens
        self._loaded: dict[int, Saved] = {}
        self.decoder = decoder
        self.max_tokens = max_tokens
        self.token_step = token_step
        self.max_graphs = max_graphs
        self.capture_after = capture_after
        self.cuda_graphs = decoder.device.type == "cuda"
        self.disabled: str | None = None
        """Why graphs were switched off (a capture failed), or None."""
        self.graphs: OrderedDict[StaticShape, _Graph] = OrderedDict()
        self.seen: Counter[StaticShape] = Counter()
        self.captures = 0
        self.replays = 0
        self._pool: Any = None

    def shape_for(self, batch: PackedBatch, large: bool = True) -> StaticShape | None:
        """The shape ``batch`` would run at as a graph, or None when it runs eagerly (``large``:
        batches over ``max_tokens`` may replay graphs, up to ``large_tokens``)."""
        if self.disabled is not None or batch.num_tokens == 0:
            return None
        shape = static_shape(batch, self.token_step)
        if shape.tokens <= self.max_tokens:
            return shape
        shape = static_shape(batch, LARGE_TOKEN_STEP, LARGE_SEGMENT_STEP)
        return shape if large and shape.tokens <= self.large_tokens else None

    def run(self, batch: PackedBatch) -> torch.Tensor | None:
        """The decoder's output rows for ``batch`` ([prompts, H] float32, a fresh tensor), or None
        when ``batch`` is to run eagerly (not eligible, shape not seen often enough, capture failed)."""
        done = self.decode(batch)
        return None if done is None else done[0]

    def decode(
        self, batch: PackedBatch, loaded: Saved | None = None, *, large: bool = True
    ) -> tuple[torch.Tensor, Saved | None] | None:
        """:meth:`PackedDecoder.run` of ``batch`` through a graph: its output rows and the prefix
        keys/values it saves (fresh tensors), or None when ``batch`` is to run eagerly (``large``:
        see :meth:`shape_for`)."""
        shape = self.shape_for(batch, large)
        if shape is None:
            return None
        if (loaded is None) != (not batch.load):
            raise ValueError("loaded prefix keys/values must come with a batch that loads them")
        graph = self.graphs.get(shape)
        if graph is None:
            self.seen[shape] += 1
            if self.seen[shape] < self.capture_after:
                return None
            graph = self._capture(shape, batch)
            if graph is None:
                return None
        else:
            self.graphs.move_to_end(shape)
            graph.dev.fill(batch, shape)
        if loaded is not None and graph.loaded is not None:
            rows = loaded[0].shape[1]
            graph.loaded[0][:, :rows].copy_(loaded[0])
            graph.loaded[1][:, :rows].copy_(loaded[1])
        self.replays += 1
        # The static outputs are overwritten by the next replay: hand out copies.
        output, saved = graph.replay()
        kept = None
        if saved is not None:
            rows = save_rows(batch)
            kept = (saved[0][:, :rows].clone(), saved[1][:, :rows].clone())
        return output[: batch.num_prompts].clone(), kept

    def _loaded_buffer(self, rows: int) -> Saved | None:
        """The static buffer of ``rows`` loaded prefix rows (zeros at first; only real rows are read)."""
        if not rows:
            return None
        if rows not in self._loaded:
            decoder = self.decoder
            shape = (len(decoder.layers), rows, decoder.num_kv_heads, decoder.head_dim)
            self._loaded[rows] = (
                torch.zeros(shape, dtype=decoder.dtype, device=decoder.device),
                torch.zeros(shape, dtype=decoder.dtype, device=decoder.device),
            )
        return self._loaded[rows]

    def _capture(self, shape: StaticShape, batch: PackedBatch) -> _Graph | None:
        decoder = self.decoder
        dev = DeviceBatch.static(shape, decoder.device, batch)
        loaded = self._loaded_buffer(shape.load)
        try:
            if not self.cuda_graphs:
                graph = _Graph(dev, lambda: decoder.run(dev, loaded), loaded)
            else:
                graph = self._cuda_graph(dev, loaded)
        except Exception as error:  # any capture failure: run eagerly from now on, and say why
            self.disabled = f"{type(error).__name__}: {error}"
            self.graphs.clear()
            logger.warning("CUDA graphs of the packed decoder switched off: %s", self.disabled)
            return None
        self.captures += 1
        self.graphs[shape] = graph
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return graph

    def _cuda_graph(self, dev: DeviceBatch, loaded: Saved | None) -> _Graph:
        decoder = self.decoder
        cos, sin = decoder.rope_tables(dev.max_position)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # A warm-up run on a side stream compiles what this shape needs before capture.
        stream = torch.cuda.Stream(decoder.device)
        stream.wait_stream(torch.cuda.current_stream(decoder.device))
        with torch.cuda.stream(stream):
            decoder.run(dev, loaded)
        torch.cuda.current_stream(decoder.device).wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        # thread_local: a server's other threads may touch CUDA (a client's copy) meanwhile.
        with torch.cuda.graph(cuda_graph, pool=self._pool, capture_error_mode="thread_local"):
            output, saved = decoder.run(dev, loaded)

        def replay() -> tuple[torch.Tensor, Saved | None]:
            cuda_graph.replay()
            return output, saved

        return _Graph(dev, replay, loaded, keep=(cos, sin, cuda_graph))
