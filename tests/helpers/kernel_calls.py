"""Each kernel called through its public entry point on small CPU inputs, by name: what the dispatch
tests run with every ``impl``, in the test process and in one without triton."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from genscore_core.kernels import (
    Segments,
    add_rmsnorm,
    label_logprobs,
    rope,
    segment_attention,
    silu_mul,
)


def _label_logprobs(impl: Any) -> torch.Tensor:
    h, w = torch.randn(3, 16), torch.randn(40, 16)
    return label_logprobs(h, w, torch.tensor([[1, 2]] * 3), impl=impl).logprobs


def _segment_attention(impl: Any, dim: int = 16) -> torch.Tensor:
    q, k, v = torch.randn(9, 4, dim), torch.randn(9, 2, dim), torch.randn(9, 2, dim)
    segments = Segments.build(np.asarray([[0, 4, 0, 4, 0, 0], [4, 5, 4, 5, 0, 4]]), torch.device("cpu"))
    return segment_attention(q, k, v, segments, dim**-0.5, impl=impl)


def _add_rmsnorm(impl: Any) -> torch.Tensor:
    return add_rmsnorm(
        torch.randn(3, 24), torch.randn(3, 24), torch.randn(24), 1e-6, torch.float32, impl=impl
    )


def _rope(impl: Any, dim: int = 16) -> torch.Tensor:
    x = torch.randn(3, 2, dim)
    out = torch.empty_like(x)
    rope(x, 2, None, 1e-6, torch.randn(8, dim), torch.randn(8, dim), torch.tensor([0, 3, 7]), out, impl=impl)
    return out


def _silu_mul(impl: Any) -> torch.Tensor:
    return silu_mul(torch.randn(3, 10), torch.randn(3, 10), impl=impl)


KERNELS: dict[str, Callable[[Any], torch.Tensor]] = {
    "label_logprobs": _label_logprobs,
    "segment_attention": _segment_attention,
    "add_rmsnorm": _add_rmsnorm,
    "rope": _rope,
    "silu_mul": _silu_mul,
}
