"""The ``genscore`` command line: rerank documents, serve a model over HTTP, make an offline test model.

Exit codes: 0 success; 2 bad input or a setting that cannot work (an unreadable file, a bad document,
``--model`` naming no folder, a server answering 401/403/404); 3 a scoring server that could not be
reached or kept failing (worth retrying later, nothing to fix in the input).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from genscore_core.cli_args import add_config_arguments, config_settings, flag_of, positive_int
from genscore_core.errors import GenScoreError, RemoteScoringError
from genscore_core.jobs.cli import add_score_command
from genscore_core.server.cli import add_serve_command

EXIT_BAD_INPUT = 2
EXIT_SERVER_UNAVAILABLE = 3
# What a shell reports for a process ended by SIGINT and SIGPIPE.
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
# Flags kept from before the scorer flags were generated from the config.
SCORER_FLAG_ALIASES = {"max_batch_tokens": ["--batch-tokens"]}
# Keys the output writes itself; a document field of the same name would be lost.
_RESERVED_FIELDS = ("index", "score", "truncated")
# Show a progress bar only when scoring takes long enough to need one.
_PROGRESS_MIN_DOCUMENTS = 32


class InputError(Exception):
    """Bad command-line input: reported on one line, exit code 2."""


def is_utf8_text(text: str) -> bool:
    """False for text holding lone surrogates: what Python makes of bytes that are not UTF-8 in
    ``argv`` (and, under the C/POSIX locale, on stdin)."""
    return not any("\ud800" <= char <= "\udfff" for char in text)


def read_documents(stream: TextIO, source: str) -> list[dict[str, Any]]:
    """Documents from JSON lines (objects with a ``text`` field), a JSON array, or plain text lines.

    The format is decided by the first non-blank line: ``{`` means JSON lines, ``[`` one JSON array
    (of strings or of objects with a ``text`` field). Blank lines separate nothing and are skipped.
    A UTF-8 byte-order mark at the start is not part of the text.
    """
    documents: list[dict[str, Any]] = []
    json_lines: bool | None = None
    for number, raw in enumerate(stream, start=1):
        line = raw.rstrip("\r\n")
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        if json_lines is None:
            if line.lstrip().startswith("["):
                return _json_array(line + "\n" + stream.read(), source)
            json_lines = line.lstrip().startswith("{")
        if not json_lines:
            documents.append({"text": line})
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{source}, line {number}: invalid JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"{source}, line {number}: expected a JSON object with a string 'text' field")
        _check_fields(record, f"{source}, line {number}")
        documents.append(record)
    if not documents:
        raise InputError(f"{source}: no documents to rerank")
    return documents


def _check_fields(record: dict[str, Any], where: str) -> None:
    clash = [key for key in _RESERVED_FIELDS if key in record]
    if clash:
        raise InputError(f"{where}: field {clash[0]!r} is reserved for the output; rename it")


def _json_array(text: str, source: str) -> list[dict[str, Any]]:
    try:
        array = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{source}: starts with '[' but is not one JSON array (line {error.lineno}: {error.msg})"
        ) from None
    documents: list[dict[str, Any]] = []
    for position, element in enumerate(array):
        if isinstance(element, str):
            documents.append({"text": element})
        elif isinstance(element, dict) and isinstance(element.get("text"), str):
            _check_fields(element, f"{source}, element {position}")
            documents.append(element)
        else:
            raise InputError(
                f"{source}, element {position}: expected a string or an object with a string 'text' field"
            )
    if not documents:
        raise InputError(f"{source}: no documents to rerank")
    return documents


def _open_documents(path: str | None) -> tuple[TextIO, str]:
    # Strict UTF-8 whatever the locale: under C/POSIX, Python decodes stdin with surrogateescape,
    # which turns each invalid byte into a lone surrogate that no tokenizer can encode.
    if path is None or path == "-":
        if isinstance(sys.stdin, io.TextIOWrapper):
            sys.stdin.reconfigure(encoding="utf-8", errors="strict")
        return sys.stdin, "stdin"
    try:
        return open(path, encoding="utf-8", errors="strict"), path  # closed by the caller
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None


def _rerank(args: argparse.Namespace) -> int:
    if not is_utf8_text(args.query):
        raise InputError("--query is not UTF-8 text")
    stream, source = _open_documents(args.documents)
    try:
        documents = read_documents(stream, source)
    except UnicodeDecodeError:
        raise InputError(f"{source}: not UTF-8 text") from None
    finally:
        if stream is not sys.stdin:
            stream.close()

    from genscore_core.scorer import GenerativeScorer

    settings = config_settings(args)
    settings["show_progress"] = not args.no_progress and len(documents) >= _PROGRESS_MIN_DOCUMENTS
    args.progress_bar = settings["show_progress"]
    with GenerativeScorer(**settings) as scorer:
        ranked = scorer.rerank(args.query, [doc["text"] for doc in documents], top_n=args.top_n)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(encoding="utf-8")  # JSON lines are UTF-8 whatever the locale
    for result in ranked:
        record = {"index": result.index, "score": result.score, "truncated": result.truncated}
        record.update(documents[result.index])
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from genscore_core.testing.tiny_model import RANDOM_WEIGHTS_NOTICE, make_tiny_model

    try:
        path = make_tiny_model(Path(args.output_dir), seed=args.seed)
    except ImportError as error:  # the testing extra is not installed
        raise InputError(str(error)) from None
    print(f"wrote {path}", file=sys.stderr)
    print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    return 0


def _make_demo_model(args: argparse.Namespace) -> int:
    from genscore_core.testing.demo_model import DEMO_MODEL_NOTICE, holds_demo_model, make_demo_model

    out = Path(args.output_dir)
    if not args.force and holds_demo_model(out, train_steps=args.train_steps, seed=args.seed):
        # Re-running a documented command must not fail, nor spend a minute writing the same weights.
        print(f"{out} already holds the demo model (same seed and steps); kept it", file=sys.stderr)
        return 0
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} is not empty; pass --force to write the demo model into it anyway")
    try:
        path = make_demo_model(out, train_steps=args.train_steps, seed=args.seed)
    except ImportError as error:  # the testing extra is not installed
        raise InputError(str(error)) from None
    print(f"wrote {path}", file=sys.stderr)
    print(DEMO_MODEL_NOTICE, file=sys.stderr)
    return 0


def _version() -> str:
    # From the installed metadata: importing genscore_core would pull in torch before --help is printed.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("genscore")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genscore", description="Rerank documents by a causal LM's next-token label probabilities."
    )
    parser.add_argument("--version", action="version", version=f"genscore {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    rerank = commands.add_parser(
        "rerank",
        help="rerank documents for a query; JSON lines out, best first",
        description="Documents come from FILE or stdin, as JSON lines with a 'text' field (other fields "
        "are carried along) or as plain text lines.",
    )
    rerank.add_argument("--query", required=True)
    rerank.add_argument("--documents", metavar="FILE", help="input file; stdin when absent or '-'")
    rerank.add_argument("--top-n", type=positive_int, help="print only the best N")
    rerank.add_argument(
        "--no-progress",
        action="store_true",
        help=f"no progress bar on stderr (otherwise shown from {_PROGRESS_MIN_DOCUMENTS} documents on)",
    )
    # The progress bar is decided above, by --no-progress and the number of documents.
    add_config_arguments(rerank, exclude={"show_progress"}, aliases=SCORER_FLAG_ALIASES)
    rerank.set_defaults(handler=_rerank)

    tiny = commands.add_parser(
        "make-tiny-model",
        help="write a small RANDOM-weight Qwen3 with the real Qwen3 tokenizer, for offline runs",
    )
    tiny.add_argument("output_dir", metavar="DIR")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(handler=_make_tiny_model)

    demo = commands.add_parser(
        "make-demo-model",
        help="write a small Qwen3 reranker that ranks by word overlap (real Qwen3 tokenizer), for offline demos",
        description="Wires and trains (seconds to a few minutes on a CPU) a 3-layer Qwen3 that scores a "
        "document by the share of its content words found in the query, through the Qwen3-Reranker "
        "template. Deterministic for a given seed.",
    )
    demo.add_argument("output_dir", metavar="DIR", help="folder to write the model and tokenizer to")
    demo.add_argument(
        "--seed", type=int, default=0, help="seed of the token codes and training data (default 0)"
    )
    demo.add_argument(
        "--train-steps", type=int, default=100, help="AdamW steps fitting the free parameters (default 100)"
    )
    demo.add_argument("--force", action="store_true", help="write into a non-empty folder")
    demo.set_defaults(handler=_make_demo_model)

    add_serve_command(commands, scorer_flag_aliases=SCORER_FLAG_ALIASES)
    add_score_command(commands, scorer_flag_aliases=SCORER_FLAG_ALIASES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        # One line, at once: exiting normally would wait for worker threads to finish their batch.
        # A progress bar interrupted mid-line is left without its newline.
        start = "\n" if getattr(args, "progress_bar", False) else ""
        _quietly(lambda: print(f"{start}genscore: interrupted", file=sys.stderr, flush=True))
        _quietly(sys.stdout.flush)
        os._exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (``genscore rerank ... | head -1``): nothing left to say to it.
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except RemoteScoringError as error:
        return _fail(str(error), EXIT_SERVER_UNAVAILABLE)
    except ValidationError as error:
        return _fail(describe_settings_error(error), EXIT_BAD_INPUT)
    except (InputError, GenScoreError, ValueError) as error:  # bad input, or a setting that cannot work
        return _fail(str(error), EXIT_BAD_INPUT)
    return code


def _quietly(action: Any) -> None:
    try:
        action()
    except (OSError, ValueError):
        pass


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _fail(message: str, code: int) -> int:
    """Report on one line: an error message is read in a terminal or a CI log, not a traceback."""
    print(f"genscore: error: {' '.join(message.split())}", file=sys.stderr)
    return code


def describe_settings_error(error: ValidationError) -> str:
    """A pydantic error about scorer settings, in the command line's words (flags, not field names)."""
    parts = []
    for entry in error.errors():
        location = entry.get("loc", ())
        where = flag_of(str(location[0])) if location else "settings"
        parts.append(f"{where}: {entry.get('msg', 'invalid')}")
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
