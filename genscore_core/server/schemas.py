"""Request and response bodies of the server besides the generative scoring protocol."""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from genscore_core.protocol import log_ignored_fields
from genscore_core.templates import ScoreMode

# The ``type`` of the error body for each status, as OpenAI-compatible servers name them.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def api_key_problem(api_key: str) -> str | None:
    """What makes ``api_key`` unusable as a server's key (clients send it as ``Authorization: Bearer
    <key>``), or None when it is usable."""
    if not api_key:
        return "the key is empty"
    if not (api_key.isascii() and api_key.isprintable()) or any(c.isspace() for c in api_key):
        return "the key must be printable ASCII without spaces (clients send it in an HTTP header)"
    return None


def error_body(message: str, code: int, param: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}, "detail": message}``.

    ``error`` is the body the protocol (and vLLM) answers errors with; ``param`` names the offending
    field where one is known, as OpenAI's bodies do (``"documents.3"``: entry 3 of ``documents``),
    else null. ``detail`` repeats the message at the top level, where FastAPI-style and Jina-style
    clients (LlamaIndex's ``JinaRerank``) read it.
    """
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(code, "InternalServerError" if code >= 500 else "BadRequestError"),
            "param": param,
            "code": code,
        },
        "detail": message,
    }


class ErrorInfo(BaseModel):
    message: str
    """What went wrong, naming the offending field or limit."""
    type: str
    """``BadRequestError``, ``AuthenticationError``, ``NotFoundError``, ``RequestTimeoutError``, ``RequestTooLargeError``,
    ``UnprocessableEntityError``, ``ServiceUnavailableError``, ``BadGatewayError``,
    ``GatewayTimeoutError`` or ``InternalServerError``."""
    param: str | None = None
    """The offending field of the request, dotted to the entry (``"documents.3"``, ``"query"``,
    ``"label_token_ids.1"``); null where no one field is at fault (a full queue, a body too large)."""
    code: int
    """The HTTP status."""


class ErrorResponse(BaseModel):
    """The body of every error answer (see :func:`error_body`)."""

    error: ErrorInfo
    detail: str
    """The same message as ``error.message``, for clients that read ``detail``."""


class HealthStatus(BaseModel):
    status: Literal["ok", "unavailable"]


class RequestBody(BaseModel):
    """A request body of one of the server's dialects: fields it does not know are ignored, as the
    servers it speaks for do, and named in the log (:func:`~genscore_core.protocol.log_ignored_fields`)."""

    model_config = ConfigDict(extra="ignore")

    request_name: ClassVar[str]
    """What the log line calls the request."""

    @model_validator(mode="before")
    @classmethod
    def _log_ignored_fields(cls, data: Any) -> Any:
        log_ignored_fields(cls.request_name, cls, data)
        return data


class RerankDocument(BaseModel):
    text: str


class RerankRequest(RequestBody):
    """The rerank shape of Cohere, Jina and vLLM (``/v1/rerank``)."""

    request_name = "rerank"

    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    """Texts, or objects with a ``text`` field."""
    # Strict, as the library's options are (check_rank_options): lax parsing read ``"top_n": true``
    # as 1, ``"score_threshold": true`` as 1.0 and ``"max_tokens_per_doc": true`` as 1, and answered
    # 200 with documents silently dropped or cut to one token.
    top_n: StrictInt | None = Field(default=None, ge=0)
    """Return the best N only; ``None`` or 0 returns all."""
    return_documents: StrictBool = False
    """Put each document's text in its result."""
    score_threshold: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    """Drop results scoring below this (a genscore extension): a score of the server's mode, in
    [0, 1] here; a server in ``logit`` mode takes any finite logit (:class:`LogitRerankRequest`)."""
    max_tokens_per_doc: StrictInt | None = Field(default=None, gt=0)
    """Cut each document after this many of its own tokens before templating (Cohere, vLLM)."""
    instruction: StrictStr | None = None
    """This request's task instruction, written into the template instead of the server's
    (``--instruction``); refused (400) by a template without an ``{instruction}`` slot."""
    instruct: StrictStr | None = None
    """SGLang's name for ``instruction``."""

    def texts(self) -> list[str]:
        return [doc if isinstance(doc, str) else doc.text for doc in self.documents]


class LogitRerankRequest(RerankRequest):
    """:class:`RerankRequest` of a server scoring in ``logit`` mode, whose scores are raw logits."""

    score_threshold: StrictFloat | None = Field(default=None, allow_inf_nan=False)
    """Drop results whose logit is below this (a genscore extension): any finite number."""


def rerank_request_type(score_mode: str) -> type[RerankRequest]:
    """The ``/v1/rerank`` body of a server scoring in ``score_mode``: its ``score_threshold`` is a
    score of that mode, and the OpenAPI schema says so."""
    return LogitRerankRequest if score_mode == "logit" else RerankRequest


class RerankResult(BaseModel):
    index: int
    """Position of the document in the request."""
    relevance_score: float
    """The score under the server's score mode: the positive label's probability, in [0, 1], or its
    raw logit (any finite number) for a server in ``logit`` mode."""
    window: tuple[int, int] | None = None
    """The reported window's character span, when the server chunks long documents."""
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ApiVersion(BaseModel):
    version: str
    """``"2"`` on ``/v2/rerank``, ``"1"`` on ``/v1/rerank`` and ``/rerank``."""
    is_experimental: bool = False


class BilledUnits(BaseModel):
    search_units: int
    """1 per request: Cohere bills one search unit per query (with up to 100 documents, where its
    hosted models count each ~500-token chunk of a longer document as one); genscore scores each
    document as one prompt and answers one query per request."""


class MetaTokens(BaseModel):
    input_tokens: int
    """Prompt tokens scored (the same count as ``usage.prompt_tokens``)."""
    output_tokens: int = 0


class RerankMeta(BaseModel):
    """Cohere's ``meta``: where Cohere's clients and litellm read the usage of a rerank call."""

    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: MetaTokens


class RerankResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"rerank-{uuid.uuid4().hex[:16]}")
    model: str
    results: list[RerankResult]
    """Best first; ties keep request order."""
    usage: RerankUsage
    """vLLM's and Jina's usage."""
    meta: RerankMeta | None = None
    """Cohere's usage."""
    score_mode: ScoreMode | None = None
    """The server's score mode, which made ``relevance_score`` (a genscore extension): genscore's
    clients refuse an answer of a mode other than theirs."""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "genscore"
    root: str
    """The model's hub id or folder."""
    max_model_len: int
    """Longest prompt; longer ones are truncated, keeping the template's suffix."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
