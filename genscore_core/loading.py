"""Loading a causal LM and its tokenizer through transformers, with device and dtype chosen sensibly."""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from genscore_core.errors import ConfigurationError, ModelNotFoundError, NotARerankerError
from genscore_core.folder_checks import check_special_token_ids, refused_pickle_error, wrong_shapes_error
from genscore_core.forward import decoder_of
from genscore_core.gguf_files import GgufSource, check_gguf_header, gguf_failures, gguf_source
from genscore_core.seq_cls import is_decoder_seq_cls, last_token_classifier, seq_cls_architectures

logger = logging.getLogger(__name__)

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
    if resolved.type == "meta":
        # Loading would succeed and the first score fail far from here ("Tensor.item() cannot be
        # called on meta tensors"): a meta tensor has a shape but no values.
        raise ValueError(f"device {device!r} holds no values (shapes only); choose 'cpu', 'cuda' or 'auto'")
    try:
        # One empty tensor tells whether this build of torch and this machine have the device
        # ("mps" on Linux, "cuda:3" with one GPU), before a model is loaded onto it.
        torch.empty(0, device=resolved)
    except (RuntimeError, AssertionError) as error:
        # torch's own words run to a list of every dispatch key for some devices: keep the first line.
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise ValueError(f"device {device!r} cannot be used on this machine: {reason}") from error
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


MODEL_FOLDER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
"""Files of which a model folder holds at least one (``save_pretrained`` of a model or a tokenizer)."""


def check_model_source(name_or_path: str) -> None:
    """Refuse a ``model`` that can only mean a local folder (``./x``, ``/x``, ``~/x``, ``a/b/c``) when
    no such folder exists (transformers would otherwise report it as a malformed hub id), and a
    folder that holds no model or tokenizer files.

    Raises:
        ModelNotFoundError: Naming the path as given and as resolved.
    """
    path = Path(name_or_path).expanduser()
    if gguf_source(name_or_path) is not None:
        return  # a .gguf file, or a folder holding one (genscore_core.gguf_files)
    if path.is_dir():
        # A folder wins over the hub in transformers, so an empty or wrong one (a typo'd output folder,
        # a download that never finished) would fail deep in loading with a message that names neither
        # the folder nor what it lacks. A folder with only tokenizer files is fine: a scorer that
        # scores through a server loads nothing else.
        if not any((path / name).is_file() for name in MODEL_FOLDER_FILES):
            raise ModelNotFoundError(
                f"model {name_or_path!r}: the folder {path.resolve()} holds neither config.json nor "
                "tokenizer files; expected a model saved with save_pretrained",
                setting="model",
            )
        return
    if path.exists():
        raise ModelNotFoundError(
            f"model {name_or_path!r} is a file; expected a model folder, a hub id or a .gguf file",
            setting="model",
        )
    if name_or_path.startswith((".", "/", "~")) or "\\" in name_or_path or name_or_path.count("/") > 1:
        raise ModelNotFoundError(
            f"model {name_or_path!r}: no such folder ({path.resolve()})", setting="model"
        )


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
"""Files of which a folder holding a tokenizer has at least one (fast or slow, any family)."""


