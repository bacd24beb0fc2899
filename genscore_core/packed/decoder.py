"""A lean packed forward of Qwen3 / Qwen2 / Llama decoder layers over the loaded model's own weights.

Nothing is copied: every matrix is the ``nn.Linear`` weight of the Hugging Face model, read in place.
With ``PackedOptions.fused_projections`` (the default) each layer's q/k/v weights are first moved into
one [Nq + Nk + Nv, H] tensor and its gate/up weights into one [2I, H] tensor, and the modules' weights
are re-pointed to views of them (same values, no second copy; see :func:`fuse_linears`), so a layer
runs one q/k/v GEMM and one gate/up GEMM instead of five. One call runs one
:class:`~genscore_core.packed.plan.PackedBatch` through all layers:

* the residual stream is float32 [T, H] (``PackedOptions.residual_dtype``); RMSNorms, Qwen3's q/k norms
  and rotary embeddings compute in float32; only the inputs of matrix products are in the model's dtype;
* K and V are written straight into the batch's key/value buffer, row ``t`` for stream token ``t``
  (with fused projections, column blocks of the one q/k/v GEMM's output, read with its row stride);
  attention reads each group's prefix keys where they were computed, once per group, never copied;
* the last layer computes queries, attention, MLP and the final norm only at the last token of each
  segment, since nothing reads the other positions' output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

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
    """References to one decoder layer's parameters (no copies)."""

    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    ln1: torch.Tensor
    ln2: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qkv: Linear | None = None
    """q, k and v as one [Nq + Nk + Nv, H] matrix (rows in that order), or None (separate products)."""
    gate_up: Linear | None = None
    """gate and up as one [2I, H] matrix, or None."""


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
        host, sizes, table, last = flat_layout(like, shape)
        flat = host.to(device)
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
    """How the packed decoder computes; the defaults are what the engine runs.

    The other values exist so that tests can run the Triton kernels on the CPU (``all_kernels("triton")``
    under ``TRITON_INTERPRET=1``) and benchmarks can measure what each step is worth.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention: KernelImpl = "auto"
    """Implementation of the segment attention (:mod:`genscore_core.kernels.dispatch`)."""
    fused_ops: KernelImpl = "auto"
    """Implementation of add+RMSNorm, q/k norm+rotary and silu*mul."""
    gated_mlp: KernelImpl = "auto"
    """Implementation of the MLP's gate and up products with silu*mul: "triton" is one GEMM kernel that
    applies silu*mul to its accumulators (:mod:`genscore_core.kernels.gated_mlp`) on every batch;
    "torch" runs the two products (cuBLAS on CUDA), then silu*mul as ``fused_ops`` says; "auto" runs
    the kernel on CUDA for bf16/fp16 batches under ``gated_mlp_max_tokens`` and the products
    otherwise."""
    gated_mlp_max_tokens: int = Field(default=16384, ge=0)
    """With ``gated_mlp="auto"``, batches of at least this many (padded) tokens run the cuBLAS products
    and silu*mul: on an H200 the kernel saved 0.4-0.7 ms a call on W4 (~9k tokens) but nothing
    on W1's 40-64k-token batches, where cuBLAS's products ran faster than in isolation
    (docs/benchmarks.md, "Gate/up GEMM with silu*mul")."""
    residual_dtype: Literal["float32", "model"] = "float32"
    """The residual stream's dtype: "float32" whatever the model's; "model": the model's own (bf16 in a
    bf16 model, as the Hugging Face forward keeps it; in a float32 model the same as "float32"). The
    adds and norms compute in float32 either way; "model" rounds the stream to the model's dtype after
    each add, so the add+RMSNorm kernels move a third fewer bytes. Measured on an H200 with a bf16
    Qwen3-0.6B shape: 2-3% faster on W1 and W4 (-3.8 and -0.4 ms a call), but its scores further
    from a float32 reference than the official bf16 recipe's on two of five score sets (mean error
    2% above to 19% below the official recipe's; float32's 5-27% below): the default keeps float32
    (docs/benchmarks.md, "Residual stream")."""
    trim_last_layer: bool = True
    """Compute the last layer's queries, attention and MLP only where the output is read."""
    graph_tokens: int = Field(default=16384, ge=0)
    """On CUDA, batches of up to this many tokens (after padding) replay CUDA graphs of the decoder
    (:mod:`genscore_core.packed.graphs`) when the attention is the Triton kernel; 0 never does."""
    large_graph_tokens: int = Field(default=65536, ge=0)
    """Batches over ``graph_tokens`` and up to this many tokens replay CUDA graphs too, padded to
    coarser steps (a streamed call's batches fill fixed token targets, so their shapes repeat); 0:
    they run eagerly."""
    graph_prefixes: bool = True
    """Batches that carry a group's prefix keys/values to a later batch (load or save them) replay
    CUDA graphs too."""
    fused_projections: bool = True
    """One q/k/v GEMM and one gate/up GEMM per layer instead of five: at build, each layer's q/k/v
    and gate/up weights move into one tensor each and the model's modules are re-pointed to views
    of them (:func:`fuse_linears`: same values, held once). False leaves the model untouched and
    runs the separate products (a benchmark's baseline)."""

    @classmethod
    def all_kernels(cls, impl: KernelImpl, **other: Any) -> PackedOptions:
        """The same implementation for attention, the fused operations and the gated MLP."""
        return cls(attention=impl, fused_ops=impl, gated_mlp=impl, **other)


