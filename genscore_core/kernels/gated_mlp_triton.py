"""Triton kernel of the gated MLP's first half; ``gated_mlp.py`` holds the torch reference.

``act = silu(x @ Wg^T + bg) * (x @ Wu^T + bu)`` in one kernel: a program computes one [BM, BN] tile of
both products, two float32 accumulators fed by the same tile of ``x``, and stores only ``act``. The
gate and up products never go to memory, and the separate silu*mul pass (which read them back) is
gone. The gate and up weights are the model's own ``nn.Linear`` weights [N, K], read in place.

On Hopper the tiles come in through TMA descriptors (the tensor copy engine; rows and columns past
the tensor read as zero) and ``tl.dot`` becomes wgmma. Where a descriptor cannot be made (a row stride
that is not a multiple of 16 bytes, as in the tests' odd shapes), the same kernel loads through masked
pointers.

The tiling is fixed per size class (:data:`CONFIGS`), chosen by a sweep on one H200
(the persistent, flattened, warp-specialised and TMA-store variants it dropped:
docs/benchmarks.md, "Gate/up GEMM with silu*mul"): nothing is tuned at
run time, so the kernel is captured in CUDA graphs for any token count.

This module imports triton at the top; ``gated_mlp.py`` imports it only when it is needed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclass(frozen=True)
class GatedMlpConfig:
    """One tiling of the kernel."""

    block_m: int
    block_n: int
    """Columns of each product per tile (a program holds two accumulators of [block_m, block_n])."""
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    """Row tiles visited together, so a column strip of the weights stays in L2 across them."""

    def name(self) -> str:
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k}/w{self.num_warps}/s{self.num_stages}"
            f"/g{self.group_m}"
        )


SMALL_M = 16384
"""Token counts below this take :data:`CONFIGS`' ``"small"`` tiling, the others ``"large"``."""

CONFIGS: dict[str, GatedMlpConfig] = {
    # The fastest of the H200 sweep at 4,096-7,424 tokens (W4-like) and at 16k-64k (W1's batches).
    "small": GatedMlpConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    "large": GatedMlpConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
}


def config_for(m: int) -> GatedMlpConfig:
    """The tiling for ``m`` rows (token counts vary per batch; no tuning at run time)."""
    return CONFIGS["small" if m < SMALL_M else "large"]


@triton.jit
def _gated_mlp_kernel(  # type: ignore[no-untyped-def]  # triton reads annotations as arg types
    x_src,  # [M, K]: a pointer, or a descriptor with [BM, BK] tiles when TMA
    g_src,  # [N, K]: a pointer, or a descriptor with [BN, BK] tiles when TMA
    u_src,  # [N, K]: same as g_src
    g_bias_ptr,  # [N] (unused unless HAS_GATE_BIAS)
    u_bias_ptr,  # [N] (unused unless HAS_UP_BIAS)
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_gn,
    stride_un,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA: tl.constexpr,
    HAS_GATE_BIAS: tl.constexpr,
    HAS_UP_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    FP64: tl.constexpr,  # float64 inputs (tests) accumulate in float64, all others in float32
    FP32_DOT: tl.constexpr,  # bfloat16 in the CPU interpreter: dots on float32 copies of the tiles
):
    # GROUP_M row tiles are visited column tile by column tile, so a strip of the weights is read
    # from memory once for all of them and from L2 after.
    tile = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    off_m = (first_m + (tile % in_group) % size_m) * BM
    off_n = ((tile % in_group) // size_m) * BN

    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rows = (off_m + rm).to(tl.int64)
    cols = off_n + rn
    acc_g = tl.zeros([BM, BN], dtype=tl.float64 if FP64 else tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float64 if FP64 else tl.float32)
    for k in range(0, K, BK):
        if TMA:
            a = x_src.load([off_m, k])
            bg = g_src.load([off_n, k])
            bu = u_src.load([off_n, k])
        else:
            inside_k = (k + rk) < K
            a = tl.load(
                x_src + rows[:, None] * stride_xm + (k + rk)[None, :],
                mask=(rows < M)[:, None] & inside_k[None, :],
                other=0.0,
            )
            w_rows = cols.to(tl.int64)[:, None]
            w_mask = (cols < N)[:, None] & inside_k[None, :]
            bg = tl.load(g_src + w_rows * stride_gn + (k + rk)[None, :], mask=w_mask, other=0.0)
            bu = tl.load(u_src + w_rows * stride_un + (k + rk)[None, :], mask=w_mask, other=0.0)
        if FP32_DOT:
            a = a.to(tl.float32)
            bg = bg.to(tl.float32)
            bu = bu.to(tl.float32)
        # The one tile of x feeds both products.
        acc_g = tl.dot(a, tl.trans(bg), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, tl.trans(bu), acc_u, input_precision=PRECISION)
    if HAS_GATE_BIAS:
        acc_g += tl.load(g_bias_ptr + cols, mask=cols < N, other=0.0).to(acc_g.dtype)[None, :]
    if HAS_UP_BIAS:
        acc_u += tl.load(u_bias_ptr + cols, mask=cols < N, other=0.0).to(acc_u.dtype)[None, :]
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        act.to(out_ptr.dtype.element_ty),
        mask=(rows < M)[:, None] & (cols < N)[None, :],
    )