def check_tokenizer_files(name_or_path: str) -> None:
    """Refuse a local folder that holds a model but no tokenizer.

    transformers 5 then builds an empty tokenizer from config.json alone (one token), whose every
    text encodes to nothing: the label words would be reported as "0 tokens", and a template naming
    its labels by id would score the same empty prompt for every pair.

    Raises:
        ModelNotFoundError: Naming the folder and how to add the tokenizer.
    """
    path = Path(name_or_path).expanduser()
    if gguf_source(name_or_path) is not None:
        return  # a GGUF file holds its tokenizer
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"model {name_or_path!r}: the folder {path.resolve()} holds no tokenizer files "
            f"({', '.join(TOKENIZER_FILES[:2])}, ...), only the model's; save the tokenizer beside it "
            "(tokenizer.save_pretrained(folder)), or load both yourself and pass them to "
            "GenerativeScorer.from_model(model, tokenizer)",
            setting="model",
        )


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    check_model_source(name_or_path)
    check_tokenizer_files(name_or_path)
    check_hub_reachable(name_or_path)

    gguf = gguf_source(name_or_path)
    if gguf is not None:
        check_gguf_header(gguf)
        with gguf_failures(gguf, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(gguf.folder, gguf_file=gguf.file)
    else:
        with loading_failures(name_or_path, "tokenizer", trust_remote_code=trust_remote_code):
            tokenizer = AutoTokenizer.from_pretrained(
                name_or_path,
                trust_remote_code=trust_remote_code,
                local_files_only=from_cache_only(name_or_path),
            )
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{name_or_path!r} has no fast (Rust) tokenizer; genscore needs one for character offsets, "
            "which template truncation relies on"
        )
    return tokenizer


HUB_CHECK_TIMEOUT = 10.0
"""Seconds the one request of :func:`check_hub_reachable` may take (huggingface_hub's own default
for such a request)."""


_CACHE_ONLY: set[str] = set()
"""Hub ids whose hub did not answer when this process last loaded them, and which are loaded from the
local cache only (as with ``HF_HUB_OFFLINE=1``) until it answers again."""


_ASKED: set[str] = set()
"""Hub ids whose hub :func:`check_hub_reachable` asked in this process."""


def check_hub_reachable(name_or_path: str, *, required: bool = True) -> None:
    """Ask the hub once, without retrying, whether it answers, before a hub id is loaded.

    huggingface_hub retries every file it has no cached copy of five times, with backoff (23 s a
    file), and transformers asks for many optional ones (vocab.json, merges.txt,
    special_tokens_map.json, ...): without network, a hub id took 47 s of "Retrying in 8s" lines to
    end in an error that named no model, and a model fully in the cache took three minutes to load.
    So when the hub does not answer, a model in the cache is loaded from the cache only (a warning
    says so; :func:`from_cache_only`), and one that is not is refused at once. Nothing is checked
    for a local folder, or in offline mode (``HF_HUB_OFFLINE=1``: the cache only already).
    ``required=False`` is for optional files of a model already loaded (its model card, its
    sentence-transformers settings): without an answer they are read from the cache only, if there.

    Raises:
        ModelNotFoundError: The hub did not answer and the model is not in the cache (``required``);
            naming the model, the cache, the address tried and what went wrong.
    """
    if Path(name_or_path).expanduser().exists():
        return
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    if constants.HF_HUB_OFFLINE:
        return
    try:
        cached = [try_to_load_from_cache(name_or_path, f) for f in ("config.json", "tokenizer_config.json")]
    except HFValidationError:
        return  # not a valid hub id: transformers says so
    url = hf_hub_url(name_or_path, "config.json")
    _ASKED.add(name_or_path)
    try:
        get_hf_file_metadata(url, timeout=HUB_CHECK_TIMEOUT)
    except HfHubHTTPError:
        pass  # the hub answered (no such repository, gated, no such file): transformers says what
    except Exception as error:  # no answer at all: the HTTP client's own error types
        if not required:
            logger.warning(
                "the hub did not answer (%s: %s); reading the settings files of %s from the Hugging "
                "Face cache only", url, error, name_or_path,
            )  # fmt: skip
            _CACHE_ONLY.add(name_or_path)
            return
        if any(isinstance(path, str) for path in cached):
            logger.warning(
                "the hub did not answer (%s: %s); loading %s from the Hugging Face cache only",
                url, error, name_or_path,
            )  # fmt: skip
            _CACHE_ONLY.add(name_or_path)
            return
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not a local folder and not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and the hub did not answer ({url}: {type(error).__name__}: "
            f"{error}). Download it where the hub is reachable (or point HF_ENDPOINT at a mirror), or "
            "pass the path of a folder that holds it",
            setting="model",
        ) from error
    _CACHE_ONLY.discard(name_or_path)


