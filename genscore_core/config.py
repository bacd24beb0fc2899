"""Typed, validated settings of a scorer: the model, its prompts, and where it runs.

A :class:`ScorerConfig` is composed of three parts:

* :class:`PromptSettings`: how prompts are built and shortened (template, score mode, lengths...);
* exactly one of :class:`LocalSettings` (the model is loaded here: device, dtype, batches, forward)
  or :class:`ServerSettings` (scored through a server: url, protocol, key, timeout, retries...), as
  its ``run``. A setting of the one not in use cannot be given: a server has no ``device`` field.

The flat keywords of before still work and land in their part (``ScorerConfig(device="cpu",
max_length=512)``, ``GenerativeScorer(name, server_url=..., server_timeout=5)``); a server setting
keeps its ``server_`` prefix there (``server_timeout`` is ``ServerSettings.timeout``). A flat setting
given for the part not in use is refused when it asks for something, and dropped when it holds its
default, so that a flat dump of every setting (an older adapter's, a manifest) still loads.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from genscore_core.errors import ConfigurationError
from genscore_core.result_cache import ENTRY_BYTES
from genscore_core.templates import PromptTemplate, ScoreMode

DTYPE_NAMES = frozenset({"float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "half"})
"""The dtype names a scorer runs in (:func:`genscore_core.loading.resolve_dtype` maps each to torch's)."""

DEFAULT_MODEL = "Qwen/Qwen3-Reranker-0.6B"

ServerKind = Literal["genscore", "vllm", "sglang", "rerank"]
"""The protocols a scorer can score through (``server_kind``)."""
SERVER_KINDS: tuple[ServerKind, ...] = ("genscore", "vllm", "sglang", "rerank")

_NUMBER_TYPES = (int, float, int | None, float | None)


class _Settings(BaseModel):
    # Attribute docstrings become field descriptions: the command lines take their help from them.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_bool(cls, value: object, info: ValidationInfo) -> object:
        # pydantic reads True as 1 where a number is due: max_batch_tokens=True would run one token
        # a batch, max_length=True refuse every prompt as too long.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBER_TYPES:
            raise ValueError(f"must be a number, not the bool {value}")
        return value


class PromptSettings(_Settings):
    """How (query, document) pairs become prompts, and how a score is read from the model's answer."""

    template: str | PromptTemplate = "auto"
    """Preset name (``"qwen3-reranker"``, ``"mxbai-rerank-v2"``, ``"bge-reranker-v2-gemma"``, ``"zerank"``,
    ``"ctxl-rerank-v2"``, ``"lb-reranker"``), a template, or
    ``"auto"``: the folder's sentence-transformers CrossEncoder configuration, else a preset the model's
    name points at, else qwen3-reranker (docs/models.md; ``scorer.recipe`` says which)."""
    score_mode: Literal["auto", ScoreMode, "calibrated"] = "auto"
    """How next-token logits become a score: ``"label-softmax"`` (softmax over the label tokens: the
    two-label probability), ``"vocab-softmax"`` (the first label's full-vocabulary probability),
    ``"logit"`` (the first label's raw logit, for single-token models; unbounded), ``"logit-sigmoid"``
    (its sigmoid, in [0, 1]), ``"expected-grade"`` (the expected grade over graded label tokens, in
    [0, 1]); ``"auto"``: the template's own (label-softmax for two labels, logit-sigmoid for one, or
    the family's: expected-grade for lb-reranker, logit for ctxl-rerank-v2). A template's
    ``logit_temperature`` divides the logits first (zerank: sigmoid(logit / 5)). ``"calibrated"``: the
    probability of relevance fitted by ``genscore calibrate`` (``calibration``). See docs/models.md and
    docs/evaluation.md."""
    instruction: str | None = None
    """Task instruction written into templates that take one; ``None`` uses the template's default."""
    max_length: int | None = Field(default=None, gt=0)
    """Longest prompt in tokens; ``None`` uses what the model supports."""
    long_documents: Literal["truncate", "chunk"] = "truncate"
    """A document longer than the prompt leaves room for: ``"truncate"`` drops its end (the template
    always survives); ``"chunk"`` scores it as overlapping token windows, each with the template
    intact, and gives it one score from theirs (``chunk_aggregation``); results name the reported
    window's character span."""
    chunk_overlap: int = Field(default=32, ge=0)
    """Tokens shared by consecutive windows (at most half a window)."""
    chunk_aggregation: Literal["max", "mean", "first", "last"] = "max"
    """A chunked document's score: its best window's (``"max"``), the windows' mean, or the first or
    last window's."""
    query_share: float = Field(default=0.75, gt=0.0, lt=1.0)
    """Share of the body budget the query may keep when a prompt has to be shortened."""
    chunk_max_tokens: int | None = Field(default=262_144, gt=0)
    """With ``long_documents="chunk"``: the most tokens one document that does not fit may have (the
    document tokenized alone). A longer one is refused, a PromptTooLongError naming it and the cap,
    before it is tokenized whole, so that what a call holds stays bounded by its prompts (an 8 MB
    document took over 1 GB unbounded). The default is ``genscore serve``'s whole-request bound
    (``--max-prompt-tokens``); ``None``: no cap."""
    calibration: str | None = None
    """With ``score_mode="calibrated"``: the file ``genscore calibrate`` wrote; ``None`` reads
    ``genscore_calibration.json`` in the model's folder. See docs/evaluation.md."""


class LocalSettings(_Settings):
    """Settings of a model loaded here (the engine reads ``forward`` and the batch sizes)."""

    device: str | None = None
    """``"cuda"``, ``"cuda:1"``, ``"cpu"``...; ``None`` picks CUDA when available."""
    dtype: str | None = None
    """``"bfloat16"``, ``"float16"``, ``"float32"`` (or the ``torch`` dtype itself); ``None`` is bf16 on
    CUDA and fp32 on the CPU."""
    max_batch_tokens: int = Field(default=16384, gt=0)
    """Token budget of one forward batch: padded tokens count in the padded forward; the packed
    forward counts computed tokens and, when this is left unset, uses its own default (65536)."""
    max_batch_size: int = Field(default=64, gt=0)
    """Most prompts in one batch of the padded forward."""
    forward: Literal["auto", "padded", "packed"] = "auto"
    """``"packed"``: variable-length batches without padding, each query's shared prefix computed once
    (Qwen3, Qwen2 and Llama-style models); ``"padded"``: left-padded batches through the model's own
    forward (any causal LM); ``"auto"``: packed where the architecture supports it, else padded."""
    cuda_graphs: bool = True
    """On CUDA, the packed forward captures a fixed ladder of CUDA graphs when the model loads (a few
    seconds; docs/benchmarks.md, "CUDA-graph ladder") and pads each batch to the smallest rung it
    fits, so that no call pays for a capture; ``False``: every batch runs eagerly."""
    quantization: Literal["fp8"] | None = None
    """``"fp8"``: the decoder layers' matrix products that a norm or SiLU feeds (q/k/v, gate/up, down)
    in float8 e4m3 (weights per output channel, activations per token; embeddings, norms, attention
    and its output projection, and the head stay bf16/float32). Opt-in: it
    needs the packed forward, a bf16 model and a GPU with FP8 tensor cores (compute capability >= 8.9);
    check its scores on your own judged data (docs/python.md, "FP8"). ``None``: the model's dtype."""
    cpu_threads: int | None = Field(default=None, gt=0)
    """torch's threads for a model on the CPU, set when the scorer is built (process-wide). ``None``:
    one per usable core, one fewer on a machine of 2-4 cores (the tokenizer keeps one), never more
    than torch had; torch is left alone when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set or
    ``torch.set_num_threads`` was called (docs/python.md, "CPU threads")."""

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_name(cls, dtype: object) -> object:
        # transformers' from_pretrained takes torch.float16 as readily as "float16"; the setting keeps
        # the name so that it stays plain data (JSON, the command line, pickles) and torch is not imported.
        if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
            dtype = str(dtype).removeprefix("torch.")
        # Refused here, before a model is loaded, rather than seconds later when the weights are cast.
        if isinstance(dtype, str) and dtype != "auto" and dtype.lower() not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_NAMES)} or 'auto'")
        return dtype