class PackedDecoder:
    """Runs packed batches through a Qwen3/Qwen2/Llama causal LM's decoder layers.

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
        self.layers = [self._layer(layer, options.fused_projections) for layer in decoder.layers]
        self._cos = torch.empty(0, self.head_dim, device=self.device)
        self._sin = torch.empty(0, self.head_dim, device=self.device)
        self.residual_dtype = torch.float32 if options.residual_dtype == "float32" else self.dtype
        # Resolved once, so that a Triton request the model cannot meet fails here, not mid-batch.
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
        self.attention_impl: KernelImpl = "triton" if triton_attention else "torch"
        self.ops_impl: KernelImpl = "triton" if triton_ops else "torch"
        self.rope_impl: KernelImpl = "triton" if triton_rope else "torch"
        first = self.layers[0]
        probe_x = torch.empty(0, first.gate[0].shape[1], dtype=self.dtype, device="meta")
        triton_mlp = use_triton(
            options.gated_mlp, self.device, kernel="gated_mlp",
            unsupported=gated_mlp_unsupported(probe_x, first.gate, first.up),
        )  # fmt: skip
        if options.gated_mlp == "auto" and self.dtype not in (torch.bfloat16, torch.float16):
            triton_mlp = False  # measured in bf16 only; float32 products stay with cuBLAS
        self.mlp_impl: KernelImpl = "triton" if triton_mlp else "torch"
        # Rows from which "auto" runs the cuBLAS products instead (the kernel runs at any size).
        self.mlp_max_rows = options.gated_mlp_max_tokens if options.gated_mlp == "auto" else None

    @staticmethod
    def _layer(layer: Any, fused: bool) -> _Layer:
        w = _weights(layer)
        attn, mlp = layer.self_attn, layer.mlp
        # Fused first: the separate (weight, bias) pairs below are then the views into the fused ones.
        qkv = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj]) if fused else None
        gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj]) if fused else None
        return _Layer(
            qkv=qkv,
            gate_up=gate_up,
            q=_linear(attn.q_proj),
            k=_linear(attn.k_proj),
            v=_linear(attn.v_proj),
            o=_linear(attn.o_proj),
            gate=_linear(mlp.gate_proj),
            up=_linear(mlp.up_proj),
            down=_linear(mlp.down_proj),
            ln1=layer.input_layernorm.weight,
            ln2=layer.post_attention_layernorm.weight,
            q_norm=w["q_norm"],
            k_norm=w["k_norm"],
        )

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

    def run(
        self,
        dev: DeviceBatch,
        loaded: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Hidden states after the final norm at each prompt's last token: [N, H] float32.

        ``loaded``: K and V [layers, P, Hkv, D] of the prefixes this batch loads (``batch.load``, in
        order). Also returns the K and V of the prefixes it must save (``batch.save``), or None.
        """
        tokens = dev.num_tokens
        kv_len = dev.kv_len
        cos, sin = self.rope_tables(dev.max_position)
        n_layers = len(self.layers)
        kv_width = self.num_kv_heads * self.head_dim
        q_width = self.num_heads * self.head_dim
        saved: tuple[torch.Tensor, torch.Tensor] | None = None
        if dev.save_rows is not None:
            shape = (n_layers, dev.save_rows.numel(), self.num_kv_heads, self.head_dim)
            saved = (
                torch.empty(shape, dtype=self.dtype, device=self.device),
                torch.empty(shape, dtype=self.dtype, device=self.device),
            )

        impl = self.ops_impl
        residual = F.embedding(dev.input_ids, self.embed).to(self.residual_dtype)  # [T, H]
        h = fused_ops.add_rmsnorm(residual, None, self.layers[0].ln1, self.eps, self.dtype, impl=impl)
        positions_q = dev.positions
        for index, layer in enumerate(self.layers):
            last = self.options.trim_last_layer and index == n_layers - 1
            # Row t of K/V is stream token t; loaded prefixes follow the stream.
            q: torch.Tensor | None = None
            if layer.qkv is not None:
                # One GEMM writes [tokens, q | k | v] into a buffer of kv_len rows, whose k and v
                # column blocks are K and V (rows past the stream: the loaded prefixes). The trimmed
                # last layer computes q only at the rows it keeps (below): k and v alone here.
                first = q_width if last else 0
                weight, bias = layer.qkv
                qkv = torch.empty((kv_len, weight.shape[0] - first), dtype=self.dtype, device=self.device)
                _linear_into(h, (weight[first:], None if bias is None else bias[first:]), qkv[:tokens])
                k_col = q_width - first
                if not last:
                    q = qkv[:tokens, :q_width].view(tokens, self.num_heads, self.head_dim)
                k = qkv[:, k_col : k_col + kv_width].view(kv_len, self.num_kv_heads, self.head_dim)
                v = qkv[:, k_col + kv_width :].view(kv_len, self.num_kv_heads, self.head_dim)
                del qkv
            else:
                k = torch.empty((kv_len, kv_width), dtype=self.dtype, device=self.device)
                v = torch.empty_like(k)
                _linear_into(h, layer.k, k[:tokens])
                _linear_into(h, layer.v, v[:tokens])
                k = k.view(kv_len, self.num_kv_heads, self.head_dim)
                v = v.view(kv_len, self.num_kv_heads, self.head_dim)
            fused_ops.rope(
                k[:tokens], self.num_kv_heads, layer.k_norm, self.eps, cos, sin, dev.positions, k[:tokens],
                impl=self.rope_impl,
            )  # fmt: skip
            if loaded is not None:
                k[tokens:].copy_(loaded[0][index])
                v[tokens:].copy_(loaded[1][index])
            if saved is not None and dev.save_rows is not None:
                torch.index_select(k, 0, dev.save_rows, out=saved[0][index])
                torch.index_select(v, 0, dev.save_rows, out=saved[1][index])
            if last:
                # Only the last token of each segment feeds anything from here on.
                h = h.index_select(0, dev.segment_last)
                residual = residual.index_select(0, dev.segment_last)
                positions_q = dev.positions.index_select(0, dev.segment_last)
            if q is None:
                # With fused projections, layer.q is the q rows of the fused weight (a view).
                q = F.linear(h, *layer.q).view(h.shape[0], self.num_heads, self.head_dim)
            fused_ops.rope(
                q, self.num_heads, layer.q_norm, self.eps, cos, sin, positions_q, q, impl=self.rope_impl
            )
            segments = dev.last_segments if last else dev.segments
            attn = segment_attention(q, k, v, segments, self.scale, impl=self.attention_impl)
            del q, k, v
            if last:
                attn = attn.index_select(0, dev.prompt_segments)
                residual = residual.index_select(0, dev.prompt_segments)
            attn_out = F.linear(attn.view(attn.shape[0], -1), *layer.o)
            del attn
            h = fused_ops.add_rmsnorm(residual, attn_out, layer.ln2, self.eps, self.dtype, impl=impl)
            del attn_out
            if self.mlp_impl == "triton" and (self.mlp_max_rows is None or h.shape[0] < self.mlp_max_rows):
                # One GEMM kernel: the gate and up products never leave the chip.
                act = gated_mlp(h, layer.gate, layer.up, impl="triton")
            elif layer.gate_up is not None:
                # One GEMM [rows, gate | up], then silu*mul reading its two halves in place.
                gate_up = F.linear(h, *layer.gate_up)
                half = gate_up.shape[1] // 2
                act = fused_ops.silu_mul(gate_up[:, :half], gate_up[:, half:], impl=impl)
                del gate_up
            else:
                act = fused_ops.silu_mul(F.linear(h, *layer.gate), F.linear(h, *layer.up), impl=impl)
            mlp_out = F.linear(act, *layer.down)
            del act
            if index == n_layers - 1:
                if not last:
                    rows = dev.segment_last.index_select(0, dev.prompt_segments)
                    residual = residual.index_select(0, rows)
                    mlp_out = mlp_out.index_select(0, rows)
                h = fused_ops.add_rmsnorm(
                    residual, mlp_out, self.final_norm, self.eps, torch.float32, impl=impl
                )
            else:
                h = fused_ops.add_rmsnorm(
                    residual, mlp_out, self.layers[index + 1].ln1, self.eps, self.dtype, impl=impl
                )
            del mlp_out
        return h, saved


def _linear_into(x: torch.Tensor, linear: Linear, out: torch.Tensor) -> None:
    """``out = x @ weight.T (+ bias)``, written straight into a view of a larger buffer."""
    weight, bias = linear
    if bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)