def from_cache_only(name_or_path: str) -> bool:
    """Whether ``name_or_path`` is to be read from the local cache only (``local_files_only``): its hub
    did not answer :func:`check_hub_reachable`, and asking it for each file would retry each."""
    return name_or_path in _CACHE_ONLY


def optional_files_from_cache_only(name_or_path: str) -> bool:
    """:func:`from_cache_only` for the optional files of a hub id (a model card, settings), asking
    the hub first if this process has not: a model given to ``from_model`` was never loaded by
    name, so nothing asked its hub before these files were looked for."""
    if name_or_path not in _ASKED:
        check_hub_reachable(name_or_path, required=False)
    return from_cache_only(name_or_path)


def _unreadable_files(name_or_path: str) -> list[str]:
    """The JSON and safetensors files of a local folder that cannot be parsed (headers only)."""
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        return []
    broken = []
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            broken.append(path.name)
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception:  # SafetensorError, or whatever else a torn file raises
            broken.append(path.name)
    return broken


def shipped_code(name_or_path: str) -> list[str]:
    """The classes a model's config.json and tokenizer_config.json map to its own code (``auto_map``),
    as ``"AutoConfig -> configuration_x.XConfig"``; [] for a hub id not in the cache."""
    found: list[str] = []
    for file in ("config.json", "tokenizer_config.json"):
        path = Path(name_or_path).expanduser() / file
        if not path.is_file():
            from huggingface_hub import try_to_load_from_cache

            try:
                cached = try_to_load_from_cache(name_or_path, file)
            except ValueError:  # not a hub id either (HFValidationError)
                continue
            if not isinstance(cached, str):
                continue
            path = Path(cached)
        try:
            auto_map = json.loads(path.read_text(encoding="utf-8")).get("auto_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(auto_map, dict):
            found.extend(
                f"{key} -> {target}" for key, target in auto_map.items() if f"{key} -> {target}" not in found
            )
    return found


@contextlib.contextmanager
def loading_failures(name_or_path: str, part: str, *, trust_remote_code: bool = False) -> Iterator[None]:
    """transformers' errors on loading ``part`` of a model, as a :class:`ConfigurationError` that names
    the model (and, for a local folder, the files that cannot be read).

    transformers raises ``OSError`` for a file it cannot find or download, ``JSONDecodeError`` for a
    torn tokenizer.json, and safetensors its own ``SafetensorError`` ("header too large", naming no
    file) for a torn weights file: none of them a genscore error, so the command line printed a
    traceback, and the last two did not say which file was at fault. A model that needs the code it
    ships got transformers' "contains custom code which must be executed", which names neither the
    code nor the setting that allows it.
    """
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, SafetensorError) as error:
        if isinstance(error, ValueError) and not isinstance(error, json.JSONDecodeError):
            shipped = [] if trust_remote_code else shipped_code(name_or_path)
            if shipped:
                raise ConfigurationError(
                    f"model {name_or_path!r} needs the Python code it ships ({', '.join(shipped)}), which "
                    "genscore runs only when asked: read it, then pass trust_remote_code=True "
                    f"(--trust-remote-code) if you trust its source. transformers: {error}",
                    setting="trust_remote_code",
                ) from error
            raise  # transformers' own words (an unknown model type, a missing model_type)
        broken = _unreadable_files(name_or_path)
        where = f"; unreadable (corrupted or partly written?): {', '.join(broken)}" if broken else ""
        kind = ModelNotFoundError if isinstance(error, OSError) and not broken else ConfigurationError
        raise kind(
            f"model {name_or_path!r}: cannot load its {part}: {type(error).__name__}: {error}{where}",
            setting="model",
        ) from error


# Class names of models whose next-token head is part of the checkpoint (Qwen3ForCausalLM,
# GPT2LMHeadModel, Gemma3ForConditionalGeneration...).
_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")

