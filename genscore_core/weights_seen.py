"""Whether a loaded model still holds the tensors an engine's forward and head were built from.

The packed decoder fuses each layer's q/k/v and gate/up weights into one tensor each and re-points
the model's parameters to views of them; the label head keeps a detached alias of the LM head's
weight; the forwards note the model's device. All of that is derived from the tensors the model held
at build. ``model.to(...)``, ``.half()``, ``.cuda()`` and ``load_state_dict(..., assign=True)`` give
the model new tensors (or new parameter objects), after which the derived state would score with the
old weights, or fail with a device or dtype mismatch far from the cause. The engine checks, at the
start of each call, whether the model still holds the tensors noted here, and builds its parts again
when it does not (:meth:`~genscore_core.engine.ScoringEngine.follow_model`).

A plain ``load_state_dict`` (the default, ``assign=False``) copies the new values into the existing
tensors, fused views included: nothing goes stale and nothing is rebuilt.

The check looks at a few parameters only, so that it costs the same whatever the depth of the model
(a few microseconds; docs/benchmarks.md, "Following a moved model"):
operations on the whole model change all of them. A change to some inner layers alone (a submodule
cast or given new parameters on its own) is not seen: build the scorer again after such a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class _Watched:
    path: tuple[str, ...]
    """Names of the modules from the model down to the parameter's owner."""
    name: str
    parameter: torch.Tensor
    """The parameter object the owner held."""
    data_ptr: int
    """Where its tensor lay."""
    alias: torch.Tensor
    """That tensor (detached, no copy): while it is alive, no new tensor can be given its address, so
    an equal pointer means the very same tensor."""


class WeightsSeen:
    """The tensors a few of ``model``'s parameters hold now, to tell later whether they changed.

    Watched: the input and output embedding weights, the first and last parameters of the model, and
    the first parameter of the first and last decoder layers (for Qwen3, Qwen2 and Llama those are
    q_proj's weights, the first views of the packed decoder's fused tensors).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        names = {id(p): n for n, p in model.named_parameters()}
        picked: list[str] = []

        def pick(parameter: Any) -> None:
            name = names.get(id(parameter))
            if name is not None and name not in picked:
                picked.append(name)

        for getter in ("get_input_embeddings", "get_output_embeddings"):
            try:
                pick(getattr(getattr(model, getter)(), "weight", None))
            except (AttributeError, NotImplementedError):
                pass  # a model without that accessor: the other watched parameters stand in
        if names:
            ordered = list(names.values())
            picked.extend(n for n in (ordered[0], ordered[-1]) if n not in picked)
        decoder = getattr(model, getattr(model, "base_model_prefix", ""), None)
        layers = getattr(decoder, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            for layer in (layers[0], layers[-1]):
                pick(next(iter(layer.parameters()), None))
        watched = []
        for full in picked:
            *path, name = full.split(".")
            parameter = model.get_parameter(full)
            watched.append(_Watched(tuple(path), name, parameter, parameter.data_ptr(), parameter.detach()))
        self._watched = tuple(watched)

    def current(self) -> bool:
        """Whether every watched parameter is still the same object over the same tensor.

        Dictionary lookups and one data pointer a parameter: no walk over the model."""
        for watched in self._watched:
            module = self.model
            for key in watched.path:
                module = module._modules.get(key)
                if module is None:
                    return False
            parameter = module._parameters.get(watched.name)
            if parameter is not watched.parameter or parameter.data_ptr() != watched.data_ptr:
                return False
        return True
