"""What one server accepts and how it batches: every limit is a setting, and exceeding one is a 4xx."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServerLimits(BaseModel):
    """Request limits and batching settings of ``genscore serve``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_items_per_request: int = Field(default=1024, gt=0)
    """Most items (``/generative_scoring``) or documents (``/v1/rerank``) in one request; more is a 400."""
    max_prompt_tokens_per_request: int = Field(default=262_144, gt=0)
    """Most prompt tokens of one request, all items together, after templating and truncation; more
    is a 400. Each prompt is also cut to the scorer's ``max_length``."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    """Largest request body; more is a 413, answered before the body is parsed."""
    batch_max_tokens: int = Field(default=262_144, gt=0)
    """Prompt tokens gathered from concurrent requests into one engine call (one request larger than
    this runs alone). The engine splits a call into forward batches of its own budget, so this bounds
    a call's latency, not memory: 28 requests of 20 prompts of 460 tokens fill one call."""
    batch_max_wait_ms: float = Field(default=2.0, ge=0)
    """How long the first request of a call waits for others while the call is under
    ``batch_max_tokens``; 0 takes only what is already queued. A long wait asks for full calls."""
    batch_wait: Literal["tokenizing", "always"] = "tokenizing"
    """When a short queue waits (up to ``batch_max_wait_ms``) for more requests: only while others are
    being tokenized, so that a lone request starts at once (``"tokenizing"``), or always
    (``"always"``: with a long ``batch_max_wait_ms``, calls that wait until ``batch_max_tokens`` is full)."""
    batch_max_waited: int = Field(default=2, ge=1)
    """Engine calls a request may see run while it is queued; the next call takes it whatever
    ``batch_max_tokens`` says, so no request waits behind more calls than this."""
    forward_batch_tokens: int = Field(default=0, ge=0)
    """With a local engine, each call of several requests runs as forward batches filled to this
    many tokens (the last holds the rest), so that their shapes repeat from call to call and replay
    CUDA graphs; 0: the engine's own batches, balanced in size, which differ every call and run
    eagerly. Off by default: not measured faster yet (docs/benchmarks.md, "Server batching")."""
    max_queued_requests: int = Field(default=4096, gt=0)
    """Requests waiting to be scored; beyond this new ones get a 503 (with ``Retry-After``)."""
    max_connections: int = Field(default=512, gt=0)
    """Requests served at once (one per connection); a request beyond this gets a 503 with
    ``Retry-After`` and its connection is closed, while the first ones are served. Idle connections do
    not count, but open connections are capped at twice this: at the cap the connection idle longest
    is closed (or, none idle, the new one is answered 503), so slow or idle clients neither hold every
    file descriptor the process has (commonly 1,024) nor starve active ones."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a connection may take to send a whole request head, from opening or from the first byte
    of a later request; slower ones are closed (a client trickling headers holds a connection
    otherwise forever)."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a request may take to send its whole body, from the end of its head; a slower one is
    answered 408 and its connection closed (a client stalling mid-body holds a connection otherwise
    forever, and enough of them take every connection the server allows)."""
    keep_alive_timeout_s: int = Field(default=75, gt=0)
    """Seconds an idle keep-alive connection is kept open between requests. Longer than the idle
    expiry of the usual clients' connection pools (httpx and the OpenAI SDK 5 s, aiohttp 15 s, an
    nginx upstream pool 60 s), so that the client drops an idle connection first: a server that closes
    it first races the client's next request on it, which then fails with a reset connection."""