_EXPECTED_MODEL = (
    "genscore needs a causal language model whose next-token head was trained with it, such as a "
    "generative reranker (Qwen/Qwen3-Reranker-0.6B) or another *ForCausalLM checkpoint"
)


def check_causal_lm_config(config: Any, name_or_path: str) -> None:
    """Refuse, before any weight is loaded, a checkpoint that is not a causal LM.

    ``AutoModelForCausalLM`` happily loads an encoder folder (BERT) by adding a freshly initialised
    LM head; its "scores" are then noise. ``config.json`` records the class the weights were saved
    from, which tells.
    """
    if getattr(config, "is_encoder_decoder", False):
        raise NotARerankerError(
            f"{name_or_path!r} is an encoder-decoder model ({config.model_type}); {_EXPECTED_MODEL}"
        )
    architectures = list(getattr(config, "architectures", None) or [])
    if seq_cls_architectures(config) and last_token_classifier(config) is not None:
        return  # a decoder whose label rows were cut out of its LM head (genscore_core.seq_cls)
    if architectures and not any(arch.endswith(_CAUSAL_LM_SUFFIXES) for arch in architectures):
        raise NotARerankerError(
            f"{name_or_path!r} holds a {', '.join(architectures)} (model type {config.model_type!r}), "
            f"not a causal language model; {_EXPECTED_MODEL}"
        )


def check_loaded_causal_lm(model: Any, missing_keys: list[str] | None, name_or_path: str) -> None:
    """Refuse a model whose weights were not all in the checkpoint (transformers fills them at random)."""
    kind = type(model).__name__
    output_embeddings = getattr(model, "get_output_embeddings", None)
    if is_decoder_seq_cls(model):
        pass  # its score rows are the label rows of the LM head it was converted from
    elif output_embeddings is None or output_embeddings() is None:
        raise NotARerankerError(
            f"{name_or_path!r} is a {kind}, which has no next-token (LM) head; {_EXPECTED_MODEL}"
        )
    if missing_keys:
        shown = ", ".join(sorted(missing_keys)[:5]) + (", ..." if len(missing_keys) > 5 else "")
        raise NotARerankerError(
            f"{name_or_path!r} lacks {len(missing_keys)} weight(s) of {kind} ({shown}); transformers would "
            f"initialise them at random and the scores would be noise. {_EXPECTED_MODEL}"
        )
    check_attends_causally(model, name_or_path)


def check_attends_causally(model: Any, name_or_path: str) -> None:
    """Refuse a model whose first position sees the tokens after it.

    An encoder loads as a causal LM where transformers has an LM-head class for it (a BERT folder
    without ``architectures`` becomes ``BertLMHeadModel``), but it attends both ways unless its
    config says ``is_decoder``: the next-token scores would then read the whole prompt, noise
    that no error names. Two rows that differ only in their second token tell: in a causal model
    their first positions agree. (One forward of two tokens, once per load.)
    """
    vocab_size = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab_size < 3:
        return
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return
    # Same shape, so a causal model runs both rows through the same kernels and their first
    # positions come out equal (bit for bit on the CPU, in float32 and bfloat16 alike).
    ids = torch.tensor([[1, 2], [1, vocab_size - 1]], device=device)
    was_training = model.training
    model.eval()  # dropout would make the two rows differ in any model
    try:
        with torch.inference_mode():
            if is_decoder_seq_cls(model):  # its logits are the last token's only: read the decoder's
                logits = decoder_of(model)(input_ids=ids).last_hidden_state[:, 0].float()
            else:
                logits = model(input_ids=ids).logits[:, 0].float()
    except Exception as error:  # a forward that needs more than ids: scoring says what, not this probe
        logger.debug("causal-attention check of %s skipped: %s", name_or_path, error)
        return
    finally:
        model.train(was_training)
    first, second = logits[0], logits[1]
    spread = float((first - second).abs().max())
    # A random-weight BERT moved by 1e-3 of its largest logit; trained encoders move far more.
    if not torch.isfinite(logits).all() or spread <= 1e-4 * max(float(first.abs().max()), 1.0):
        return
    raise NotARerankerError(
        f"{name_or_path!r} ({type(model).__name__}) is not causal: the output at a prompt's first token "
        f"changes with the token after it (by up to {spread:.3g} in the logits), so its next-token scores "
        f"would read the whole prompt. An encoder (BERT-like) model gives no generative score; "
        f"{_EXPECTED_MODEL}"
    )


