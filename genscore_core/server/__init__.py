"""``genscore serve``: the generative scoring protocol, a ``/v1/rerank`` endpoint and dynamic batching.

Needs the server extra: ``pip install "genscore[server]"``; without it, importing :func:`create_app`
raises an ImportError that says so. (The package itself imports without it, so that the ``genscore``
command line can list ``serve``.)

Example:
    >>> from genscore_core import GenerativeScorer  # doctest: +SKIP
    >>> from genscore_core.server import ServerLimits, create_app  # doctest: +SKIP
    >>> limits = ServerLimits(max_items_per_request=256)  # doctest: +SKIP
    >>> app = create_app(GenerativeScorer("Qwen/Qwen3-Reranker-0.6B"), limits)  # doctest: +SKIP
    >>> from genscore_core.server.connections import uvicorn_options  # doctest: +SKIP
    >>> import uvicorn; uvicorn.run(app, host="127.0.0.1", port=8000, **uvicorn_options(limits))  # doctest: +SKIP

``uvicorn_options`` applies the limits' connection settings as ``genscore serve`` does (the
connection limit, the header and keep-alive timeouts); without it uvicorn's defaults apply.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from genscore_core.errors import ServerBusyError
from genscore_core.server.limits import ServerLimits

if TYPE_CHECKING:
    from genscore_core.server.app import create_app
    from genscore_core.server.batcher import BatchStats, RequestBatcher

__all__ = ["BatchStats", "RequestBatcher", "ServerBusyError", "ServerLimits", "create_app"]

# Imported on first use: the command line imports this package and should stay light.
_LAZY = {
    "create_app": "genscore_core.server.app",
    "BatchStats": "genscore_core.server.batcher",
    "RequestBatcher": "genscore_core.server.batcher",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
