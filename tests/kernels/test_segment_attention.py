"""The packed attention kernel against its torch reference, and the reference against a dense float64
computation written from the definition (conftest.py runs Triton through its CPU interpreter).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from genscore_core.kernels.attention import (
    DEFAULT_TILING,
    LAST_TOKEN_TILING,
    AttentionTiling,
    Segments,
    segment_attention,
    segment_attention_reference,
)

pytest.importorskip("triton")


def random_layout(rng: random.Random, n_segments: int, last_only: bool) -> tuple[np.ndarray, int, int]:
    """Prefix segments and prompt segments that read one of them, packed like the decoder packs them.

    Returns the segment table, the number of query rows and the number of key rows.
    """
    rows: list[list[int]] = []
    prefixes: list[tuple[int, int]] = []
    stream = 0
    for _ in range(n_segments):
        if not prefixes or rng.random() < 0.25:
            length = rng.randint(1, 40)
            prefixes.append((stream, length))
            rows.append([stream, length, stream, length, 0, 0])
        else:
            length = rng.randint(1, 90)
            start, plen = rng.choice([*prefixes, (0, 0)])
            rows.append([stream, length, stream, length, start, plen])
        stream += length
    table = np.asarray(rows, dtype=np.int64)
    if last_only:  # one query per segment, its last token, in a separate query tensor
        table[:, 0] = np.arange(len(table))
        table[:, 1] = 1
        return table, len(table), stream
    return table, stream, stream


def dense_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: np.ndarray, scale: float
) -> torch.Tensor:
    """float64, one query at a time, from the definition: softmax over the visible keys."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for q_start, q_len, k_start, k_len, p_start, p_len in table.tolist():
        keys = list(range(p_start, p_start + p_len))
        for j in range(q_len):
            visible = keys + list(range(k_start, k_start + k_len - q_len + j + 1))
            for head in range(q.shape[1]):
                qv = q[q_start + j, head].double()
                kv = k[visible, head // group].double()
                weights = torch.softmax(kv @ qv * scale, dim=0)
                out[q_start + j, head] = weights @ v[visible, head // group].double()
    return out


@pytest.mark.parametrize("last_only", [False, True])
def test_reference_matches_definition(last_only: bool) -> None:
    rng = random.Random(1)
    table, tq, tk = random_layout(rng, 12, last_only)
    q, k, v = torch.randn(tq, 4, 16), torch.randn(tk, 2, 16), torch.randn(tk, 2, 16)
    got = segment_attention_reference(q, k, v, table, 0.25)
    torch.testing.assert_close(got.double(), dense_reference(q, k, v, table, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_elements", [1, 100, 1 << 21])
def test_reference_in_blocks_matches_definition(block_elements: int) -> None:
    """Long prompt segments after a prefix, run in query blocks of every size from one query up."""
    rows, stream = [[0, 30, 0, 30, 0, 0]], 30
    for length in (1, 2, 57, 200):
        rows.append([stream, length, stream, length, 0, 30])
        stream += length
    rows.append([stream, 150, stream, 150, 0, 0])  # no prefix: SDPA's own causal mask
    table = np.asarray(rows, dtype=np.int64)
    q, k, v = (
        torch.randn(stream + 150, 6, 16),
        torch.randn(stream + 150, 2, 16),
        torch.randn(stream + 150, 2, 16),
    )
    got = segment_attention_reference(q, k, v, table, 0.3, block_elements=block_elements)
    torch.testing.assert_close(got.double(), dense_reference(q, k, v, table, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "config, heads, kv_heads, dim, dtype, last_only, seed",
    [
        (AttentionTiling(block_m=16, block_n=16, heads=2), 4, 2, 16, torch.float32, False, 0),
        (AttentionTiling(block_m=32, block_n=16, heads=1), 4, 2, 32, torch.float32, False, 1),
        (AttentionTiling(block_m=16, block_n=32, heads=4), 8, 2, 16, torch.float32, False, 2),
        (AttentionTiling(block_m=16, block_n=16, heads=2), 6, 2, 16, torch.float32, False, 3),  # group 3
        (AttentionTiling(block_m=16, block_n=16, heads=2), 2, 2, 16, torch.float32, False, 4),  # no GQA
        (AttentionTiling(block_m=16, block_n=16, heads=2), 4, 2, 16, torch.float32, True, 5),
        (AttentionTiling(block_m=16, block_n=16, heads=2, tma=True), 4, 2, 16, torch.float32, False, 7),
        (AttentionTiling(block_m=32, block_n=16, heads=1, tma=True), 4, 2, 16, torch.float32, True, 8),
        # bfloat16 at model shapes: test_kernel_on_model_shapes_against_float64.
        (AttentionTiling(block_m=16, block_n=16, heads=2), 4, 2, 16, torch.float16, False, 6),
    ],
)
def test_kernel_matches_reference(
    config: AttentionTiling,
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype,
    last_only: bool,
    seed: int,
) -> None:
    rng = random.Random(seed)
    table, tq, tk = random_layout(rng, rng.randint(3, 9), last_only)
    torch.manual_seed(seed)
    q = torch.randn(tq, heads, dim).to(dtype)
    k = torch.randn(tk, kv_heads, dim).to(dtype)
    v = torch.randn(tk, kv_heads, dim).to(dtype)
    scale = 1 / math.sqrt(dim)
    segments = Segments.build(table, torch.device("cpu"), config)
    got = segment_attention(q, k, v, segments, scale, impl="triton")
    want = segment_attention_reference(q.float(), k.float(), v.float(), table, scale)
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_blocks_cover_every_query_once_longest_first() -> None:
    table, _, _ = random_layout(random.Random(7), 20, False)
    segments = Segments.build(table, torch.device("cpu"), AttentionTiling(block_m=16))
    blocks = segments.blocks.tolist()
    covered = sorted((s, first + i) for s, first in blocks for i in range(16) if first + i < table[s, 1])
    assert covered == sorted((s, j) for s in range(len(table)) for j in range(int(table[s, 1])))

    def work(s: int, first: int) -> int:
        return int(table[s, 5] + table[s, 3] - table[s, 1] + min(first + 16, table[s, 1]))

    # Each segment's blocks together, longest first within; segments by their total work.
    order = [s for i, (s, _) in enumerate(blocks) if i == 0 or blocks[i - 1][0] != s]
    assert sorted(order) == list(range(len(table)))
    totals = [sum(work(*b) for b in blocks if b[0] == s) for s in order]
    assert totals == sorted(totals, reverse=True)
    for s in order:
        mine = [work(*b) for b in blocks if b[0] == s]
        assert mine == sorted(mine, reverse=True)


def test_rejects_more_queries_than_keys() -> None:
    with pytest.raises(ValueError, match="segment 1 has 5 queries but only 4 own keys"):
        Segments.build(np.asarray([[0, 1, 0, 1, 0, 0], [1, 5, 1, 4, 0, 0]]), torch.device("cpu"))


def awkward_layout() -> tuple[np.ndarray, int]:
    """Segments at and around the tile sizes (16 here): query counts 1, 15-17, 32-33 and 50, own
    keys equal to the queries or more (``k_len > q_len``: the queries are the last of the keys),
    prefixes of 0, 1, 17 and 32 keys. Returns the table and the number of rows."""
    rows: list[list[int]] = []
    stream = 0
    prefixes = []
    for p_len in (1, 17, 32):
        rows.append([stream, p_len, stream, p_len, 0, 0])
        prefixes.append((stream, p_len))
        stream += p_len
    prefixes.append((0, 0))
    for i, (q_len, extra) in enumerate(
        [(1, 0), (15, 0), (16, 0), (17, 0), (32, 0), (33, 0), (50, 0), (1, 16), (15, 5), (17, 16), (33, 1)]
    ):
        p_start, p_len = prefixes[i % len(prefixes)]
        k_len = q_len + extra
        # The queries are the last q_len of the segment's k_len stream rows.
        rows.append([stream + extra, q_len, stream, k_len, p_start, p_len])
        stream += k_len
    return np.asarray(rows, dtype=np.int64), stream


@pytest.mark.parametrize(
    "config",
    [
        AttentionTiling(block_m=16, block_n=16, heads=2),
        AttentionTiling(block_m=16, block_n=16, heads=2, tma=True),
        AttentionTiling(block_m=32, block_n=16, heads=2, tma=True),
        AttentionTiling(block_m=16, block_n=32, heads=1),
        DEFAULT_TILING,
        LAST_TOKEN_TILING,
    ],
)
def test_kernel_on_awkward_shapes(config: AttentionTiling) -> None:
    """Prefix and own tiles in one loop, masked per query, at segment and prefix lengths on both
    sides of the tile sizes, against the reference. Some keys are made large, so that row maxima
    jump in mid-segment and the running rescale matters."""
    table, rows = awkward_layout()
    torch.manual_seed(config.block_m + config.block_n)
    q, k, v = torch.randn(rows, 4, 16), torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    k[torch.randperm(rows)[: rows // 10]] *= 12.0
    segments = Segments.build(table, torch.device("cpu"), config)
    got = segment_attention(q, k, v, segments, 0.25, impl="triton")
    want = segment_attention_reference(q, k, v, table, 0.25)
    queries = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in table[:, :2]]))
    torch.testing.assert_close(got[queries], want[queries], atol=1e-5, rtol=1e-5)


def test_dense_by_segment_is_the_definition() -> None:
    """The vectorised float64 reference below against the one-query-at-a-time one above."""
    table, rows = awkward_layout()
    q, k, v = torch.randn(rows, 4, 16), torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    queries = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in table[:, :2]]))
    torch.testing.assert_close(
        dense_by_segment(q, k, v, table, 0.3)[queries], dense_reference(q, k, v, table, 0.3)[queries]
    )


def test_reference_on_awkward_shapes() -> None:
    """The reference from the definition on the layout above (queries after extra own keys)."""
    table, rows = awkward_layout()
    torch.manual_seed(0)
    q, k, v = torch.randn(rows, 4, 16), torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    want = segment_attention_reference(q, k, v, table, 0.25)
    exact = dense_reference(q, k, v, table, 0.25)
    queries = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in table[:, :2]]))
    torch.testing.assert_close(want[queries].double(), exact[queries], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pad", [0, 1])
@pytest.mark.parametrize(
    "config", [AttentionTiling(block_m=16, block_n=16, heads=2, tma=True), DEFAULT_TILING]
)
def test_kernel_reads_column_blocks_of_one_qkv_product(config: AttentionTiling, pad: int) -> None:
    """q, k and v as column blocks of one [rows, q | k | v (| pad)] buffer, as the decoder's fused
    q/k/v GEMM writes them: K/V through TMA descriptors with the buffer's row stride (pad 0) or
    through pointer loads where that stride is not a multiple of 16 bytes (pad 1)."""
    from genscore_core.kernels import attention_triton

    table, rows = awkward_layout()
    qkv = torch.randn(rows, (4 + 2 + 2) * 16 + pad)
    qkv[torch.randperm(rows)[: rows // 10], 64:96] *= 12.0  # large keys: row maxima jump mid-segment
    q = qkv[:, :64].view(rows, 4, 16)
    k = qkv[:, 64:96].view(rows, 2, 16)
    v = qkv[:, 96:128].view(rows, 2, 16)
    assert attention_triton._tma_ready(k) == (pad == 0)
    segments = Segments.build(table, torch.device("cpu"), config)
    got = segment_attention(q, k, v, segments, 0.25, impl="triton")
    assert got.is_contiguous()
    want = segment_attention_reference(q.contiguous(), k.contiguous(), v.contiguous(), table, 0.25)
    queries = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in table[:, :2]]))
    torch.testing.assert_close(got[queries], want[queries], atol=1e-5, rtol=1e-5)
    strided_reference = segment_attention_reference(q, k, v, table, 0.25)
    torch.testing.assert_close(strided_reference[queries], want[queries])