def check_label_ids(
    tokenizer: Any, words: Sequence[str], ids: Sequence[int], vocab_size: int, *, by_id: bool = False
) -> None:
    """Refuse label ids that cannot tell the labels apart: an unknown-word token, or one id twice.

    ``by_id``: the template names its labels by id (``label_token_ids``), not by words.
    """
    if by_id:
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < vocab_size:
                raise NotARerankerError(
                    f"label token id {token_id} (entry {position} of the template's label_token_ids) is "
                    f"outside the model's vocabulary of {vocab_size} ids; name ids in [0, {vocab_size})"
                )
    unk = getattr(tokenizer, "unk_token_id", None)
    for word, token_id in zip(words, ids):
        if unk is not None and token_id == unk:
            raise NotARerankerError(
                f"label word {word!r} is the unknown token {tokenizer.unk_token!r} (id {token_id}) for this "
                f"tokenizer: its vocabulary lacks the word. Expected every label word {list(words)} to be "
                "a known single token, as in the reranker's own tokenizer; pass the model's tokenizer or a "
                "template with label words it knows"
            )
        if not 0 <= token_id < vocab_size:
            raise NotARerankerError(
                f"label word {word!r} is token {token_id}, outside the model's vocabulary of {vocab_size}; "
                "the tokenizer does not belong to this model"
            )
    if len(set(ids)) != len(ids):
        pairs = ", ".join(f"{w!r} -> {i}" for w, i in zip(words, ids))
        raise NotARerankerError(
            f"label words map to the same token id ({pairs}): every score would be the same. Expected "
            "distinct single tokens, as in the reranker's own tokenizer"
        )


def check_template_ids(tokenizer: Any, template: str, ids: Sequence[int], vocab_size: int) -> None:
    """Refuse a template whose own tokens (every prompt holds them) lie beyond the model's vocabulary."""
    beyond = [token_id for token_id in ids if not 0 <= token_id < vocab_size]
    if beyond:
        shown = ", ".join(f"{tokenizer.decode([token_id])!r} (id {token_id})" for token_id in beyond[:3])
        raise NotARerankerError(
            f"template {template!r} holds token(s) {shown}, outside the model's vocabulary of {vocab_size} "
            f"ids; the tokenizer ({len(tokenizer)} tokens) does not belong to this model. Pass the model's "
            "own tokenizer, or resize the model's embeddings to this one (model.resize_token_embeddings)"
        )