def gated_mlp(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    config: GatedMlpConfig | None = None,
) -> torch.Tensor:
    """``silu(x @ gate_weight.T + gate_bias) * (x @ up_weight.T + up_bias)``: [M, N] in x's dtype."""
    m, k = x.shape
    n = gate_weight.shape[0]
    assert x.stride(1) == 1 and gate_weight.stride(1) == 1 and up_weight.stride(1) == 1
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:  # both products are their biases
        zeros = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        g = zeros if gate_bias is None else zeros + gate_bias.float()
        u = zeros if up_bias is None else zeros + up_bias.float()
        return out.copy_(torch.nn.functional.silu(g) * u)
    cfg = config if config is not None else config_for(m)
    tma = _has_tma(x.device) and all(_tma_ready(t) for t in (x, gate_weight, up_weight))
    srcs: tuple[object, object, object] = (x, gate_weight, up_weight)
    if tma:
        srcs = (
            TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(gate_weight, [cfg.block_n, cfg.block_k]),
            TensorDescriptor.from_tensor(up_weight, [cfg.block_n, cfg.block_k]),
        )
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    # The CPU interpreter multiplies bfloat16 bit patterns in tl.dot (it stores bfloat16 as uint16;
    # triton-lang/triton#11584): there the tiles are upcast first, which is exact.
    fp32_dot = x.dtype == torch.bfloat16 and not x.is_cuda
    _gated_mlp_kernel[grid](
        *srcs,
        gate_bias if gate_bias is not None else out,
        up_bias if up_bias is not None else out,
        out,
        m,
        n,
        k,
        x.stride(0),
        gate_weight.stride(0),
        up_weight.stride(0),
        out.stride(0),
        BM=cfg.block_m,
        BN=cfg.block_n,
        BK=cfg.block_k,
        GROUP_M=cfg.group_m,
        TMA=tma,
        HAS_GATE_BIAS=gate_bias is not None,
        HAS_UP_BIAS=up_bias is not None,
        PRECISION="ieee" if x.dtype in (torch.float32, torch.float64) or fp32_dot else "tf32",
        FP64=x.dtype == torch.float64,
        FP32_DOT=fp32_dot,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can cover ``t``: 16-byte aligned start and row stride (not float64,
    which the tests run through the pointer loads)."""
    return t.dtype != torch.float64 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


@functools.lru_cache(maxsize=8)
def _has_tma(device: torch.device) -> bool:
    if device.type != "cuda":
        return True  # the interpreter
    return torch.cuda.get_device_capability(device)[0] >= 9
