"""CUDA graphs of the packed decoder for small batches: one launch instead of about 500.

A small call (``rerank`` of 20 documents, about 8k tokens on a Qwen3-0.6B shape) is launch-bound on
an H200: the host takes as long to launch its ~480 kernels as the GPU takes to run them
(docs/benchmarks.md, "Small calls"). Replaying a captured graph takes the host out of that loop.

A graph has fixed sizes, so batches are padded to a :class:`~genscore_core.packed.decoder.StaticShape`
(tokens rounded up to a multiple of ``token_step``, segments to a multiple of 16): spare rows belong to
no segment and are never read by a real one, so the real rows are what the unpadded batch gives. A
shape is captured the second time it is seen (a one-off call does not pay for a capture it will not
reuse), at most ``max_graphs`` are kept (the least recently used goes first), and all of them share
one memory pool, so they hold about the memory of the largest, not the sum (about 24 KB a token on a
Qwen3-0.6B shape: up to about 0.4 GB at 16k tokens, kept reserved while the graphs live). Batches
that load or save prefix keys and values (a group split over several batches), or are larger than
``max_tokens``, run eagerly as before. If a capture fails, graphs are switched off for this decoder
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

from genscore_core.packed.decoder import DeviceBatch, PackedDecoder, StaticShape
from genscore_core.packed.plan import PackedBatch

logger = logging.getLogger(__name__)

SEGMENT_STEP = 16
"""Segment rows are rounded up to a multiple of this."""


def static_shape(batch: PackedBatch, token_step: int) -> StaticShape:
    """The shape ``batch`` is padded to: tokens up to a multiple of ``token_step``, and segments up to
    a multiple of :data:`SEGMENT_STEP` with at least one spare."""
    if token_step <= 0:
        raise ValueError(f"token_step must be positive, got {token_step}")
    tokens = max(token_step, math.ceil(batch.num_tokens / token_step) * token_step)
    segments = math.ceil((len(batch.segments) + 1) / SEGMENT_STEP) * SEGMENT_STEP
    return StaticShape(tokens=tokens, segments=segments)


@dataclass
class _Graph:
    dev: DeviceBatch
    """The static input buffer the graph reads."""
    replay: Callable[[], torch.Tensor]
    """Runs the decoder on :attr:`dev` and returns its output rows (the graph's static output)."""
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
        cuda_graphs: Capture CUDA graphs (the default on CUDA). False replays by running the
            decoder on the same static buffers, which is what tests on the CPU check the padding and
            the buffer reuse with.
    """

    def __init__(
        self,
        decoder: PackedDecoder,
        *,
        max_tokens: int,
        token_step: int = 128,
        max_graphs: int = 64,
        capture_after: int = 2,
        cuda_graphs: bool | None = None,
    ) -> None:
        if max_tokens <= 0 or token_step <= 0 or max_graphs <= 0 or capture_after <= 0:
            raise ValueError("max_tokens, token_step, max_graphs and capture_after must be positive")
        self.decoder = decoder
        self.max_tokens = max_tokens
        self.token_step = token_step
        self.max_graphs = max_graphs
        self.capture_after = capture_after
        self.cuda_graphs = decoder.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.disabled: str | None = None
        """Why graphs were switched off (a capture failed), or None."""
        self.graphs: OrderedDict[StaticShape, _Graph] = OrderedDict()
        self.seen: Counter[StaticShape] = Counter()
        self.captures = 0
        self.replays = 0
        self._pool: Any = None

    def shape_for(self, batch: PackedBatch) -> StaticShape | None:
        """The shape ``batch`` would run at as a graph, or None when it runs eagerly."""
        if self.disabled is not None or batch.load or batch.save or batch.num_tokens == 0:
            return None
        shape = static_shape(batch, self.token_step)
        return shape if shape.tokens <= self.max_tokens else None

    def run(self, batch: PackedBatch) -> torch.Tensor | None:
        """The decoder's output rows for ``batch`` ([prompts, H] float32, a fresh tensor), or None
        when ``batch`` is to run eagerly (not eligible, shape not seen often enough, capture failed)."""
        shape = self.shape_for(batch)
        if shape is None:
            return None
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
        self.replays += 1
        # The static output is overwritten by the next replay: hand out a copy.
        return graph.replay()[: batch.num_prompts].clone()

    def _capture(self, shape: StaticShape, batch: PackedBatch) -> _Graph | None:
        decoder = self.decoder
        dev = DeviceBatch.static(shape, decoder.device, batch)
        try:
            if not self.cuda_graphs:
                graph = _Graph(dev, lambda: decoder.run(dev)[0])
            else:
                graph = self._cuda_graph(dev)
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

    def _cuda_graph(self, dev: DeviceBatch) -> _Graph:
        decoder = self.decoder
        cos, sin = decoder.rope_tables(dev.max_position)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # A warm-up run on a side stream compiles what this shape needs before capture.
        stream = torch.cuda.Stream(decoder.device)
        stream.wait_stream(torch.cuda.current_stream(decoder.device))
        with torch.cuda.stream(stream):
            decoder.run(dev)
        torch.cuda.current_stream(decoder.device).wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        # thread_local: a server's other threads may touch CUDA (a client's copy) meanwhile.
        with torch.cuda.graph(cuda_graph, pool=self._pool, capture_error_mode="thread_local"):
            output, _ = decoder.run(dev)

        def replay() -> torch.Tensor:
            cuda_graph.replay()
            return output

        return _Graph(dev, replay, keep=(cos, sin, cuda_graph))
