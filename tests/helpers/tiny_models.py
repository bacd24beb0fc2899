"""The sizes of the tests' tiny random models, so that each test states only what it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genscore_core.testing.tiny_model import QWEN3_VOCAB_SIZE


def tiny_sizes(
    *,
    vocab_size: int = QWEN3_VOCAB_SIZE,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> dict[str, Any]:
    """Config fields of a tiny decoder (the Qwen3 vocabulary by default): an MLP twice as wide as the
    hidden size, and grouped-query attention."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
    }


def special_ids(tokenizer: Any, *names: str) -> dict[str, Any]:
    """``pad_token_id=...`` and the like, as the tokenizer has them: ``special_ids(t, "pad", "bos")``."""
    return {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in names}


def linked_model(source: Path, out: Path) -> Path:
    """A folder at ``out`` holding links to the files of the model folder ``source`` (its README
    left out), so that a test can give the tests' shared tiny model the name of a family without
    writing its weights again."""
    out.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file() and file.name != "README.md":
            (out / file.name).symlink_to(file.resolve())
    return out
