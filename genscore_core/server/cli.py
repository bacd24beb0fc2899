"""The ``genscore serve`` subcommand: arguments, and running the app on uvicorn.

Kept free of fastapi and uvicorn imports, so the command line works without the server extra
until ``serve`` is actually run.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genscore_core.cli_args import (
    add_config_arguments,
    argument_type,
    config_settings,
    flag_of,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from genscore_core.errors import ConfigurationError
from genscore_core.server.limits import ServerLimits
from genscore_core.server.schemas import api_key_problem


@dataclass(frozen=True)
class _LimitFlag:
    """A ``genscore serve`` flag that sets a :class:`ServerLimits` field, whose default it shows."""

    field: str
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] = ()


# Flag (without its dashes, underscored) -> the limit it sets, by help group, in --help's order.
_LIMIT_GROUPS: dict[str, dict[str, _LimitFlag]] = {
    "request limits and batching": {
        "max_items": _LimitFlag("max_items_per_request", "most items or documents per request", positive_int),
        "max_prompt_tokens": _LimitFlag(
            "max_prompt_tokens_per_request",
            "most prompt tokens per request, all items together",
            positive_int,
        ),
        "max_body_bytes": _LimitFlag("max_body_bytes", "largest request body", positive_int),
        "batch_max_tokens": _LimitFlag(
            "batch_max_tokens", "prompt tokens of concurrent requests scored in one engine call", positive_int
        ),
        "batch_max_wait_ms": _LimitFlag(
            "batch_max_wait_ms", "how long a request waits for others to batch with", non_negative_float
        ),
        "batch_wait": _LimitFlag(
            "batch_wait",
            "when a short queue waits --batch-max-wait-ms for more requests: only while others are being "
            "tokenized, so a lone request starts at once (tokenizing), or always",
            choices=("tokenizing", "always"),
        ),
        "batch_max_waited": _LimitFlag(
            "batch_max_waited",
            "engine calls a queued request may see run before it is taken, whatever the token budget",
            positive_int,
        ),
        "forward_batch_tokens": _LimitFlag(
            "forward_batch_tokens",
            "run each engine call of several requests as forward batches filled to this many tokens, so "
            "their shapes repeat and replay CUDA graphs; 0: the engine's balanced batches",
            non_negative_int,
        ),
        "max_queued_requests": _LimitFlag(
            "max_queued_requests", "requests allowed to wait; more get 503", positive_int
        ),
    },
    "connections": {
        "max_connections": _LimitFlag(
            "max_connections",
            "requests served at once (idle connections not counted); more get 503",
            positive_int,
        ),
        "header_timeout": _LimitFlag(
            "header_timeout_s",
            "seconds a client may take to send a request's headers, from connecting or from the request's "
            "first byte; slower ones are disconnected",
            positive_float,
        ),
        "body_timeout": _LimitFlag(
            "body_timeout_s",
            "seconds a client may take to send a request's body, from the end of its headers; slower ones "
            "are answered 408 and disconnected",
            positive_float,
        ),
        "keep_alive_timeout": _LimitFlag(
            "keep_alive_timeout_s",
            "seconds an idle keep-alive connection stays open; keep it above the idle expiry of clients' "
            "and proxies' pools",
            positive_int,
        ),
    },
}
_LIMIT_FLAGS = {flag: limit.field for group in _LIMIT_GROUPS.values() for flag, limit in group.items()}


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The :class:`ServerLimits` that ``genscore serve``'s parsed arguments ask for."""
    return ServerLimits(**{field: getattr(args, flag) for flag, field in _LIMIT_FLAGS.items()})


_port = argument_type(int, "a port number (1-65535)", lambda value: 1 <= value <= 65535)


