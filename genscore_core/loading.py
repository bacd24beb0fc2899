"""Loading a causal LM and its tokenizer through transformers, with device and dtype chosen sensibly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``"auto"``: the first CUDA GPU if there is one, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {device!r}: {error}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but CUDA is not available on this machine")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None`` or ``"auto"``: bfloat16 on CUDA, float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)} or 'auto'") from None


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{name_or_path!r} has no fast (Rust) tokenizer; genscore needs one for character offsets, "
            "which template truncation relies on"
        )
    return tokenizer


def load_causal_lm(
    name_or_path: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    show_progress: bool = True,
) -> Any:
    from transformers import AutoModelForCausalLM

    with transformers_progress_bars(show_progress):
        model: Any = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code
        )
    return model.to(device).eval()


@contextlib.contextmanager
def transformers_progress_bars(enabled: bool) -> Iterator[None]:
    """Turn transformers' loading and saving bars off for a block (it is a process-wide switch)."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    if not enabled:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def model_max_length(model: Any, tokenizer: Any) -> int:
    """The longest prompt the model supports: its position table, else the tokenizer's limit."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and limit > 0:
        return limit
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    # Tokenizers without a limit report a huge sentinel (1e30).
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 10**9:
        return tokenizer_limit
    raise ValueError("cannot tell the model's maximum length; pass max_length explicitly")
