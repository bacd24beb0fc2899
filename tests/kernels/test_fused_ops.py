"""The packed decoder's fused operations: each Triton kernel (through the CPU interpreter, conftest.py)
against its torch version, and the torch versions against float64 formulas written out here.

Awkward shapes on purpose: a hidden size that is not a power of two, three heads, rows with a stride.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genscore_core.kernels import add_rmsnorm, rope, silu_mul

pytest.importorskip("triton")

T, H, HEADS, D = 7, 48, 3, 16
CASES = [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)]


def rmsnorm64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rope64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    x = x.double()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[positions].double()[:, None] + rotated * sin[positions].double()[:, None]


@pytest.mark.parametrize("dtype, tol", CASES)
def test_add_rmsnorm(dtype: torch.dtype, tol: float) -> None:
    r = torch.randn(T, H)
    delta = torch.randn(T, H).to(dtype)
    w = torch.randn(H).to(dtype)
    r1, r2 = r.clone(), r.clone()
    a = add_rmsnorm(r1, delta, w, 1e-6, dtype, impl="torch")
    b = add_rmsnorm(r2, delta, w, 1e-6, dtype, impl="triton")
    torch.testing.assert_close(r1.double(), r.double() + delta.double())  # the residual, updated in place
    torch.testing.assert_close(a.double(), rmsnorm64(r1, w, 1e-6), atol=tol * 4, rtol=tol)
    torch.testing.assert_close(b.float(), a.float(), atol=tol * 4, rtol=tol)
    torch.testing.assert_close(r2, r1)
    # Normalising only (no delta), into float32 as the final norm does.
    a = add_rmsnorm(r1, None, w, 1e-6, torch.float32, impl="torch")
    torch.testing.assert_close(add_rmsnorm(r2, None, w, 1e-6, torch.float32, impl="triton"), a)
    # A bf16 residual: both add in float32, store the sum rounded.
    r1, r2 = r.bfloat16(), r.bfloat16()
    a = add_rmsnorm(r1, delta, w, 1e-6, dtype, impl="torch")
    b = add_rmsnorm(r2, delta, w, 1e-6, dtype, impl="triton")
    torch.testing.assert_close(b.float(), a.float(), atol=tol * 4, rtol=tol)
    torch.testing.assert_close(r2, r1)


@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("dtype, tol", CASES)
def test_rope(dtype: torch.dtype, tol: float, with_norm: bool) -> None:
    x = torch.randn(T, 2 * HEADS * D)[:, : HEADS * D].to(dtype)  # rows with a stride, as a slice
    cos, sin = torch.randn(40, D), torch.randn(40, D)
    pos = torch.randint(0, 40, (T,))
    norm = torch.randn(D).to(dtype) if with_norm else None
    o1 = torch.full((T, HEADS, D), float("nan"), dtype=dtype)
    o2 = torch.full((T, HEADS, D), float("nan"), dtype=dtype)
    rope(x, HEADS, norm, 1e-6, cos, sin, pos, o1, impl="torch")
    rope(x, HEADS, norm, 1e-6, cos, sin, pos, o2, impl="triton")
    heads = x.reshape(T, HEADS, D)
    expected = rope64(rmsnorm64(heads, norm, 1e-6) if norm is not None else heads, cos, sin, pos)
    torch.testing.assert_close(o1.double(), expected, atol=tol * 8, rtol=tol)
    torch.testing.assert_close(o2.float(), o1.float(), atol=tol * 8, rtol=tol)
    inplace = x.contiguous().view(T, HEADS, D)  # out aliasing x, as the decoder calls it
    rope(inplace, HEADS, norm, 1e-6, cos, sin, pos, inplace, impl="triton")
    torch.testing.assert_close(inplace, o2)


@pytest.mark.parametrize("dtype, tol", CASES)
def test_silu_mul(dtype: torch.dtype, tol: float) -> None:
    g, u = torch.randn(T, 100).to(dtype), torch.randn(T, 100).to(dtype)
    a = silu_mul(g, u, impl="torch")
    torch.testing.assert_close(a.double(), F.silu(g.double()) * u.double(), atol=tol * 4, rtol=tol)
    torch.testing.assert_close(silu_mul(g, u, impl="triton").float(), a.float(), atol=tol * 4, rtol=tol)


@pytest.mark.parametrize("n", [100, 37, 1])
@pytest.mark.parametrize("dtype, tol", CASES)
def test_silu_mul_reads_the_halves_of_one_gate_up_product(dtype: torch.dtype, tol: float, n: int) -> None:
    """The decoder's fused gate/up GEMM writes [T, 2N]; silu*mul reads both halves in place (row
    stride 2N, up starting mid-row), also at widths that are no multiple of the column block."""
    rows = 2049 if n == 1 else 11  # n = 1: one column, more rows than one program's block
    gate_up = torch.randn(rows, 2 * n).to(dtype)
    g, u = gate_up[:, :n], gate_up[:, n:]
    assert g.stride(0) == 2 * n and not u.is_contiguous()
    want = F.silu(g.double()) * u.double()
    a = silu_mul(g, u, impl="torch")
    b = silu_mul(g, u, impl="triton")
    assert b.is_contiguous() and b.shape == (rows, n)
    torch.testing.assert_close(a.double(), want, atol=tol * 4, rtol=tol)
    torch.testing.assert_close(b.float(), a.float(), atol=tol * 4, rtol=tol)
    # 3-D contiguous input: rows of the last dimension.
    g3, u3 = torch.randn(2, 5, n).to(dtype), torch.randn(2, 5, n).to(dtype)
    torch.testing.assert_close(
        silu_mul(g3, u3, impl="triton").float(),
        silu_mul(g3, u3, impl="torch").float(),
        atol=tol * 4,
        rtol=tol,
    )


@pytest.mark.parametrize("with_norm", [True, False])
def test_rope_in_place_on_column_blocks_of_one_qkv_product(with_norm: bool) -> None:
    """q and k as column blocks of one [T, q | k | v] buffer (row stride q + k + v): the kernel rotates
    each block in place and leaves the other columns as they were."""
    q_heads, kv_heads = 3, 2
    width = (q_heads + 2 * kv_heads) * D
    qkv = torch.randn(T, width)
    before = qkv.clone()
    cos, sin = torch.randn(40, D), torch.randn(40, D)
    pos = torch.randint(0, 40, (T,))
    q_norm = torch.randn(D) if with_norm else None
    k_norm = torch.randn(D) if with_norm else None
    q = qkv[:, : q_heads * D].view(T, q_heads, D)
    k = qkv[:, q_heads * D : (q_heads + kv_heads) * D].view(T, kv_heads, D)
    rope(q, q_heads, q_norm, 1e-6, cos, sin, pos, q, impl="triton")
    rope(k, kv_heads, k_norm, 1e-6, cos, sin, pos, k, impl="triton")
    for block, heads, norm, start in ((q, q_heads, q_norm, 0), (k, kv_heads, k_norm, q_heads * D)):
        x = before[:, start : start + heads * D].reshape(T, heads, D)
        want = rope64(rmsnorm64(x, norm, 1e-6) if norm is not None else x, cos, sin, pos)
        torch.testing.assert_close(block.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(qkv[:, (q_heads + kv_heads) * D :], before[:, (q_heads + kv_heads) * D :])


def _rope_call(impl: str, *, heads: int = 3, width: int = D, norm: int | None = D, rows: int = T) -> None:
    x = torch.randn(T, heads * D)
    out = torch.empty(T, heads, D)
    weight = torch.randn(norm) if norm is not None else None
    rope(x, HEADS, weight, 1e-6, torch.randn(40, width), torch.randn(40, width),
         torch.randint(0, 40, (rows,)), out, impl=impl)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_mismatched_shapes_are_refused(impl: str) -> None:
    """Each path refuses, naming the tensor, what the Triton kernels would otherwise read past (a
    short norm weight, a delta of other rows, a narrow rotary table, a gate and up of other shapes):
    the torch versions failed with broadcasting errors or broadcast, the kernels returned numbers."""
    r = torch.randn(T, H)
    with pytest.raises(ValueError, match=rf"weight \[{H - 8}\] does not match the residual \[{T}, {H}\]"):
        add_rmsnorm(r, torch.randn(T, H), torch.randn(H - 8), 1e-6, torch.float32, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"delta \[{T - 1}, {H}\] does not match the residual \[{T}, {H}\]"):
        add_rmsnorm(r, torch.randn(T - 1, H), torch.randn(H), 1e-6, torch.float32, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"cos and sin \[40, 8\], \[40, 8\] .* head dimension {D}"):
        _rope_call(impl, width=8)
    with pytest.raises(ValueError, match=rf"norm_weight \[8\] .* head dimension {D}"):
        _rope_call(impl, norm=8)
    with pytest.raises(ValueError, match=rf"x \[{T}, {2 * D}\] .* {HEADS} heads of {D}"):
        _rope_call(impl, heads=2)
    with pytest.raises(ValueError, match=rf"positions \[{T - 2}\] .* {T} rows"):
        _rope_call(impl, rows=T - 2)
    with pytest.raises(ValueError, match=r"gate \[3, 10\] and up \[1, 10\]"):
        silu_mul(torch.randn(3, 10), torch.randn(1, 10), impl=impl)  # type: ignore[arg-type]


def test_a_residual_with_a_row_stride() -> None:
    """The residual is updated in place, so the kernel cannot take a copy of it: an explicit Triton
    request for a strided residual is refused, saying why; the torch version updates it in place."""
    from genscore_core.errors import KernelUnavailableError

    wide = torch.randn(T, 2 * H)
    before = wide.clone()
    delta, w = torch.randn(T, H), torch.randn(H)
    with pytest.raises(KernelUnavailableError, match="add_rmsnorm: the residual's rows are not contiguous"):
        add_rmsnorm(wide[:, :H], delta, w, 1e-6, torch.float32, impl="triton")
    torch.testing.assert_close(wide, before)
    out = add_rmsnorm(wide[:, :H], delta, w, 1e-6, torch.float32, impl="auto")
    torch.testing.assert_close(wide[:, :H], before[:, :H] + delta)
    torch.testing.assert_close(out.double(), rmsnorm64(before[:, :H] + delta, w, 1e-6), atol=1e-5, rtol=1e-5)