def model_shaped_layout() -> tuple[np.ndarray, int]:
    """The layouts a packed batch makes at DEFAULT_TILING's block of 32 queries: one-token prompts,
    a prompt of exactly one block and one of a block and one, a prefix read by many one- and two-token
    prompts, a segment with no queries of its own after a prefix, many tiny segments, and a spare
    segment with no queries and no keys."""
    rows: list[list[int]] = [[0, 20, 0, 20, 0, 0]]  # a prefix
    stream = 20
    for length, prefix in [(1, 20), (32, 20), (33, 20), (32, 0), (33, 0), (1, 0), (0, 20)] + [
        (1 + i % 2, 20 if i % 3 else 0) for i in range(6)
    ]:
        rows.append([stream, length, stream, length, 0, prefix])
        stream += length
    rows.append([0, 0, 0, 0, 0, 0])
    return np.asarray(rows, dtype=np.int64), stream


def dense_by_segment(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: np.ndarray, scale: float
) -> torch.Tensor:
    """float64 from the definition, a segment at a time with every head at once: query j of a
    segment sees the prefix and its own keys up to k_len - q_len + j."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for q_start, q_len, k_start, k_len, p_start, p_len in table.tolist():
        if not q_len:
            continue
        keys = list(range(p_start, p_start + p_len)) + list(range(k_start, k_start + k_len))
        kk = k[keys].double().repeat_interleave(group, dim=1)  # [n, Hq, D]
        vv = v[keys].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[q_start : q_start + q_len].double(), kk) * scale
        seen = torch.arange(len(keys))[None, :] < (p_len + k_len - q_len + 1 + torch.arange(q_len))[:, None]
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        out[q_start : q_start + q_len] = torch.einsum("hqk,khd->qhd", weights, vv)
    return out


POINTER_LOADS = AttentionTiling(block_m=32, block_n=32, heads=2)
MODEL_SHAPES = [
    # (query heads, key/value heads, head dim, dtype, tiling): no GQA, Qwen3-0.6B's 16/8 x 128,
    # Qwen2-0.5B's 14/2 x 64, ratios 4 and 8, 16 query heads on one key/value head, Gemma's head
    # dimension 256; the shipped tiling (TMA loads) and pointer loads.
    (4, 4, 64, torch.float32, DEFAULT_TILING),
    (16, 8, 128, torch.bfloat16, DEFAULT_TILING),
    (14, 2, 64, torch.bfloat16, POINTER_LOADS),
    (8, 2, 64, torch.float16, DEFAULT_TILING),
    (8, 1, 32, torch.float32, POINTER_LOADS),
    (16, 1, 16, torch.bfloat16, DEFAULT_TILING),
    (4, 2, 256, torch.float32, POINTER_LOADS),
    (2, 1, 256, torch.bfloat16, DEFAULT_TILING),
]


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads, dim, dtype, tiling", MODEL_SHAPES)
def test_kernel_on_model_shapes_against_float64(
    heads: int, kv_heads: int, dim: int, dtype: torch.dtype, tiling: AttentionTiling
) -> None:
    """The kernel at the head counts, head dimensions and dtypes of real models, against softmax over
    the visible keys in float64. bfloat16 included: Triton's CPU interpreter multiplies bfloat16 bit
    patterns in tl.dot, which the kernel must work around there rather than return numbers off by
    orders of magnitude."""
    table, rows = model_shaped_layout()
    torch.manual_seed(heads * dim)
    q = torch.randn(rows, heads, dim).to(dtype)
    k = torch.randn(rows, kv_heads, dim).to(dtype)
    v = torch.randn(rows, kv_heads, dim).to(dtype)
    scale = dim**-0.5
    got = segment_attention(q, k, v, Segments.build(table, torch.device("cpu"), tiling), scale, impl="triton")
    assert got.dtype == dtype
    want = dense_by_segment(q, k, v, table, scale)
    queries = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in table[:, :2]]))
    # The inputs are exact in every dtype; the output is rounded once to it (bf16: 8 bits).
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got[queries].double(), want[queries], atol=tol, rtol=tol)


@pytest.mark.parametrize("field", range(6))
def test_rejects_negative_table_entries(field: int) -> None:
    """A negative start or length: the reference would take Python's wrap-around slice of q or k and
    the kernel read before the tensor, both without a word."""
    table = np.asarray([[0, 2, 0, 2, 0, 0], [2, 1, 2, 3, 0, 2]])
    table[1, field] = -1
    name = ("q_start", "q_len", "k_start", "k_len", "prefix_start", "prefix_len")[field]
    with pytest.raises(ValueError, match=f"segment 1 has a negative {name} .-1."):
        Segments.build(table, torch.device("cpu"))
