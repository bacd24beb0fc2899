"""A lean packed forward of Qwen3 / Qwen2 / Llama decoder layers over the loaded model's own weights.

Nothing is copied: every matrix is the ``nn.Linear`` weight of the Hugging Face model, read in place.
Each layer's q/k/v weights are first moved into one [Nq + 2 Nkv, H] tensor and its gate/up weights
into one [2I, H] tensor, and the modules' weights are re-pointed to views of them (same values, no
second copy; see :func:`fuse_linears`), so a layer runs one q/k/v GEMM and one gate/up GEMM instead
of five. :meth:`PackedDecoder.run` takes one :class:`~genscore_core.packed.plan.PackedBatch` through
all layers, each a short sequence of phases (projections, attention, MLP; the last layer trimmed):

* the residual stream is float32 [T, H]; RMSNorms, Qwen3's q/k norms and rotary embeddings compute
  in float32; only the inputs of matrix products are in the model's dtype;
* K and V are written straight into the batch's key/value buffer, row ``t`` for stream token ``t``
  (column blocks of the one q/k/v GEMM's output, read with its row stride); attention reads each
  group's prefix keys where they were computed, once per group, never copied;
* the last layer computes queries, attention, MLP and the final norm only at the last token of each
  segment, then of each prompt, since nothing reads the other positions' output.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from genscore_core.forward import decoder_of
from genscore_core.kernels import fused_ops
from genscore_core.kernels.attention import (
    DEFAULT_TILING,
    LAST_TOKEN_TILING,
    Segments,
    check_table,
    plan_blocks,
    segment_attention,
)
from genscore_core.kernels.attention import (
    unsupported_reason as attention_unsupported,
)
from genscore_core.kernels.dispatch import KernelImpl, use_triton
from genscore_core.kernels.gated_mlp import gated_mlp
from genscore_core.kernels.gated_mlp import unsupported_reason as gated_mlp_unsupported
from genscore_core.packed.fp8 import Fp8Layer, Fp8Rows
from genscore_core.packed.plan import PackedBatch

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
# Rotary variants whose frequencies do not depend on the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def unsupported_reason(model: Any) -> str | None:
    """Why the packed forward cannot run ``model`` (None when it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    activation = getattr(config, "hidden_act", "silu")
    if activation != "silu":
        return f"activation {activation!r} is not silu"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not supported"
    try:
        decoder = decoder_of(model)
        layers = list(decoder.layers)
        rotary = decoder.rotary_emb
        embed = decoder.embed_tokens.weight
    except (AttributeError, TypeError) as error:
        return f"unexpected module layout: {error}"
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rotary embedding type {rope_type!r} depends on the sequence length"
    if getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
        return "the model is split over several devices"
    for name, weight in _weights(layers[0]).items():
        if weight is None:
            if name in ("q_norm", "k_norm"):
                continue
            return f"layer 0 has no {name}"
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.is_meta:
            return f"{name} is not a plain floating-point tensor (quantised or offloaded weights?)"
        if weight.device != embed.device:
            return f"{name} is on {weight.device}, the embeddings on {embed.device}"
        if name.endswith("_proj") and weight.dtype != embed.dtype:
            # The products' inputs are in the embeddings' dtype (and the fused weights hold one).
            return f"{name} is {weight.dtype}, the embeddings {embed.dtype}"
    return None


def supports(model: Any) -> bool:
    """Whether :class:`PackedDecoder` can run ``model``."""
    return unsupported_reason(model) is None


def _weights(layer: Any) -> dict[str, torch.Tensor | None]:
    attn, mlp = layer.self_attn, layer.mlp
    q_norm = getattr(attn, "q_norm", None)
    k_norm = getattr(attn, "k_norm", None)
    return {
        "q_proj": attn.q_proj.weight,
        "k_proj": attn.k_proj.weight,
        "v_proj": attn.v_proj.weight,
        "o_proj": attn.o_proj.weight,
        "gate_proj": mlp.gate_proj.weight,
        "up_proj": mlp.up_proj.weight,
        "down_proj": mlp.down_proj.weight,
        "input_layernorm": layer.input_layernorm.weight,
        "post_attention_layernorm": layer.post_attention_layernorm.weight,
        "q_norm": q_norm.weight if q_norm is not None else None,
        "k_norm": k_norm.weight if k_norm is not None else None,
    }


Linear = tuple[torch.Tensor, torch.Tensor | None]
"""An ``nn.Linear``'s (weight, bias)."""


@dataclass(frozen=True)
class _Layer:
    """References to one decoder layer's parameters (no copies: the separate ones are views)."""

    qkv: Linear
    """q, k and v as one [Nq + 2 Nkv, H] matrix, rows in that order (:func:`fuse_linears`)."""
    q: Linear
    """The q rows of ``qkv`` with q_proj's own bias: the last layer's queries, at fewer rows."""
    kv: Linear
    """The k and v rows of ``qkv``: the last layer's keys and values."""
    o: Linear
    gate_up: Linear
    """gate and up as one [2I, H] matrix."""
    gate: Linear
    """The gate rows of ``gate_up`` (the gated-MLP kernel reads the two halves)."""
    up: Linear
    down: Linear
    ln1: torch.Tensor
    ln2: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def _fused_layer(layer: Any, index: int) -> _Layer:
    """``layer``'s parameters, its q/k/v and gate/up weights moved into one tensor each."""
    attn, mlp = layer.self_attn, layer.mlp
    # Fused first: the modules' weights are then views of the fused tensors.
    qkv = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
    if qkv is None or gate_up is None:
        raise ValueError(
            f"the packed forward cannot run layer {index}: its weights differ in dtype or device"
        )
    q_rows = attn.q_proj.weight.shape[0]
    weight, bias = qkv
    w = _weights(layer)
    return _Layer(
        qkv=qkv,
        q=_linear(attn.q_proj),
        kv=(weight[q_rows:], None if bias is None else bias[q_rows:]),
        o=_linear(attn.o_proj),
        gate_up=gate_up,
        gate=_linear(mlp.gate_proj),
        up=_linear(mlp.up_proj),
        down=_linear(mlp.down_proj),
        ln1=layer.input_layernorm.weight,
        ln2=layer.post_attention_layernorm.weight,
        q_norm=w["q_norm"],
        k_norm=w["k_norm"],
    )


def _linear(module: Any) -> Linear:
    return module.weight, getattr(module, "bias", None)


def fuse_linears(modules: Sequence[Any]) -> Linear | None:
    """One (weight, bias) whose rows are the ``nn.Linear`` modules' rows, one module after the other
    (None when their weights differ in dtype, device or width).

    The modules' weights (and biases, when all of them have one) are moved into the result and
    re-pointed (``param.data``) to views of it: the values, the parameter objects and the model's
    ``state_dict`` stay as they were (``save_pretrained`` and a reload give the same tensors), and the
    weights are held once. Weights that already are such adjacent views (a second decoder over the
    same model) are used where they lie, without a copy. A bias missing from some modules is zeros in
    the result (a small copy; those modules keep their None).
    """
    weights = [m.weight for m in modules]
    first = weights[0]
    if any(
        w.dtype != first.dtype or w.device != first.device or w.shape[1:] != first.shape[1:] for w in weights
    ):
        return None  # nothing to concatenate without converting
    weight = _adjacent(weights)
    if weight is None:
        weight = _moved(weights)
    biases = [getattr(m, "bias", None) for m in modules]
    present = [b for b in biases if b is not None]
    if not present:
        return weight, None
    if len(present) == len(biases) and all(b.dtype == present[0].dtype for b in present):
        bias = _adjacent(present)
        return weight, bias if bias is not None else _moved(present)
    with _plain_tensors():
        filled = [b if b is not None else weight.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]
        return weight, torch.cat([b.detach().to(weight.dtype) for b in filled])


def _moved(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``tensors`` concatenated along dim 0, each re-pointed to its rows of the result."""
    with _plain_tensors():
        whole = torch.cat([t.detach() for t in tensors])
        start = 0
        for t in tensors:
            rows = t.shape[0]
            t.data = whole[start : start + rows]
            start += rows
    return whole


@contextlib.contextmanager
def _plain_tensors() -> Iterator[None]:
    """No autograd, and not inference tensors even when the decoder is built under
    ``torch.inference_mode``: the model's parameters become views of what is made here, and an
    inference tensor would break any later training or autograd use of the model."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def _adjacent(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The one tensor ``tensors`` are consecutive contiguous row blocks of, or None if they are not."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for t in tensors:
        if (
            not t.is_contiguous()
            or t.dtype != first.dtype
            or t.device != first.device
            or t.shape[1:] != first.shape[1:]
            or t.untyped_storage().data_ptr() != storage
            or t.storage_offset() != offset
        ):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


@dataclass(frozen=True)
class StaticShape:
    """The fixed sizes a batch is padded to, so that one CUDA graph serves every batch that fits them.

    ``tokens`` stream positions and ``segments`` segment rows (at least two more than the batch has:
    one for the spare tokens, one empty for spare attention blocks to point at); the attention work
    lists get room for the most blocks such a batch can need.
    """

    tokens: int
    segments: int
    load: int = 0
    """Key/value rows of prefixes loaded from earlier batches (after the stream's rows)."""
    save: int = 0
    """Stream rows whose keys/values are kept for later batches."""

    @property
    def blocks(self) -> int:
        """Room for the attention blocks of any batch of this shape: a segment of q queries needs
        ceil(q / block_m) blocks, so all of them together at most tokens / block_m + segments."""
        return -(-self.tokens // DEFAULT_TILING.block_m) + self.segments

    def fits(self, batch: PackedBatch) -> bool:
        # Spare tokens take a segment of their own, and one segment stays empty.
        return (
            batch.num_tokens <= self.tokens
            and len(batch.segments) + 2 <= self.segments
            and batch.kv_len - batch.num_tokens <= self.load
            and save_rows(batch) <= self.save
        )


def save_rows(batch: PackedBatch) -> int:
    """Stream rows whose keys/values ``batch`` keeps for later batches."""
    return sum(int(rows.numel()) for _, rows in batch.save)


def host_layout(
    batch: PackedBatch, shape: StaticShape | None = None
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The int64 arrays a :class:`DeviceBatch` is made of, in order, and its two segment tables.

    With ``shape``, every array is padded to that shape's size: spare tokens (id 0, position 0)
    form one segment of their own after the batch's, spare segments are empty (no query, no key),
    spare attention blocks point at the last (empty) segment, spare prompt rows read segment 0, and
    loaded prefixes move down past the spare tokens; the decoder's rows past the batch's own prompts
    are then to be ignored. No real row reads a spare one with weight, so the real rows come out as
    they do unpadded. The arrays are consecutive views of one buffer (:func:`flat_layout`).
    """
    flat, sizes, table, last = flat_layout(batch, shape)
    return list(np.split(flat.numpy(), np.cumsum(sizes)[:-1])), table, last


def flat_layout(
    batch: PackedBatch, shape: StaticShape | None = None, *, pinned: bool = False
) -> tuple[torch.Tensor, list[int], np.ndarray, np.ndarray]:
    """:func:`host_layout`'s arrays written one after the other into one int64 host tensor (what
    goes to the device in one copy; page-locked with ``pinned``), their sizes, and the two segment
    tables.

    Each array is written into its place by numpy, padding included (only the spare tails are
    zeroed): a small call's batch is laid out on the host in front of its graph's replay, and the
    numpy pads and the concatenation this replaces took about half of that time (docs/benchmarks.md,
    "Small calls").

    The page-locked buffer is written by numpy: ``tensor.pin_memory()`` would copy it again, and
    torch's CPU copies and reductions of large tensors run on its OpenMP pool, which a loaded server
    shares with the tokenizer's threads (measured: 6 ms for a 1 MB ``pin_memory``, 11 ms for the max
    of 65k positions, while the GPU waited; docs/benchmarks.md, "Server batching").
    """
    table = check_table(batch.segments)
    segment_last = batch.segment_last.numpy()
    n = batch.num_tokens
    spare_tokens = 0 if shape is None else shape.tokens - n
    if shape is not None and batch.load:
        # Loaded prefixes follow the stream's rows, which padding moves down to shape.tokens.
        table = table.copy()
        loaded = (table[:, 5] > 0) & (table[:, 4] >= n)
        table[loaded, 4] += spare_tokens
    if spare_tokens > 0:
        # Spare tokens attend among themselves. In no segment, their attention rows would be left
        # unwritten (any bits, NaN too), their keys and values in later layers likewise, and the
        # last real segment's final key tile, which reaches into them with zero weight, would turn
        # 0 * NaN into NaN.
        table = np.concatenate([table, [[n, spare_tokens, n, spare_tokens, 0, 0]]])
        segment_last = np.append(segment_last, shape.tokens - 1)  # type: ignore[union-attr]
    last = table.copy()
    last[:, 0] = np.arange(len(last))
    last[:, 1] = 1
    blocks = plan_blocks(table, DEFAULT_TILING).reshape(-1)
    last_blocks = plan_blocks(last, LAST_TOKEN_TILING).reshape(-1)
    saved = [rows.numpy() for _, rows in batch.save]
    prompt_segments = batch.prompt_segments.numpy()
    data = [batch.input_ids.numpy(), batch.positions.numpy(), segment_last, prompt_segments,
            table.reshape(-1), blocks, last.reshape(-1), last_blocks]  # fmt: skip
    if saved:
        data.append(np.concatenate(saved))
    if shape is None:
        sizes = [len(d) for d in data]
        flat = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pinned)
        np.concatenate(data, out=flat.numpy(), casting="same_kind")
        return flat, sizes, table, last
    if not shape.fits(batch):
        raise ValueError(f"a batch of {n} tokens and {len(table)} segments does not fit {shape}")
    segments = shape.segments
    sizes = [shape.tokens, shape.tokens, segments, segments, segments * 6, shape.blocks * 2,
             segments * 6, segments * 2] + ([shape.save] if shape.save else [])  # fmt: skip
    if not shape.save:
        data = data[:8]
    flat = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pinned)
    views = np.split(flat.numpy(), np.cumsum(sizes)[:-1])
    for view, values in zip(views, data, strict=False):
        view[: len(values)] = values
        view[len(values) :] = 0
    for view in views[len(data) :]:  # spare saved rows with none saved: row 0, never read
        view[:] = 0
    # Spare attention blocks point at the last segment row, which is empty.
    views[5][blocks.size :].reshape(-1, 2)[:, 0] = shape.segments - 1
    views[7][last_blocks.size :].reshape(-1, 2)[:, 0] = shape.segments - 1
    return flat, sizes, views[4].reshape(-1, 6), views[6].reshape(-1, 6)


@dataclass
class HostBatch:
    """A :class:`PackedBatch` laid out on the host for :class:`DeviceBatch`: every array it is made
    of in one buffer, ready for one copy. Host work only, so another thread can do it while the
    device runs something else (:meth:`PackedForward.prepare`)."""

    batch: PackedBatch
    flat: torch.Tensor
    """int64, page-locked when the device is a GPU."""
    sizes: list[int]
    table: np.ndarray
    last: np.ndarray
    max_position: int

    @classmethod
    def of(cls, batch: PackedBatch, device: torch.device) -> HostBatch:
        flat, sizes, table, last = flat_layout(batch, pinned=device.type == "cuda")
        # numpy, not torch: see flat_layout.
        max_position = int(batch.positions.numpy().max()) if batch.num_tokens else 0
        return cls(batch, flat, sizes, table, last, max_position)


@dataclass
class DeviceBatch:
    """A :class:`PackedBatch`'s tensors on the model's device, with its attention segments.

    All of them are views of one int64 buffer (:attr:`buffer`), copied to the device at once.
    """

    batch: PackedBatch
    """The batch these tensors hold (a static buffer: the one it holds now, padded)."""
    num_tokens: int
    """Stream positions the decoder runs (the batch's own, or its static shape's when padded)."""
    kv_len: int
    """Key/value rows: the stream's, then the prefixes loaded from earlier batches."""
    max_position: int
    """A bound on the positions of the stream: the rotary tables must cover it."""
    num_prompts: int
    """The batch's own prompts: the first rows of the decoder's output (a padded batch has more)."""
    buffer: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    segment_last: torch.Tensor
    prompt_segments: torch.Tensor
    save_rows: torch.Tensor | None
    segments: Segments
    """Every stream token is a query."""
    last_segments: Segments
    """Only the last token of each segment is a query (row ``i`` of the query tensor: segment ``i``)."""

    @classmethod
    def from_batch(cls, batch: PackedBatch, device: torch.device) -> DeviceBatch:
        return cls.from_host(HostBatch.of(batch, device), device)

    @classmethod
    def from_host(cls, host: HostBatch, device: torch.device) -> DeviceBatch:
        """The batch laid out in ``host``, copied to ``device`` in one copy (queued: nothing waits)."""
        flat = host.flat.to(device, non_blocking=True) if device.type == "cuda" else host.flat
        batch = host.batch
        return cls.of_buffer(
            flat, host.sizes, host.table, host.last, batch, batch.num_tokens, batch.kv_len, host.max_position
        )

    @classmethod
    def static(cls, shape: StaticShape, device: torch.device, like: PackedBatch) -> DeviceBatch:
        """A device buffer of ``shape``'s sizes holding ``like`` padded (see :func:`host_layout`);
        :meth:`fill` puts another batch of that shape in its place."""
        # Page-locked and queued: a batch run eagerly in a call (graphs.DecoderGraphs) must not make
        # the host wait for the batches before it, as a copy from pageable memory does.
        on_gpu = device.type == "cuda"
        host, sizes, table, last = flat_layout(like, shape, pinned=on_gpu)
        flat = host.to(device, non_blocking=on_gpu)
        # Every position of a batch of this shape is below its stream and loaded rows together.
        rows = shape.tokens + shape.load
        return cls.of_buffer(flat, sizes, table, last, like, shape.tokens, rows, rows)

    def fill(self, batch: PackedBatch, shape: StaticShape) -> None:
        """Overwrite this static buffer with ``batch`` padded to ``shape`` (the shape it was made with)."""
        flat, _, table, last = flat_layout(batch, shape, pinned=self.buffer.device.type == "cuda")
        if flat.numel() != self.buffer.numel():
            raise ValueError(f"a batch padded to {shape} does not match this buffer")
        self.buffer.copy_(flat, non_blocking=True)
        self.batch = batch
        self.num_prompts = batch.num_prompts
        # The host tables are only read by the torch attention; keep them in step with the device.
        self.segments.host[...] = table
        self.last_segments.host[...] = last

    @classmethod
    def of_buffer(
        cls,
        flat: torch.Tensor,
        sizes: list[int],
        table: np.ndarray,
        last: np.ndarray,
        batch: PackedBatch,
        num_tokens: int,
        kv_len: int,
        max_position: int,
    ) -> DeviceBatch:
        parts = list(flat.split(sizes))
        return cls(
            batch=batch,
            num_tokens=num_tokens,
            kv_len=kv_len,
            max_position=max_position,
            num_prompts=batch.num_prompts,
            buffer=flat,
            input_ids=parts[0],
            positions=parts[1],
            segment_last=parts[2],
            prompt_segments=parts[3],
            segments=Segments(table, parts[4].view(-1, 6), parts[5].view(-1, 2), DEFAULT_TILING),
            last_segments=Segments(last, parts[6].view(-1, 6), parts[7].view(-1, 2), LAST_TOKEN_TILING),
            save_rows=parts[8] if len(parts) > 8 else None,
        )


class PackedOptions(BaseModel):
    """Which implementation each kernel of the packed decoder runs; the defaults are what the engine
    runs ("auto": Triton on CUDA, the torch references elsewhere).

    The other values exist so that tests can run the Triton kernels on the CPU (``all_kernels("triton")``
    under ``TRITON_INTERPRET=1``), each route on its own, and benchmarks can compare a kernel with its
    reference.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention: KernelImpl = "auto"
    """Implementation of the segment attention (:mod:`genscore_core.kernels.dispatch`)."""
    fused_ops: KernelImpl = "auto"
    """Implementation of add+RMSNorm, q/k norm+rotary and silu*mul."""
    gated_mlp: KernelImpl = "auto"
    """Implementation of the MLP's gate and up products with silu*mul: "triton" is one GEMM kernel that
    applies silu*mul to its accumulators (:mod:`genscore_core.kernels.gated_mlp`) on every batch;
    "torch" runs the fused gate/up product (cuBLAS on CUDA), then silu*mul as ``fused_ops`` says;
    "auto" runs the kernel on CUDA for bf16/fp16 batches of fewer than :data:`GATED_MLP_MAX_TOKENS`
    rows and the product otherwise."""

    quantization: Literal["fp8"] | None = None
    """``"fp8"``: the layers' q/k/v, gate/up and down products in float8 e4m3
    (:mod:`genscore_core.packed.fp8`); None: in the model's dtype. The decoder runs FP8 wherever
    ``torch._scaled_mm`` runs; whether it may (a GPU with FP8 tensor cores) is checked where a user
    asks for it (:func:`genscore_core.engine.select_forward`)."""

    @classmethod
    def all_kernels(cls, impl: KernelImpl) -> PackedOptions:
        """The same implementation for attention, the fused operations and the gated MLP."""
        return cls(attention=impl, fused_ops=impl, gated_mlp=impl)


GATED_MLP_MAX_TOKENS = 16384
"""With ``gated_mlp="auto"``, batches of at least this many (padded) rows run the cuBLAS gate/up
product and silu*mul: on an H200 the kernel saved 0.4-0.7 ms a call on W4 (~9k tokens) but nothing on
W1's 40-64k-token batches, where cuBLAS's products ran faster than in isolation (docs/benchmarks.md,
"Gate/up GEMM with silu*mul")."""

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class StaticOutputs:
    """Where a run writes what it returns: the graphs of every rung of a ladder write into one set,
    so that their outputs take the memory of the largest, not the sum (a rung's outputs would
    otherwise stay allocated in the graphs' pool for as long as its graph lives)."""

    rows: torch.Tensor
    """[segments of the largest rung, H] float32."""
    saved: KV
    """[layers, prefix rows a rung saves, Hkv, D] in the model's dtype."""


Rows = torch.Tensor | Fp8Rows
"""The input of a product: rows in the model's dtype, or quantised per token (FP8)."""
"""Keys and values [layers, rows, Hkv, D] of prefixes carried from one batch to a later one."""


@dataclass(frozen=True)
class _Pass:
    """What every layer of one :meth:`PackedDecoder.run` reads besides its own weights."""

    dev: DeviceBatch
    cos: torch.Tensor  # [positions, D] float32
    sin: torch.Tensor  # [positions, D] float32
    loaded: KV | None
    """The prefixes this batch loads (their rows follow the stream's in each layer's K/V)."""
    saved: KV | None
    """Where this batch writes the K/V of the prefixes it saves (``dev.save_rows`` of each layer)."""


class PackedDecoder:
    """Runs packed batches through a Qwen3/Qwen2/Llama causal LM's decoder layers.

    Shapes in the comments: T stream tokens, KV key/value rows (the stream's, then the loaded
    prefixes'), S segments, N prompts, H hidden size, Hq/Hkv query/key-value heads of D dimensions,
    Nq = Hq * D, Nkv = Hkv * D, I the MLP's intermediate size.

    Raises :class:`~genscore_core.errors.KernelUnavailableError` when ``options`` ask for Triton
    explicitly and it cannot run this model here.
    """

    def __init__(self, model: Any, options: PackedOptions | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the packed forward cannot run {type(model).__name__}: {reason}")
        self.options = options = options if options is not None else PackedOptions()
        decoder = decoder_of(model)
        config = model.config
        self.embed: torch.Tensor = decoder.embed_tokens.weight
        self.device = self.embed.device
        self.dtype = self.embed.dtype
        self.rotary = decoder.rotary_emb
        self.final_norm: torch.Tensor = decoder.norm.weight
        self.eps = float(getattr(decoder.norm, "variance_epsilon", getattr(config, "rms_norm_eps", 1e-6)))
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.scale = float(getattr(decoder.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        self.layers = [_fused_layer(layer, i) for i, layer in enumerate(decoder.layers)]
        self.fp8: list[Fp8Layer] | None = None
        """The layers' quantised products, with ``quantization="fp8"``."""
        if options.quantization == "fp8":
            self.fp8 = [Fp8Layer.of(layer, self.dtype) for layer in self.layers]
        self._cos = torch.empty(0, self.head_dim, device=self.device)
        self._sin = torch.empty(0, self.head_dim, device=self.device)
        self._resolve_kernels(options)

    def _resolve_kernels(self, options: PackedOptions) -> None:
        """Each kernel's implementation, decided once, so that a Triton request the model cannot meet
        fails here, not mid-batch."""
        probe_q = torch.empty(0, self.num_heads, self.head_dim, device="meta")
        probe_k = torch.empty(0, self.num_kv_heads, self.head_dim, device="meta")
        odd_rope = None
        if self.head_dim & (self.head_dim - 1):
            odd_rope = f"head dimension {self.head_dim} is not a power of two"
        triton_attention = use_triton(
            options.attention, self.device, kernel="segment_attention",
            unsupported=attention_unsupported(probe_q, probe_k),
        )  # fmt: skip
        triton_ops = use_triton(options.fused_ops, self.device, kernel="fused ops")
        triton_rope = use_triton(options.fused_ops, self.device, kernel="rope", unsupported=odd_rope)
        first = self.layers[0]
        probe_x = torch.empty(0, first.gate[0].shape[1], dtype=self.dtype, device="meta")
        triton_mlp = use_triton(
            options.gated_mlp, self.device, kernel="gated_mlp",
            unsupported=gated_mlp_unsupported(probe_x, first.gate, first.up),
        )  # fmt: skip
        if options.gated_mlp == "auto" and self.dtype not in (torch.bfloat16, torch.float16):
            triton_mlp = False  # measured in bf16 only; float32 products stay with cuBLAS
        self.attention_impl: KernelImpl = "triton" if triton_attention else "torch"
        self.ops_impl: KernelImpl = "triton" if triton_ops else "torch"
        self.rope_impl: KernelImpl = "triton" if triton_rope else "torch"
        self.mlp_impl: KernelImpl = "triton" if triton_mlp else "torch"
        # Rows from which "auto" runs the cuBLAS product instead (the kernel runs at any size).
        self.mlp_max_rows = GATED_MLP_MAX_TOKENS if options.gated_mlp == "auto" else None

    def rope_tables(self, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin tables [>= max_position + 1, D] from the model's own rotary module."""
        if self._cos.shape[0] <= max_position:
            length = max(256, 1 << max_position.bit_length())
            positions = torch.arange(length, device=self.device)[None]
            probe = torch.empty(0, device=self.device, dtype=torch.float32)
            cos, sin = self.rotary(probe, positions)
            self._cos = cos[0].float().contiguous()
            self._sin = sin[0].float().contiguous()
        return self._cos, self._sin

    # -- one batch through every layer ----------------------------------------------------------------
    #
    # Each phase is a function, so that what a phase allocates is freed when it returns: the q/k/v
    # buffer before the output projection allocates, the gate/up product before the down projection.
    # The order of the kernels is the order of the statements; nothing here reads a device value on
    # the host, so :mod:`genscore_core.packed.graphs` can capture a whole run.

    def run(
        self, dev: DeviceBatch, loaded: KV | None = None, into: StaticOutputs | None = None
    ) -> tuple[torch.Tensor, KV | None]:
        """Hidden states after the final norm at each prompt's last token: [N, H] float32.

        ``loaded``: K and V [layers, P, Hkv, D] of the prefixes this batch loads (``batch.load``, in
        order). Also returns the K and V of the prefixes it must save (``batch.save``), or None.
        ``into``: buffers the results are written into (and returned as views of), so that the
        graphs of every rung share one set of outputs (:mod:`genscore_core.packed.graphs`).
        """
        cos, sin = self.rope_tables(dev.max_position)
        step = _Pass(dev, cos, sin, loaded, self._save_buffers(dev, into))
        # The residual stream stays float32; only the inputs of products are in the model's dtype.
        residual = F.embedding(dev.input_ids, self.embed).float()  # [T, H]
        h = self._add_norm(residual, None, self.layers[0].ln1)  # [T, H]
        for index, layer in enumerate(self.layers[:-1]):
            h = self._add_norm(residual, self._attention(step, index, h), layer.ln2)  # [T, H]
            h = self._add_norm(residual, self._mlp(index, h), self.layers[index + 1].ln1)  # [T, H]
        rows = self._last_layer(step, h, residual)  # [N, H]
        if into is None:
            return rows, step.saved
        into.rows[: rows.shape[0]].copy_(rows)
        return into.rows[: rows.shape[0]], step.saved

    def _attention(self, step: _Pass, index: int, h: Rows) -> torch.Tensor:
        """Every stream token's attention over its segment, through the output projection: [T, H]."""
        layer, dev = self.layers[index], step.dev
        # attn: [T, Hq, D]. q, k and v are handed on, not kept: their buffer is freed when _attend
        # returns, before the output projection allocates.
        attn = self._attend(step, layer, *self._qkv(step, index, h), dev.segments, dev.positions)
        return self._output(index, attn)  # [T, H]

    def _output(self, index: int, attn: torch.Tensor) -> torch.Tensor:
        """The output projection of attention [rows, Hq, D]: [rows, H], in the model's dtype with FP8
        too (:mod:`genscore_core.packed.fp8` says why)."""
        return F.linear(attn.view(attn.shape[0], -1), *self.layers[index].o)

    def _qkv(self, step: _Pass, index: int, h: Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [T, Hq, D] (not yet rotated), keys and values [KV, Hkv, D]: one GEMM's column
        blocks, read with its row stride (:meth:`_keys_values`)."""
        qkv = self._project(h, index, "qkv", step.dev.kv_len)  # [KV, Nq + 2 Nkv]
        tokens, q_width = step.dev.num_tokens, self.num_heads * self.head_dim
        q = qkv[:tokens, :q_width].view(tokens, self.num_heads, self.head_dim)
        k, v = self._keys_values(step, index, qkv[:, q_width:])
        return q, k, v

    def _project(self, h: Rows, index: int, name: Literal["qkv", "kv"], rows: int) -> torch.Tensor:
        """``h @ weight.T (+ bias)`` into the first T rows of a new [rows, N] buffer: the rows past
        the stream's are where :meth:`_keys_values` puts the loaded prefixes' keys and values."""
        weight, bias = getattr(self.layers[index], name)
        out = torch.empty((rows, weight.shape[0]), dtype=self.dtype, device=self.device)
        if isinstance(h, Fp8Rows):
            assert self.fp8 is not None
            getattr(self.fp8[index], name)(h, out=out[: h.shape[0]])
            return out
        if bias is None:
            torch.mm(h, weight.t(), out=out[: h.shape[0]])
        else:
            torch.addmm(bias, h, weight.t(), out=out[: h.shape[0]])
        return out

    def _keys_values(self, step: _Pass, index: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [KV, Hkv, D] from ``kv`` [KV, 2 Nkv] (the stream's rows projected): keys normed
        and rotated, the loaded prefixes' rows filled in after the stream's, the saved ones copied out.
        Attention then reads each group's prefix keys where they are, never copied per prompt."""
        dev, layer, tokens = step.dev, self.layers[index], step.dev.num_tokens
        width = self.num_kv_heads * self.head_dim
        k = kv[:, :width].view(dev.kv_len, self.num_kv_heads, self.head_dim)
        v = kv[:, width:].view(dev.kv_len, self.num_kv_heads, self.head_dim)
        fused_ops.rope(
            k[:tokens], self.num_kv_heads, layer.k_norm, self.eps, step.cos, step.sin, dev.positions,
            k[:tokens], impl=self.rope_impl,
        )  # fmt: skip
        if step.loaded is not None:
            k[tokens:].copy_(step.loaded[0][index])
            v[tokens:].copy_(step.loaded[1][index])
        if step.saved is not None and dev.save_rows is not None:
            torch.index_select(k, 0, dev.save_rows, out=step.saved[0][index])
            torch.index_select(v, 0, dev.save_rows, out=step.saved[1][index])
        return k, v

    def _attend(
        self, step: _Pass, layer: _Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        segments: Segments, positions: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Queries [rows, Hq, D] normed and rotated in place at ``positions`` [rows], then each
        segment's attention over its prefix and its own keys: [rows, Hq, D]."""
        fused_ops.rope(
            q, self.num_heads, layer.q_norm, self.eps, step.cos, step.sin, positions, q, impl=self.rope_impl
        )
        return segment_attention(q, k, v, segments, self.scale, impl=self.attention_impl)

    def _mlp(self, index: int, h: Rows) -> torch.Tensor:
        """The gated MLP: [rows, H] -> [rows, H]."""
        if isinstance(h, Fp8Rows):
            assert self.fp8 is not None
            fp8 = self.fp8[index]
            gate_up = fp8.gate_up(h)  # [rows, 2I]
            half = gate_up.shape[1] // 2
            act = fused_ops.silu_mul_fp8(gate_up[:, :half], gate_up[:, half:], impl=self.ops_impl)
            return fp8.down(Fp8Rows(*act))
        layer = self.layers[index]
        return F.linear(self._gated(layer, h), *layer.down)

    def _gated(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        """``silu(h @ Wg.T + bg) * (h @ Wu.T + bu)``: [rows, I]."""
        if self.mlp_impl == "triton" and (self.mlp_max_rows is None or h.shape[0] < self.mlp_max_rows):
            # One GEMM kernel: the gate and up products never leave the chip.
            return gated_mlp(h, layer.gate, layer.up, impl="triton")
        gate_up = F.linear(h, *layer.gate_up)  # [rows, 2I]
        half = gate_up.shape[1] // 2
        return fused_ops.silu_mul(gate_up[:, :half], gate_up[:, half:], impl=self.ops_impl)

    def _last_layer(self, step: _Pass, h: Rows, residual: torch.Tensor) -> torch.Tensor:
        """The last layer where its output is read: keys and values at every row (the queries read
        them), queries and attention at each segment's last token, the rest at each prompt's only
        (a prefix's segment feeds no score); then the final norm, in float32: [N, H]."""
        index, layer, dev = len(self.layers) - 1, self.layers[-1], step.dev
        k, v = self._keys_values(step, index, self._project(h, index, "kv", dev.kv_len))  # [KV, Hkv, D]
        last = dev.segment_last
        h = h.index_select(0, last)  # [S, H]
        residual = residual.index_select(0, last)  # [S, H]
        positions = dev.positions.index_select(0, last)  # [S]
        if isinstance(h, Fp8Rows):
            assert self.fp8 is not None
            q = self.fp8[index].q(h)
        else:
            q = F.linear(h, *layer.q)
        q = q.view(h.shape[0], self.num_heads, self.head_dim)  # [S, Hq, D]
        attn = self._attend(step, layer, q, k, v, dev.last_segments, positions)  # [S, Hq, D]
        attn = attn.index_select(0, dev.prompt_segments)  # [N, Hq, D]
        residual = residual.index_select(0, dev.prompt_segments)  # [N, H]
        h = self._add_norm(residual, self._output(index, attn), layer.ln2)
        return self._add_norm(residual, self._mlp(index, h), self.final_norm, torch.float32)

    @typing.overload
    def _add_norm(self, residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> Rows: ...
    @typing.overload
    def _add_norm(
        self, residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor: ...
    def _add_norm(
        self, residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
        dtype: torch.dtype | None = None,
    ) -> Rows:  # fmt: skip
        """``residual += delta`` in place (float32), then its RMSNorm times ``weight``, in the
        model's dtype (the next product's input; quantised per token with FP8) or ``dtype``: [rows, H]."""
        if self.fp8 is not None and dtype is None:
            return Fp8Rows(*fused_ops.add_rmsnorm_fp8(residual, delta, weight, self.eps, impl=self.ops_impl))
        return fused_ops.add_rmsnorm(
            residual, delta, weight, self.eps, dtype or self.dtype, impl=self.ops_impl
        )

    def _save_buffers(self, dev: DeviceBatch, into: StaticOutputs | None) -> KV | None:
        """Where the K/V [layers, saved rows, Hkv, D] of the prefixes ``dev`` saves go, or None."""
        if dev.save_rows is None:
            return None
        rows = dev.save_rows.numel()
        if into is not None:
            return into.saved[0][:, :rows], into.saved[1][:, :rows]
        shape = (len(self.layers), rows, self.num_kv_heads, self.head_dim)
        return (
            torch.empty(shape, dtype=self.dtype, device=self.device),
            torch.empty(shape, dtype=self.dtype, device=self.device),
        )
