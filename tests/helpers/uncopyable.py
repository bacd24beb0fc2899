"""Metadata values that ``copy.deepcopy`` refuses, for the adapters' tests that results share
their inputs' metadata values rather than copy them."""

from __future__ import annotations

from typing import Any


def uncopyable_values() -> tuple[Any, dict[str, Any]]:
    """A tensor that is not a graph leaf (deepcopy raises RuntimeError) and a tree of nested dicts
    deeper than deepcopy recurses (RecursionError)."""
    import torch

    not_a_leaf = torch.ones(3, requires_grad=True) * 2
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(5000):
        level["next"] = {}
        level = level["next"]
    return not_a_leaf, deep
