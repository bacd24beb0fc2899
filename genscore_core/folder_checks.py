"""Broken or hostile files of a model folder, named on one line with the folder and the file.

transformers' own errors for these named neither: a weight of the wrong shape gave ``RuntimeError:
... look at the above report!`` (the report went to the log), a ``pad_token_id`` past the vocabulary an
``AssertionError`` from torch's embedding, a pickle that torch's safe loader refuses a 44-line
traceback advising ``weights_only=False`` (which would run the code the pickle names). Each is a
:class:`~genscore_core.errors.ModelFolderError` here; nothing the folder ships is run to find it out.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from genscore_core.errors import ModelFolderError

_SPECIAL_IDS = ("pad_token_id",)


def _vocab_size(config: Any) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_special_token_ids(config: Any, model: str) -> None:
    """Refuse, before the model is built, a ``pad_token_id`` that is not a row of the embedding
    (torch asserts ``Padding_idx must be within num_embeddings``; negative ids count from the end, as
    torch takes them)."""
    vocab_size = _vocab_size(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in _SPECIAL_IDS:
        value = getattr(text, key, None)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if whole and (vocab_size is None or -vocab_size <= value < vocab_size):
            continue
        why = "not a whole number" if not whole else f"outside the vocabulary of {vocab_size} tokens"
        raise ModelFolderError(
            f"model {model!r}: config.json: {key} is {value!r}, {why}; set it to the id of the "
            "tokenizer's padding token (or null)",
            folder=model,
            file="config.json",
        )


def _weight_files(model: str, suffix: str) -> list[Path]:
    folder = Path(model)
    return sorted(folder.glob(f"*{suffix}")) if folder.is_dir() else []


def wrong_shapes_error(model: str, config: Any, *, trust_remote_code: bool = False) -> ModelFolderError:
    """The error for a checkpoint whose tensors transformers found of another shape than ``config``
    gives: the first such tensor, its file and both shapes (read from the safetensors headers and a
    model built on the meta device, so no weight is loaded)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    expected = {key: list(tensor.shape) for key, tensor in built.state_dict().items()}
    files = _weight_files(model, ".safetensors")
    for file in files:
        with safe_open(str(file), "pt") as weights:
            for key in weights.keys():
                shape = list(weights.get_slice(key).get_shape())
                if key in expected and expected[key] != shape:
                    return ModelFolderError(
                        f"model {model!r}: {file.name}: the weight {key} has shape {shape}, but config.json "
                        f"gives {expected[key]} (weights of another model size, or a broken conversion)",
                        folder=model,
                        file=file.name,
                    )
    named = files[0].name if files else "the weights"
    return ModelFolderError(
        f"model {model!r}: {named}: weights of other shapes than config.json gives (weights of another "
        "model size, or a broken conversion)",
        folder=model,
        file=named,
    )


def refused_pickle_error(model: str, error: pickle.UnpicklingError) -> ModelFolderError:
    """The error for weights stored as a pickle that torch's safe loader (``weights_only=True``)
    refuses: genscore never loads one unsafely, since that runs whatever code the pickle names."""
    files = _weight_files(model, ".bin") + _weight_files(model, ".pt") + _weight_files(model, ".pth")
    named = files[0].name if files else "the weights"
    lines = [line.strip() for line in str(error).splitlines() if "global" in line.lower()]
    reason = f" ({lines[0].rstrip('.')})" if lines else ""
    return ModelFolderError(
        f"model {model!r}: {named}: the weights are a pickle that torch's safe loader refuses{reason}; "
        "loading it anyway would run the code it names, which genscore never does: use the model's "
        ".safetensors weights, or convert these with a tool you trust",
        folder=model,
        file=named,
    )
