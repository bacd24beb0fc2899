"""The gate/up GEMM with silu*mul in its epilogue: the Triton kernel (through the CPU interpreter,
conftest.py) and the torch reference against a float64 formula written out here.

Awkward shapes on purpose: one row, rows that are not a multiple of the tile, odd N and K, biases,
rows with a stride; aligned shapes take the TMA descriptor loads (tiles reaching past the tensor read
zeros), odd K and float64 the masked pointer loads. The decoder with this kernel against the Hugging
Face forward is in test_packed_decoder_triton.py.
"""

from __future__ import annotations

import pytest
import torch

from genscore_core.errors import KernelUnavailableError
from genscore_core.kernels import gated_mlp
from genscore_core.kernels.gated_mlp import unsupported_reason

pytest.importorskip("triton")

from genscore_core.kernels import gated_mlp_triton
from genscore_core.kernels.gated_mlp_triton import GatedMlpConfig, _tma_ready

# (rows, N, K, biases): K = 7 rules out TMA (rows of 28 bytes); the others take it.
SHAPES = [(1, 5, 16, False), (7, 24, 32, True), (37, 40, 48, False), (19, 13, 7, True), (130, 33, 72, True)]
TILINGS = [GatedMlpConfig(16, 16, 16, 4, 1), GatedMlpConfig(32, 16, 32, 4, 2, group_m=2)]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def _inputs(m: int, n: int, k: int, bias: bool, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = torch.randn(m, k, dtype=dtype)
    # Scaled so that gate and up are of order 1, where silu is curved.
    wg, wu = torch.randn(n, k, dtype=dtype) / k**0.5, torch.randn(n, k, dtype=dtype) / k**0.5
    bg = torch.randn(n, dtype=dtype) if bias else None
    bu = torch.randn(n, dtype=dtype) if bias else None
    return x, wg, bg, wu, bu


def _expected(
    x: torch.Tensor, wg: torch.Tensor, bg: torch.Tensor | None, wu: torch.Tensor, bu: torch.Tensor | None
):  # type: ignore[no-untyped-def]
    """silu(g) * u in float64, silu written out: g / (1 + e^-g)."""
    g = x.double() @ wg.double().t() + (0 if bg is None else bg.double())
    u = x.double() @ wu.double().t() + (0 if bu is None else bu.double())
    return g / (1 + torch.exp(-g)) * u


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("m, n, k, bias", SHAPES)
def test_kernel_against_float64(m: int, n: int, k: int, bias: bool, dtype: torch.dtype) -> None:
    x, wg, bg, wu, bu = _inputs(m, n, k, bias, dtype)
    want = _expected(x, wg, bg, wu, bu)
    tol = TOLERANCE[dtype]
    for tiling in TILINGS:
        got = gated_mlp_triton.gated_mlp(x, wg, bg, wu, bu, tiling)
        assert got.dtype == dtype and got.shape == (m, n)
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    # The entry point: the torch reference and the kernel with its shipped tiling.
    torch.testing.assert_close(
        gated_mlp(x, (wg, bg), (wu, bu), impl="torch").double(), want, atol=tol, rtol=tol
    )
    torch.testing.assert_close(
        gated_mlp(x, (wg, bg), (wu, bu), impl="triton").double(), want, atol=tol, rtol=tol
    )


def test_both_load_paths_are_covered() -> None:
    """The shapes above reach both the TMA descriptor loads and the masked pointer loads."""
    assert _tma_ready(torch.randn(37, 48)) and not _tma_ready(torch.randn(19, 7))
    assert not _tma_ready(torch.randn(37, 48, dtype=torch.float64))


def test_rows_with_a_stride_and_no_rows() -> None:
    x, wg, _, wu, _ = _inputs(21, 24, 32, False, torch.float32)
    wide = torch.randn(21, 48)
    wide[:, :32] = x
    strided = wide[:, :32]  # row stride 48 elements: descriptors over a view
    got = gated_mlp(strided, (wg, None), (wu, None), impl="triton")
    torch.testing.assert_close(got.double(), _expected(x, wg, None, wu, None), atol=1e-5, rtol=1e-5)
    empty = gated_mlp(x[:0], (wg, None), (wu, None), impl="triton")
    assert empty.shape == (0, 24)


def test_unsupported_inputs() -> None:
    x, wg, bg, wu, bu = _inputs(4, 8, 16, True, torch.float32)
    assert unsupported_reason(x, (wg, bg), (wu, bu)) is None
    assert "dtype" in str(unsupported_reason(x, (wg.double(), bg), (wu, bu)))
    assert "[tokens, hidden]" in str(unsupported_reason(x[None], (wg, bg), (wu, bu)))
    assert "weights" in str(unsupported_reason(x, (wg[:4], bg), (wu, bu)))
    assert "bias" in str(unsupported_reason(x, (wg, bg[:3]), (wu, bu)))
    with pytest.raises(KernelUnavailableError, match="gated_mlp"):
        gated_mlp(x, (wg.double(), bg), (wu, bu), impl="triton")
    # "auto" on the CPU runs the torch reference without asking triton.
    torch.testing.assert_close(
        gated_mlp(x, (wg, bg), (wu, bu), impl="auto").double(),
        _expected(x, wg, bg, wu, bu),
        atol=1e-5,
        rtol=1e-5,
    )


def test_tilings_are_fixed_per_size_class() -> None:
    """No tuning at run time: every token count maps to one of the shipped tilings."""
    small, large = gated_mlp_triton.CONFIGS["small"], gated_mlp_triton.CONFIGS["large"]
    assert gated_mlp_triton.config_for(128) is small
    assert gated_mlp_triton.config_for(gated_mlp_triton.SMALL_M - 128) is small
    assert gated_mlp_triton.config_for(gated_mlp_triton.SMALL_M) is large
    assert gated_mlp_triton.config_for(65536) is large


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1, 200, 96), (3, 136, 64), (130, 257, 128)])
def test_shipped_tiling_in_model_dtypes(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """The shipped 128 x 128 x 64 tiling at intermediate sizes no multiple of it (one row, a row tile
    and two), in the dtypes models run in, against float64. bfloat16 included: Triton's CPU
    interpreter multiplies bfloat16 bit patterns in tl.dot, which the kernel must work around there
    rather than return numbers off by orders of magnitude."""
    x, wg, bg, wu, bu = (
        t.to(dtype) if t is not None else None for t in _inputs(m, n, k, True, torch.float32)
    )
    got = gated_mlp(x, (wg, bg), (wu, bu), impl="triton")
    assert got.dtype == dtype and got.shape == (m, n)
    # The inputs are exact in every dtype; float32 accumulation, one rounding to the output dtype.
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.double(), _expected(x, wg, bg, wu, bu), atol=tol, rtol=tol)