class ServerSettings(_Settings):
    """Settings of scoring through a server (docs/scaling.md); given as ``server_*`` flat keywords."""

    url: str
    """Score through the server at this URL (``http://host:port``) instead of loading the model here.
    ``model`` then names the tokenizer (hub id or folder) that prompts are built with; the weights
    stay on the server, so the settings of a model loaded here (device, dtype, forward, max_batch_tokens,
    max_batch_size) are refused with it, as the other server_* settings are without it."""
    kind: ServerKind = "genscore"
    """The server's protocol: ``"genscore"`` (``genscore serve``) or ``"vllm"``: generative scoring
    (``/generative_scoring``); ``"sglang"``: SGLang's ``/v1/score``; ``"rerank"``: ``/v1/rerank``, which
    carries text only, so the server applies its own template and raw ``score()`` requests are refused."""
    model: str | None = None
    """Model name sent to the server; ``None`` sends none and the server uses its default model."""
    api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer ...`` (the ``--api-key`` of vLLM and SGLang)."""
    timeout: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    """Seconds allowed for one HTTP request, from connecting to the answer's last byte; a slower attempt
    fails and is retried like a timeout. At most a day: a socket cannot wait without bound (a request
    is at most ``server_batch_size`` items, far from a day's work)."""
    max_retries: int = Field(default=3, ge=0)
    """Retries after a connection error, a timeout or a 429/5xx answer, with exponential backoff."""
    batch_size: int = Field(default=256, gt=0)
    """Most items in one HTTP request; bigger jobs are split into requests sent in parallel."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


def _run_kind(value: Any) -> str:
    """Which part ``run`` is: a server when it names a URL, else a model loaded here."""
    if isinstance(value, ServerSettings) or (isinstance(value, Mapping) and "url" in value):
        return "server"
    return "local"


RunSettings = Annotated[
    Annotated[LocalSettings, Tag("local")] | Annotated[ServerSettings, Tag("server")],
    Discriminator(_run_kind),
]
"""Where a scorer runs: exactly one of a model loaded here or a server."""


class ScorerConfig(_Settings):
    """Everything that decides how a :class:`~genscore_core.GenerativeScorer` loads and scores.

    Example:
        >>> ScorerConfig(model="m", prompt=PromptSettings(max_length=512), run=LocalSettings(device="cpu"))
        ... # doctest: +SKIP
        >>> ScorerConfig(model="m", max_length=512, device="cpu")  # the same, from flat keywords
        ... # doctest: +SKIP
    """

    model: str = DEFAULT_MODEL
    """Hugging Face hub id or local folder of a causal LM."""
    prompt: PromptSettings = PromptSettings()
    """How prompts are built and scores read (the same wherever the model runs)."""
    run: RunSettings = Field(default_factory=LocalSettings)
    """Where the model runs: :class:`LocalSettings` (loaded here) or :class:`ServerSettings`."""
    trust_remote_code: bool = False
    """Run the Python code a model folder or hub repository ships (only for sources you trust)."""
    show_progress: bool = False
    """Show a progress bar on stderr while scoring."""
    result_cache_bytes: int = Field(default=0, ge=0)
    """Memory for a cache of scores: a prompt scored before is answered from it without the model,
    the least recently used dropped first (about 180 bytes a score, whatever the prompt's length);
    0: no cache. It pays where the same pairs come back (a RAG pipeline asked the same question
    again); see docs/python.md, "The result cache"."""

    @field_validator("result_cache_bytes")
    @classmethod
    def _room_for_one(cls, size: int) -> int:
        if 0 < size < ENTRY_BYTES:
            raise ValueError(f"must be 0 (no cache) or at least {ENTRY_BYTES} bytes (one score), got {size}")
        return size

    def __init__(self, /, **data: Any) -> None:
        try:
            # Routed here, not only in the validator, so that a bad value of a setting refused for its
            # part is reported as bad (ValidationError), as it was before the refusal.
            super().__init__(**route_settings(data))
        except ValidationError as error:
            # Errors name the flat setting (max_batch_tokens, not run.local.max_batch_tokens): the
            # name a user typed, and the one the command line turns back into its flag.
            raise _flat_error(error) from None

    @field_validator("model", mode="before")
    @classmethod
    def _folder_name(cls, model: object) -> object:
        # from_pretrained takes a Path as readily as a string (make_tiny_model returns one); the
        # setting keeps the string, which responses and the command line print.
        return os.fspath(model) if isinstance(model, os.PathLike) else model

    @model_validator(mode="before")
    @classmethod
    def _flat_keywords(cls, data: Any) -> Any:
        return route_settings(data) if isinstance(data, Mapping) else data

    @property
    def local(self) -> LocalSettings | None:
        """The settings of the model loaded here; ``None`` when scoring through a server."""
        return self.run if isinstance(self.run, LocalSettings) else None

    @property
    def server(self) -> ServerSettings | None:
        """The settings of the server scored through; ``None`` when the model is loaded here."""
        return self.run if isinstance(self.run, ServerSettings) else None

    def to_settings(
        self,
        *,
        mode: Literal["python", "json"] = "python",
        exclude: Collection[str] = (),
        every: bool = False,
    ) -> dict[str, Any]:
        """The flat keywords that rebuild this config (``ScorerConfig(**config.to_settings())``).

        Those of the part in use only, unless ``every``: then the other part's too, at their defaults
        (the flat form a scorer's settings had before they were typed). ``mode="json"`` gives
        JSON-ready values (a template as a dict; a secret masked, so leave it out with ``exclude``).
        """
        parts = {
            "": self.model_dump(mode=mode, exclude={"prompt", "run"}),
            "prompt": self.prompt.model_dump(mode=mode),
            type(self.run).__name__: self.run.model_dump(mode=mode),
        }
        settings = {}
        for name, (part, field) in _FLAT.items():
            if part in parts:
                settings[name] = parts[part][field]
            elif every:
                settings[name] = setting_default(name)
        return {name: value for name, value in settings.items() if name not in exclude}

    def given_settings(self) -> set[str]:
        """The flat names of the settings given rather than left to their defaults."""
        given = {name for name in self.model_fields_set if name in _FLAT}
        given |= set(_flat_names("prompt", self.prompt.model_fields_set))
        given |= set(_flat_names(type(self.run).__name__, self.run.model_fields_set))
        return given


# -- the flat keywords ------------------------------------------------------------------------------

_PARTS: dict[str, type[_Settings]] = {
    "prompt": PromptSettings,
    "LocalSettings": LocalSettings,
    "ServerSettings": ServerSettings,
}


def _flat_name(part: str, field: str) -> str:
    return f"server_{field}" if part == "ServerSettings" else field


def _flat_names(part: str, fields: Collection[str]) -> list[str]:
    return [_flat_name(part, field) for field in fields]


# The flat keywords in the order the command lines list their flags (the order of the flat config).
_FLAT: dict[str, tuple[str, str]] = {
    "model": ("", "model"),
    **{name: ("prompt", name) for name in PromptSettings.model_fields},
    **{name: ("LocalSettings", name) for name in LocalSettings.model_fields},
    "trust_remote_code": ("", "trust_remote_code"),
    "show_progress": ("", "show_progress"),
    **{_flat_name("ServerSettings", name): ("ServerSettings", name) for name in ServerSettings.model_fields},
    "result_cache_bytes": ("", "result_cache_bytes"),
}

SETTING_FIELDS: Mapping[str, FieldInfo] = {
    name: (_PARTS[part] if part else ScorerConfig).model_fields[field]
    for name, (part, field) in _FLAT.items()
}
"""Every flat setting (``model``, ``max_length``, ``device``, ``server_url``, ...) and its field, in the
order of the command lines' flags: the command lines and the docs are generated from these."""

LOCAL_MODEL_SETTINGS = frozenset(name for name, (part, _) in _FLAT.items() if part == "LocalSettings")
"""Settings of the model loaded here, which nothing reads when ``server_url`` is set (refused then)."""

SERVER_SETTINGS = frozenset(
    name for name, (part, _) in _FLAT.items() if part == "ServerSettings" and name != "server_url"
)
"""Settings of the server client, which nothing reads without ``server_url`` (refused then)."""


def route_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with its flat keywords moved into their part (``prompt``, ``run``).

    A flat setting of the part not in use is refused if it asks for something (a ``device`` with a
    server, a ``server_timeout`` without one) and dropped if it holds its default: a dump of every
    setting rebuilds the scorer it came from.
    """
    routed: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
    for name, value in data.items():
        part, field = _FLAT.get(name, ("", name))
        if part:
            parts[part][field] = value
        else:
            routed[name] = value
    if parts["ServerSettings"].get("url", "") is None:  # server_url=None: no server, as if left out
        del parts["ServerSettings"]["url"]
    for key, part in (("prompt", "prompt"), ("run", "LocalSettings"), ("run", "ServerSettings")):
        if parts[part] and key in routed:
            name = _flat_name(part, next(iter(parts[part])))
            raise ConfigurationError(f"{name} given with {key}=: give the settings one way", setting=name)
    if parts["prompt"]:
        routed["prompt"] = parts["prompt"]
    server, local = parts["ServerSettings"], parts["LocalSettings"]
    if "url" in server:
        _refuse_unused(local, "LocalSettings", remote=True)
        routed["run"] = server
    else:
        _refuse_unused(server, "ServerSettings", remote=False)
        if local:
            routed["run"] = local
    return routed


def _refuse_unused(given: Mapping[str, Any], part: str, *, remote: bool) -> None:
    # A setting that the chosen backend never reads would pass in silence: --server-url with
    # --device cuda scored as the server was started while scorer.config said "cuda". Only values
    # unlike the default count, so that a dump of every field (an older adapter's) loads.
    _check_values(given, part)
    unused = [
        _flat_name(part, field)
        for field in _PARTS[part].model_fields
        if field in given and _asks_for_something(_flat_name(part, field), given[field])
    ]
    if not unused:
        return
    values = {name: given[_FLAT[name][1]] for name in unused}
    said = ", ".join(
        f"{name} is set" if name == "server_api_key" else f"{name}={values[name]!r}" for name in unused
    )
    them = "it" if len(unused) == 1 else "them"
    if remote:
        why = (
            f"{said} with server_url: the server runs the model as it was started, so a setting of the "
            f"model loaded here would be ignored; leave {them} out, or leave server_url out to load the model here"
        )
    else:
        why = (
            f"{said} without server_url: the model is loaded here and no server is asked, so a setting of "
            f"scoring through a server would be ignored; set server_url, or leave {them} out"
        )
    raise ConfigurationError(why, setting=unused[0])


def _check_values(given: Mapping[str, Any], part: str) -> None:
    """Raise pydantic's ``ValidationError`` for the bad values in ``given``, named by flat setting."""
    entries: list[Any] = []
    for field, value in given.items():
        name = _flat_name(part, field)
        try:
            setting_value(name, value)
        except ValidationError as error:
            entries += [{**entry, "loc": (name,)} for entry in _line_errors(error)]
    if entries:
        raise ValidationError.from_exception_data("ScorerConfig", entries)


def _asks_for_something(name: str, value: object) -> bool:
    """Whether ``value`` of setting ``name`` differs from leaving it out (``"auto"`` asks for nothing)."""
    if name in ("device", "dtype") and value == "auto":
        return False
    return bool(value != SETTING_FIELDS[name].get_default())


def setting_name(location: tuple[int | str, ...]) -> str | None:
    """The flat setting a validation error's ``loc`` points at (``("run", "server", "timeout")`` ->
    ``server_timeout``), or None when it points at no one setting."""
    path = [str(step) for step in location]
    if path[:1] == ["prompt"] and len(path) > 1:
        return path[1]
    if path[:2] == ["run", "local"] and len(path) > 2:
        return path[2]
    if path[:2] == ["run", "server"] and len(path) > 2:
        return _flat_name("ServerSettings", path[2]) if path[2] in ServerSettings.model_fields else path[2]
    return path[0] if path and path[0] in _FLAT else None


def _flat_error(error: ValidationError) -> ValidationError:
    """``error`` with each location a flat setting's name where it points at one."""
    entries: list[Any] = []
    for entry in _line_errors(error):
        name = setting_name(entry["loc"])
        entries.append({**entry, "loc": (name,)} if name else entry)
    return ValidationError.from_exception_data(error.title, entries)


def _line_errors(error: ValidationError) -> list[Any]:
    """``error``'s entries in the form ``ValidationError.from_exception_data`` takes."""
    return [
        {"type": e["type"], "loc": e["loc"], "input": e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {})}
        for e in error.errors()
    ]


def setting_default(name: str) -> Any:
    """The default of the flat setting ``name`` (None for ``server_url``: no server)."""
    field = SETTING_FIELDS[name]
    return None if field.is_required() else field.get_default(call_default_factory=True)


def setting_value(name: str, value: Any) -> Any:
    """``value`` of the flat setting ``name`` as the config holds it (``dtype=torch.float16`` ->
    ``"float16"``, a template's dict -> the template). Raises ``ValidationError`` for a bad value."""
    part, field = _FLAT[name]
    if not part:
        return getattr(ScorerConfig.model_validate({field: value}), field)
    if part == "ServerSettings" and field == "url" and value is None:
        return None
    data = {field: value}
    if part == "ServerSettings" and field != "url":
        data["url"] = "http://localhost"  # the one required field, so that the others validate alone
    return getattr(_PARTS[part].model_validate(data), field)


def scorer_setting_names() -> frozenset[str]:
    """Keyword names that configure a new :class:`~genscore_core.GenerativeScorer`: ``model``,
    ``config``, the flat settings (:data:`SETTING_FIELDS`) and the typed parts ``prompt`` and ``run``.
    Adapters use it to tell scorer settings from their own options."""
    return frozenset({"model", "config", "prompt", "run", *SETTING_FIELDS})
