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
    # A bf16 residual (a benchmark step): both add in float32 and store the sum rounded.
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
