"""Remote scoring backends: score through ``genscore serve``, vLLM, SGLang or a ``/v1/rerank`` server.

Use them through the scorer, which still builds prompts (templates, truncation, label ids) locally
and so needs the model's tokenizer, but not its weights::

    scorer = GenerativeScorer("Qwen/Qwen3-Reranker-0.6B", server_url="http://127.0.0.1:8000")

``server_kind`` picks the protocol: ``"genscore"`` and ``"vllm"`` (``/generative_scoring``),
``"sglang"`` (``/v1/score``) or ``"rerank"`` (``/v1/rerank``, text only: it sends the texts each
:class:`~genscore_core.backend.ScoringJob` carries, and refuses raw protocol jobs, which have none).
Every client implements :class:`~genscore_core.backend.ScoringBackend`. The HTTP clients need
``httpx`` (``pip install "genscore[remote]"``) and are imported only when a backend is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from genscore_core.backend import ScoringBackend
from genscore_core.config import SERVER_KINDS, ServerKind
from genscore_core.errors import RemoteConfigurationError, RemoteScoringError

if TYPE_CHECKING:
    from genscore_core.config import ServerSettings

__all__ = [
    "SERVER_KINDS",
    "RemoteConfigurationError",
    "RemoteScoringError",
    "ServerKind",
    "make_backend",
    "model_limits",
]


def make_backend(server: ServerSettings, **transport_options: Any) -> ScoringBackend:
    """The client of ``server.url`` for ``server.kind``.

    ``transport_options`` go to :class:`~genscore_core.remote.transport.HttpTransport` (``backoff``,
    ``max_backoff``, test transports).
    """
    from genscore_core.remote.transport import HttpTransport

    api_key = server.api_key.get_secret_value() if server.api_key is not None else None
    http = HttpTransport(
        server.url,
        timeout=server.timeout,
        max_retries=server.max_retries,
        api_key=api_key,
        **transport_options,
    )
    options: dict[str, Any] = {"model": server.model, "batch_size": server.batch_size}
    if server.kind in ("genscore", "vllm"):
        from genscore_core.remote.generative import GenerativeScoringClient

        return GenerativeScoringClient(http, kind=server.kind, **options)
    if server.kind == "sglang":
        from genscore_core.remote.sglang import SGLangScoreClient

        return SGLangScoreClient(http, **options)
    from genscore_core.remote.rerank import RerankClient

    return RerankClient(http, **options)


def model_limits(name_or_path: str, tokenizer: Any, *, trust_remote_code: bool = False) -> tuple[int, int]:
    """``(vocab_size, max_length)`` of a model whose weights stay on the server.

    Read from the model's ``config.json`` when it can be loaded (the vocabulary of the LM head is
    often larger than the tokenizer's), else from the tokenizer.
    """
    vocab_size = len(tokenizer)
    max_length = getattr(tokenizer, "model_max_length", None)
    try:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        model_config = None
    if model_config is not None:
        text_config = getattr(model_config, "get_text_config", lambda: model_config)()
        vocab_size = int(getattr(text_config, "vocab_size", None) or vocab_size)
        positions = getattr(text_config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            max_length = positions
    # Tokenizers without a limit report a huge sentinel (1e30).
    if not isinstance(max_length, int) or not 0 < max_length < 10**9:
        raise ValueError(f"cannot tell the maximum length of {name_or_path!r}; pass max_length explicitly")
    return vocab_size, max_length
