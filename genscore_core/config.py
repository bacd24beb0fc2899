"""Typed, validated settings of a scorer."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from genscore_core.errors import ConfigurationError
from genscore_core.templates import PromptTemplate, ScoreMode

DTYPE_NAMES = frozenset({"float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "half"})
"""The dtype names a scorer runs in (:func:`genscore_core.loading.resolve_dtype` maps each to torch's)."""

DEFAULT_MODEL = "Qwen/Qwen3-Reranker-0.6B"

ServerKind = Literal["genscore", "vllm", "sglang", "rerank"]
"""The protocols a scorer can score through (``server_kind``)."""
SERVER_KINDS: tuple[ServerKind, ...] = ("genscore", "vllm", "sglang", "rerank")


class ScorerConfig(BaseModel):
    """Everything that decides how a :class:`~genscore_core.GenerativeScorer` loads and scores."""

    # Attribute docstrings become field descriptions: the command lines take their help from them.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    model: str = DEFAULT_MODEL
    """Hugging Face hub id or local folder of a causal LM."""
    template: str | PromptTemplate = "auto"
    """Preset name (``"qwen3-reranker"``, ``"mxbai-rerank-v2"``, ``"bge-reranker-v2-gemma"``), a template, or
    ``"auto"``: the folder's sentence-transformers CrossEncoder configuration, else a preset the model's
    name points at, else qwen3-reranker (docs/models.md; ``scorer.recipe`` says which)."""
    score_mode: Literal["auto", ScoreMode] = "auto"
    """How next-token logits become a score: ``"label-softmax"`` (softmax over the label tokens: the
    two-label probability), ``"vocab-softmax"`` (the first label's full-vocabulary probability),
    ``"logit"`` (the first label's raw logit, for single-token models; unbounded), ``"logit-sigmoid"``
    (its sigmoid, in [0, 1]); ``"auto"``: the template's own (label-softmax for two labels,
    logit-sigmoid for one). See docs/models.md."""
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
    trust_remote_code: bool = False
    """Run the Python code a model folder or hub repository ships (only for sources you trust)."""
    show_progress: bool = False
    """Show a progress bar on stderr while scoring."""

    # -- scoring through a server (docs/scaling.md) -------------------------------------------------
    server_url: str | None = None
    """Score through the server at this URL (``http://host:port``) instead of loading the model here.
    ``model`` then names the tokenizer (hub id or folder) that prompts are built with; the weights
    stay on the server, so the settings of a model loaded here (device, dtype, forward, max_batch_tokens,
    max_batch_size) are refused with it, as the other server_* settings are without it."""
    server_kind: ServerKind = "genscore"
    """The server's protocol: ``"genscore"`` (``genscore serve``) or ``"vllm"``: generative scoring
    (``/generative_scoring``); ``"sglang"``: SGLang's ``/v1/score``; ``"rerank"``: ``/v1/rerank``, which
    carries text only, so the server applies its own template and raw ``score()`` requests are refused."""
    server_model: str | None = None
    """Model name sent to the server; ``None`` sends none and the server uses its default model."""
    server_api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer ...`` (the ``--api-key`` of vLLM and SGLang)."""
    server_timeout: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    """Seconds allowed for one HTTP request, from connecting to the answer's last byte; a slower attempt
    fails and is retried like a timeout. At most a day: a socket cannot wait without bound (a request
    is at most ``server_batch_size`` items, far from a day's work)."""
    server_max_retries: int = Field(default=3, ge=0)
    """Retries after a connection error, a timeout or a 429/5xx answer, with exponential backoff."""
    server_batch_size: int = Field(default=256, gt=0)
    """Most items in one HTTP request; bigger jobs are split into requests sent in parallel."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_bool(cls, value: object, info: ValidationInfo) -> object:
        # pydantic reads True as 1 where a number is due: max_batch_tokens=True would run one token
        # a batch, max_length=True refuse every prompt as too long.
        if isinstance(value, bool) and info.field_name in _NUMBER_FIELDS:
            raise ValueError(f"must be a number, not the bool {value}")
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _folder_name(cls, model: object) -> object:
        # from_pretrained takes a Path as readily as a string (make_tiny_model returns one); the
        # setting keeps the string, which responses and the command line print.
        return os.fspath(model) if isinstance(model, os.PathLike) else model

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

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must start with http:// or https://, got {url!r}")
        return url.rstrip("/") if url is not None else None

    @model_validator(mode="after")
    def _every_setting_applies(self) -> ScorerConfig:
        # A setting that the chosen backend never reads would pass in silence: --server-url with
        # --device cuda scored as the server was started while scorer.config said "cuda". Only values
        # given and unlike the default count, so that a dump of every field (an adapter's model_dump,
        # a pickle) rebuilds the scorer it came from.
        remote = self.server_url is not None
        unused = [
            name
            for name in type(self).model_fields
            if name in self.model_fields_set
            and (name in LOCAL_MODEL_SETTINGS if remote else name in SERVER_SETTINGS)
            and _asks_for_something(name, getattr(self, name))
        ]
        if not unused:
            return self
        given = ", ".join(
            f"{name} is set" if name == "server_api_key" else f"{name}={getattr(self, name)!r}"
            for name in unused
        )
        them = "it" if len(unused) == 1 else "them"
        if remote:
            why = (
                f"{given} with server_url: the server runs the model as it was started, so a setting of the "
                f"model loaded here would be ignored; leave {them} out, or leave server_url out to load the model here"
            )
        else:
            why = (
                f"{given} without server_url: the model is loaded here and no server is asked, so a setting of "
                f"scoring through a server would be ignored; set server_url, or leave {them} out"
            )
        raise ConfigurationError(why, setting=unused[0])


_NUMBER_FIELDS = frozenset(
    name
    for name, field in ScorerConfig.model_fields.items()
    if field.annotation in (int, float, int | None, float | None)
)
"""The settings that hold a number, which pydantic would otherwise take a bool for."""

LOCAL_MODEL_SETTINGS = frozenset({"device", "dtype", "forward", "max_batch_tokens", "max_batch_size"})
"""Settings of the model loaded here, which nothing reads when ``server_url`` is set (refused then)."""

SERVER_SETTINGS = frozenset(
    name for name in ScorerConfig.model_fields if name.startswith("server_") and name != "server_url"
)
"""Settings of the server client, which nothing reads without ``server_url`` (refused then)."""


def _asks_for_something(name: str, value: object) -> bool:
    """Whether ``value`` of setting ``name`` differs from leaving it out (``"auto"`` asks for nothing)."""
    if name in ("device", "dtype") and value == "auto":
        return False
    return bool(value != ScorerConfig.model_fields[name].get_default())


def scorer_setting_names() -> frozenset[str]:
    """Keyword names that configure a new :class:`~genscore_core.GenerativeScorer`: ``model``,
    ``config`` and the fields of :class:`ScorerConfig`. Adapters use it to tell scorer settings from
    their own options."""
    return frozenset({"model", "config", *ScorerConfig.model_fields})