# An empty host (a variable that expanded to nothing) was refused only after the settings were
# checked, as "cannot listen on  port 8000: name or service not known".
def _host(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected an address or host name, got an empty one")
    return text.strip()


def add_serve_command(
    commands: Any, *, scorer_flag_aliases: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Add ``serve`` to the subcommands of the ``genscore`` parser.

    The scorer flags are generated from :class:`~genscore_core.ScorerConfig`, as ``genscore rerank``'s
    are; ``--model`` is required here.
    """
    defaults = ServerLimits()
    serve = commands.add_parser(
        "serve",
        help="serve generative scoring and /v1/rerank over HTTP, batching concurrent requests",
        description="Serve one model: POST /generative_scoring (/generative_score), /v1/rerank; "
        "GET /health, /v1/models, /stats, /metrics. Listens on loopback unless --host says otherwise.",
    )
    serve.add_argument(
        "--host", type=_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    serve.add_argument("--port", type=_port, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--served-model-name", help="model name in responses (default: --model)")
    serve.add_argument(
        "--api-key",
        help=f"require every request but GET /health to send Authorization: Bearer <key>; "
        f"{API_KEY_ENV} gives it without showing it in the process list (this flag wins over it)",
    )
    # A server shows no progress bar; everything else a scorer takes is a flag.
    add_config_arguments(serve, exclude={"show_progress"}, required={"model"}, aliases=scorer_flag_aliases)
    for title, flags in _LIMIT_GROUPS.items():
        group = serve.add_argument_group(title)
        for flag, limit in flags.items():
            kind: dict[str, Any] = {"choices": limit.choices} if limit.choices else {"type": limit.parse}
            group.add_argument(
                flag_of(flag),
                default=getattr(defaults, limit.field),
                help=f"{limit.help} (default %(default)s)",
                **kind,
            )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="least severe server log messages shown (default %(default)s)",
    )
    serve.set_defaults(handler=run_serve)


API_KEY_ENV = "GENSCORE_API_KEY"
"""The environment variable giving ``genscore serve`` its API key when ``--api-key`` does not."""


def api_key_setting(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The API key the server requires: ``--api-key``, else :data:`API_KEY_ENV`, else None.

    The flag wins, as vLLM's ``--api-key`` wins over ``VLLM_API_KEY``. A key that is set but empty,
    or that cannot travel in an HTTP header, is a :class:`ConfigurationError`: serving without a key
    because a variable expanded to nothing would open the server without a word.
    """
    from_flag: str | None = args.api_key
    key, source = (
        (from_flag, "--api-key") if from_flag is not None else (environ.get(API_KEY_ENV), API_KEY_ENV)
    )
    if key is None:
        return None
    if not key:
        raise ConfigurationError(
            f"{source} is set but empty; give the key, or unset it to serve without one", setting="api_key"
        )
    problem = api_key_problem(key)
    if problem is not None:
        raise ConfigurationError(f"{source}: {problem}", setting="api_key")
    return key


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """What to tell the operator of a server open to anyone on the network: one off loopback
    without an API key; None otherwise."""
    if _is_loopback(host) or api_key is not None:
        return None
    return (
        f"listening on {host}: anyone who can reach port {port} can use the model; "
        f"require a key (--api-key or {API_KEY_ENV}) or put it behind a proxy or firewall"
    )


def check_can_listen(host: str, port: int) -> None:
    """Raise :class:`ConfigurationError` unless ``host:port`` can be bound now.

    Checked before the model loads (minutes, for a large one): uvicorn binds only after, and a port
    in use then ended the command with uvicorn's exit code 3, which ``genscore`` uses for an
    unreachable scoring server. Each address the host resolves to is bound as asyncio binds it
    (address reuse, IPv6 only on IPv6), then released for uvicorn.
    """
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise ConfigurationError(
            f"cannot listen on {host} port {port}: {reason} (--host, --port)", setting="port"
        ) from None


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from genscore_core.server.app import create_app
    except ImportError as error:
        # Name the extra whichever of its packages is missing (uvicorn's own error names only itself).
        print(
            f"genscore: error: genscore serve needs the server extra ({error}); install it with: "
            'pip install "genscore[server]"',
            file=sys.stderr,
        )
        return 2
    from genscore_core.scorer import GenerativeScorer

    limits = server_limits(args)
    api_key = api_key_setting(args, os.environ)
    check_can_listen(args.host, args.port)
    scorer = GenerativeScorer(**config_settings(args))
    app = create_app(scorer, limits, served_model_name=args.served_model_name, api_key=api_key)
    warning = exposure_warning(args.host, args.port, api_key)
    if warning is not None:
        print(f"genscore: {warning}", file=sys.stderr)
    from genscore_core.server.connections import uvicorn_options

    freeze_startup_objects()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **uvicorn_options(limits))
    return 0


def freeze_startup_objects() -> int:
    """Take every object alive now (the model, the tokenizer, the libraries) out of the garbage
    collector's reach, as vLLM does once its engine is loaded; returns how many were frozen.

    A loaded scorer holds some hundreds of thousands of tracked objects that live as long as the
    server; every full collection would walk them all again (about half a second) on the thread
    running the event loop, stalling every connection. Frozen, a collection walks only what
    serving has created since. Garbage is collected first, so none of it is kept forever.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