def load_causal_lm(
    name_or_path: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    show_progress: bool = True,
) -> Any:
    """Load a causal LM, refusing checkpoints that are not one (see :class:`NotARerankerError`).

    A decoder ``*ForSequenceClassification`` folder (:mod:`genscore_core.seq_cls`) loads as that class:
    its decoder is a causal LM's and its score rows are the LM head's label rows.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    gguf = gguf_source(name_or_path)
    if gguf is not None:
        return _load_gguf(gguf, device=device, dtype=dtype, show_progress=show_progress)
    folder = Path(name_or_path).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        # transformers would say the config.json it did not find lacks a model_type.
        raise ModelNotFoundError(
            f"model {name_or_path!r}: the folder {folder.resolve()} holds no config.json, so no model "
            "(only a tokenizer); save the model there too (model.save_pretrained(folder)), or score "
            "through a server that has it (server_url=)",
            setting="model",
        )
    with loading_failures(name_or_path, "config.json", trust_remote_code=trust_remote_code):
        config = AutoConfig.from_pretrained(
            name_or_path, trust_remote_code=trust_remote_code, local_files_only=from_cache_only(name_or_path)
        )
    check_causal_lm_config(config, name_or_path)
    check_special_token_ids(config, name_or_path)
    placement: dict[str, Any] = {}
    if device.type == "cuda" and _accelerate_available():
        # Each tensor goes from the file straight to the GPU in ``dtype``: no whole copy of the
        # model in host memory first (transformers needs accelerate for this; without it, the
        # model is loaded on the CPU and moved).
        index = device.index if device.index is not None else torch.cuda.current_device()
        placement["device_map"] = {"": torch.device("cuda", index)}
    try:
        with (
            transformers_progress_bars(show_progress),
            loading_failures(name_or_path, "weights", trust_remote_code=trust_remote_code),
        ):
            cache_only = from_cache_only(name_or_path)
            # With peft installed, transformers looks for an adapter_config.json before the weights and
            # does not pass local_files_only on to that lookup (transformers 5.24): a hub that does not
            # answer was asked again, with retries (30 s for a model wholly in the cache).
            adapter = {"adapter_kwargs": {"local_files_only": True}} if cache_only else {}
            auto: Any = (
                AutoModelForSequenceClassification if seq_cls_architectures(config) else AutoModelForCausalLM
            )
            loaded: Any = auto.from_pretrained(
                name_or_path,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                local_files_only=cache_only,
                **placement,
                **adapter,
            )
    except pickle.UnpicklingError as error:  # never retried with weights_only=False
        raise refused_pickle_error(name_or_path, error) from error
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise wrong_shapes_error(name_or_path, config, trust_remote_code=trust_remote_code) from error
    model, info = loaded
    check_loaded_causal_lm(model, list(info.get("missing_keys") or []), name_or_path)
    return model.to(device).eval()


def _load_gguf(source: GgufSource, *, device: torch.device, dtype: torch.dtype, show_progress: bool) -> Any:
    """A GGUF checkpoint dequantised to ``dtype``, checked as any causal LM is."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_gguf_header(source)
    name = str(source.path)
    with gguf_failures(source, "configuration"):
        config = AutoConfig.from_pretrained(source.folder, gguf_file=source.file)
    check_causal_lm_config(config, name)
    with transformers_progress_bars(show_progress), gguf_failures(source, "weights"):
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            source.folder, gguf_file=source.file, dtype=dtype, output_loading_info=True
        )
    model, info = loaded
    check_loaded_causal_lm(model, list(info.get("missing_keys") or []), name)
    return model.to(device).eval()


def _accelerate_available() -> bool:
    from transformers.utils import is_accelerate_available

    return bool(is_accelerate_available())


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


def position_table_rows(model: Any) -> int | None:
    """The positions a model's learned position table holds (GPT-2's ``wpe``, OPT's learned
    positions), or ``None`` for models that compute positions (rotary, ALiBi) and can be run longer.

    A table is an embedding other than the token embedding with ``max_position_embeddings`` rows (OPT
    keeps two more, for its offset).
    """
    limit = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    tokens = model.get_input_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module is not tokens:
            if limit <= module.num_embeddings <= limit + 2:
                return limit
    return None


def check_max_length(model: Any, max_length: int) -> None:
    """Refuse a ``max_length`` past the model's learned position table: a prompt that long would index
    beyond it (an IndexError on the CPU, a device-side assert on CUDA that fails every later call).

    Raises:
        ConfigurationError: Naming both lengths and the model class.
    """
    rows = position_table_rows(model)
    if rows is not None and max_length > rows:
        raise ConfigurationError(
            f"max_length={max_length} is longer than {type(model).__name__}'s learned position table "
            f"({rows} positions): a prompt that long cannot be run. Pass max_length <= {rows}, or leave it "
            "unset to use the model's own limit",
            setting="max_length",
        )


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
