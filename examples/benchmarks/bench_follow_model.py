"""What following the model costs a call, and what ``save_pretrained`` copies once a scorer was built.

    PYTHONPATH=. python examples/benchmarks/bench_follow_model.py [--layers N]

CPU only; a random Qwen3 of the Qwen3-Reranker-0.6B layout (28 layers) with a small vocabulary:

* the engine's check at the start of each call (``WeightsSeen.current``: is every watched parameter
  still the same object over the same tensor?), timed with ``timeit``; beside it, the same check over
  every parameter of the model (what a complete check per call would cost), and ``follow_model()``
  (the check under the engine's lock, what a call pays);
* ``save_pretrained`` of the same layout in bf16 (``--layers`` of them, default 4), before and after a
  scorer was built: the bytes of every tensor copy made while it writes (``aten.clone`` and
  ``aten._to_copy`` outputs, counted by a dispatch mode), per layer and for 28 layers.

The check does not depend on the tensors' sizes (it reads pointers), so hidden sizes are kept small for
the first part. Prints a table; writes ``$OUT/bench_follow_model.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import timeit
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from genscore_core.config import ScorerConfig
from genscore_core.engine import ScoringEngine

LAYERS_0_6B = 28


def _model(layers: int, *, small: bool, dtype: torch.dtype) -> Any:
    if small:
        shape = dict(
            hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16
        )
    else:  # the 0.6B's layer shape
        shape = dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
        )
    config = Qwen3Config(vocab_size=1024, num_hidden_layers=layers, tie_word_embeddings=True, **shape)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    # Values do not matter here: uninitialised memory, no random init of ~440M parameters.
    return model.to_empty(device="cpu").to(dtype).eval()


def _per_call(seconds: float) -> float:
    return seconds * 1e6


def check_costs(number: int) -> dict[str, float]:
    model = _model(LAYERS_0_6B, small=True, dtype=torch.float32)
    engine = ScoringEngine.for_model(model, ScorerConfig(), pad_token_id=0)
    seen = engine._seen
    every = _every_parameter(model)
    assert seen.current() and every() and not engine.follow_model()
    return {
        "watched parameters": float(len(seen._watched)),
        "parameters in the model": float(len(list(model.parameters()))),
        "check, us": _per_call(timeit.timeit(seen.current, number=number) / number),
        "follow_model() (check + lock), us": _per_call(
            timeit.timeit(engine.follow_model, number=number) / number
        ),
        "check of every parameter, us": _per_call(timeit.timeit(every, number=number // 10) / (number // 10)),
    }


def _every_parameter(model: Any) -> Any:
    """The same check as WeightsSeen.current, over every parameter of ``model``."""
    watched = []
    for name, parameter in model.named_parameters():
        *path, leaf = name.split(".")
        watched.append((tuple(path), leaf, parameter, parameter.data_ptr()))

    def current() -> bool:
        for path, leaf, parameter, pointer in watched:
            module = model
            for key in path:
                module = module._modules.get(key)
                if module is None:
                    return False
            now = module._parameters.get(leaf)
            if now is not parameter or now.data_ptr() != pointer:
                return False
        return True

    return current


class _Copies(TorchDispatchMode):
    """Counts the bytes of tensor copies made under it."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default):
            self.bytes += out.numel() * out.element_size()
        return out


def save_copies(layers: int) -> dict[str, float]:
    results: dict[str, float] = {}
    model = _model(layers, small=False, dtype=torch.bfloat16)
    for label in ("before a scorer was built", "after a scorer was built"):
        if label.startswith("after"):
            ScoringEngine.for_model(model, ScorerConfig(), pad_token_id=0)
        with tempfile.TemporaryDirectory() as folder, _Copies() as copies:
            model.save_pretrained(folder)
        results[f"save_pretrained copies {label}, MiB per layer"] = copies.bytes / layers / 2**20
        results[f"save_pretrained copies {label}, GiB for 28 layers"] = copies.bytes / layers * 28 / 2**30
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="layers of the 0.6B shape saved")
    parser.add_argument("--number", type=int, default=20000, help="timed checks")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}")
    results = {**check_costs(args.number), **save_copies(args.layers)}
    print(f"{'measure':<62} {'value':>10}")
    for name, value in results.items():
        print(f"{name:<62} {value:>10.2f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_follow_model.json"), "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
