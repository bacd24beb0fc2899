"""The ``genscore`` command line: rerank documents, serve a model over HTTP, make an offline test model.

Exit codes: 0 success; 2 bad input or a setting that cannot work (an unreadable file, a bad document,
``--model`` naming no folder, a server answering 401/403/404); 3 a scoring server that could not be
reached or kept failing (worth retrying later, nothing to fix in the input).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import ValidationError

from genscore_core import strict_json
from genscore_core.cli_args import (
    add_config_arguments,
    argument_type,
    config_settings,
    flag_of,
    non_negative_int,
    positive_int,
)
from genscore_core.config import ScorerConfig
from genscore_core.errors import GenScoreError, InvalidRequestError, RemoteScoringError
from genscore_core.jobs.cli import add_score_command
from genscore_core.protocol import check_text
from genscore_core.server.cli import add_serve_command

if TYPE_CHECKING:
    from genscore_core.results import RankedResults
    from genscore_core.scorer import GenerativeScorer

EXIT_BAD_INPUT = 2
EXIT_SERVER_UNAVAILABLE = 3
# What a shell reports for a process ended by SIGINT and SIGPIPE.
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
# Flags kept from before the scorer flags were generated from the config.
SCORER_FLAG_ALIASES = {"max_batch_tokens": ["--batch-tokens"]}
# Keys the output writes itself; a document field of the same name would be lost.
_RESERVED_FIELDS = ("index", "score", "truncated", "query_index", "query_id")
# Show a progress bar only when scoring takes long enough to need one.
_PROGRESS_MIN_DOCUMENTS = 32
# With a bar, documents are scored in slices so that it moves at least this many times: one engine
# call advances it only when a whole batch is done, and one batch can hold every document of a run.
_PROGRESS_STEPS = 100
# ...but never in slices so small that the batches stop being worth a model call.
_PROGRESS_MIN_SLICE = 8
INPUT_FORMATS = ("auto", "text", "jsonl", "json")


class InputError(Exception):
    """Bad command-line input: reported on one line, exit code 2."""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def is_utf8_text(text: str) -> bool:
    """False for text holding lone surrogates: what Python makes of bytes that are not UTF-8 in
    ``argv``, and in the input files, which are read with ``surrogateescape``."""
    return _LONE_SURROGATE.search(text) is None


def loads_standard_json(text: str) -> Any:
    """One JSON value of the input, held to standard JSON (:func:`genscore_core.strict_json.loads`).
    Raises :class:`json.JSONDecodeError`, or :class:`~genscore_core.strict_json.StrictJSONError`."""
    return strict_json.loads(text)


def _parsed_line(line: str, where: str) -> Any:
    """One JSON line, or :class:`InputError` saying where and what is wrong with it."""
    try:
        return loads_standard_json(line)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: invalid JSON ({error.msg})") from None
    except strict_json.StrictJSONError as error:
        raise InputError(f"{where}: {error}") from None


def _check_utf8_line(line: str, where: str) -> None:
    # The input is decoded with surrogateescape: each byte that is not UTF-8 became a lone surrogate.
    if not is_utf8_text(line):
        raise InputError(f"{where}: not UTF-8 text")


def read_documents(stream: TextIO, source: str, input_format: str = "auto") -> list[dict[str, Any]]:
    """Documents from JSON lines (objects with a ``text`` field), a JSON array, or plain text lines.

    ``input_format`` is one of :data:`INPUT_FORMATS`. ``"auto"`` decides by the first non-blank line:
    ``{`` means JSON lines, ``[`` one JSON array (of strings or of objects with a ``text`` field),
    anything else plain text. ``"text"`` reads every line as a document, even one that starts with
    ``{``. Blank lines separate nothing and are skipped. A UTF-8 byte-order mark at the start is not
    part of the text.
    """
    return _read_documents(stream, source, input_format)[0]


def _read_documents(
    stream: TextIO, source: str, input_format: str
) -> tuple[list[dict[str, Any]], list[int] | None]:
    """:func:`read_documents`, and the line of each document where each is a line of its own."""
    if input_format == "json":
        return _json_array(stream.read().removeprefix("\ufeff"), source, detected=False), None
    documents: list[dict[str, Any]] = []
    lines: list[int] = []
    json_lines: bool | None = {"text": False, "jsonl": True}.get(input_format)
    for number, raw in enumerate(stream, start=1):
        line = raw.rstrip("\r\n")
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        if json_lines is None:
            if line.lstrip().startswith("["):
                return _json_array(line + "\n" + stream.read(), source, first_line=number), None
            json_lines = line.lstrip().startswith("{")
        _check_utf8_line(line, f"{source}, line {number}")
        lines.append(number)
        if not json_lines:
            documents.append({"text": line})
            continue
        record = _parsed_line(line, f"{source}, line {number}")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"{source}, line {number}: expected a JSON object with a string 'text' field")
        _check_fields(record, f"{source}, line {number}")
        _check_document_text(record["text"], f"{source}, line {number}")
        documents.append(record)
    if not documents:
        raise InputError(f"{source}: no documents to rerank")
    return documents, lines


@dataclass
class QueryRecord:
    """One query of a ``--queries`` file and its documents (each a dict with a ``text`` field)."""

    query: str
    documents: list[dict[str, Any]]
    id: Any = None
    where: str = ""
    """Where the query is (a file and line), for error messages."""
    lines: list[int] | None = None
    """The line of each document in ``source``, where each document is a line of its own."""
    source: str = ""


_QUERY_KEYS = ("query", "documents", "id")


def read_queries(stream: TextIO, source: str) -> list[QueryRecord]:
    """Queries from JSON lines: ``{"query": "...", "documents": [...], "id": ...}`` per line.

    ``documents`` holds strings or objects with a string ``text`` field (other fields are carried to
    the output); ``id`` is optional and written as ``query_id``. Blank lines are skipped.
    """
    records: list[QueryRecord] = []
    for number, raw in enumerate(stream, start=1):
        line = raw.rstrip("\r\n")
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        _check_utf8_line(line, where)
        record = _parsed_line(line, where)
        if not isinstance(record, dict):
            raise InputError(f'{where}: expected a JSON object {{"query": ..., "documents": [...]}}')
        unknown = [key for key in record if key not in _QUERY_KEYS]
        if unknown:
            raise InputError(
                f"{where}: unknown field {unknown[0]!r}; a query line has 'query', 'documents' and "
                "optionally 'id'"
            )
        query = record.get("query")
        if not isinstance(query, str):
            raise InputError(f"{where}: expected a string 'query' field")
        if not is_utf8_text(query):
            raise InputError(f"{where}: the query is not UTF-8 text")
        documents = record.get("documents")
        if not isinstance(documents, list) or not documents:
            raise InputError(f"{where}: expected a non-empty 'documents' array")
        records.append(QueryRecord(query, _documents_of(documents, where), record.get("id"), where))
    if not records:
        raise InputError(f"{source}: no queries to rerank for")
    return records


def _check_fields(record: dict[str, Any], where: str) -> None:
    clash = [key for key in _RESERVED_FIELDS if key in record]
    if clash:
        raise InputError(f"{where}: field {clash[0]!r} is reserved for the output; rename it")


def _json_array(text: str, source: str, detected: bool = True, first_line: int = 1) -> list[dict[str, Any]]:
    """The documents of one JSON array; ``text`` starts at line ``first_line`` of ``source``."""
    not_utf8 = _LONE_SURROGATE.search(text)
    if not_utf8 is not None:
        line = first_line + text.count("\n", 0, not_utf8.start())
        raise InputError(f"{source}, line {line}: not UTF-8 text")
    try:
        array = loads_standard_json(text)
    except json.JSONDecodeError as error:
        what = "starts with '[' but is not" if detected else "is not"
        line = first_line + error.lineno - 1
        raise InputError(f"{source}: {what} one JSON array (line {line}: {error.msg})") from None
    except strict_json.StrictJSONError as error:
        raise InputError(f"{source}: {error}") from None
    if not isinstance(array, list):
        raise InputError(f"{source}: expected one JSON array of documents")
    documents = _documents_of(array, source)
    if not documents:
        raise InputError(f"{source}: no documents to rerank")
    return documents


def _check_document_text(text: str, where: str) -> None:
    # A JSON \ud800 escape passes the UTF-8 check of the line: refused here, where its line is
    # known, since the scorer can name it only by its place among the pairs the command made.
    try:
        check_text(text, "document", where="the document")
    except InvalidRequestError as error:
        raise InputError(f"{where}: {error.message}") from None


def _documents_of(array: list[Any], where: str) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for position, element in enumerate(array):
        if isinstance(element, str):
            _check_document_text(element, f"{where}, element {position}")
            documents.append({"text": element})
        elif isinstance(element, dict) and isinstance(element.get("text"), str):
            _check_fields(element, f"{where}, element {position}")
            _check_document_text(element["text"], f"{where}, element {position}")
            documents.append(element)
        else:
            raise InputError(
                f"{where}, element {position}: expected a string or an object with a string 'text' field"
            )
    return documents


def _open_documents(path: str | None) -> tuple[TextIO, str]:
    # UTF-8 whatever the locale, with surrogateescape: each byte that is not UTF-8 becomes a lone
    # surrogate, which the readers find and report with its line (a strict decoder fails on a block
    # of the file, with no line to name).
    if path is None or path == "-":
        if isinstance(sys.stdin, io.TextIOWrapper):
            sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
        return sys.stdin, "stdin"
    try:
        return open(path, encoding="utf-8", errors="surrogateescape"), path  # closed by the caller
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None


def _rerank(args: argparse.Namespace) -> int:
    multi = args.queries is not None
    if multi and args.format not in ("auto", "jsonl"):
        raise InputError(f"--queries files are JSON lines; --format {args.format} applies to --documents")
    if multi and args.documents is not None:
        raise InputError("--documents goes with --query; a --queries file holds each query's documents")
    if not multi and not is_utf8_text(args.query):
        raise InputError("--query is not UTF-8 text")
    stream, source = _open_documents(args.queries if multi else args.documents)
    try:
        if multi:
            records = read_queries(stream, source)
        else:
            documents, lines = _read_documents(stream, source, args.format)
            records = [QueryRecord(args.query, documents, lines=lines, source=source)]
    except UnicodeDecodeError:
        raise InputError(f"{source}: not UTF-8 text") from None
    finally:
        if stream is not sys.stdin:
            stream.close()

    from genscore_core.scorer import GenerativeScorer

    total = sum(len(record.documents) for record in records)
    settings = config_settings(args)
    settings["show_progress"] = not args.no_progress and total >= _PROGRESS_MIN_DOCUMENTS
    args.progress_bar = settings["show_progress"]
    with _loaded_scorer(GenerativeScorer, settings) as scorer:  # one load, whatever the number of queries
        rankings = rank_queries(scorer, records, top_n=args.top_n, progress=args.progress_bar)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(encoding="utf-8")  # JSON lines are UTF-8 whatever the locale
    for number, (record, ranked) in enumerate(zip(records, rankings)):
        for result in ranked:
            line: dict[str, Any] = {"query_index": number} if multi else {}
            if multi and record.id is not None:
                line["query_id"] = record.id
            line.update({"index": result.index, "score": result.score, "truncated": result.truncated})
            line.update(record.documents[result.index])
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    out.flush()
    return 0


def _loaded_scorer(build: type[GenerativeScorer], settings: dict[str, Any]) -> GenerativeScorer:
    """The scorer of the command's settings; a model that cannot be loaded is bad input.

    transformers says that a folder holds no weights, or that the hub cannot be reached and the
    model is not in the cache, with an ``OSError``: one line naming ``--model``, not a traceback.
    """
    try:
        return build(**settings)
    except OSError as error:
        model = settings.get("model", ScorerConfig.model_fields["model"].default)
        raise InputError(f"--model {model}: {error}") from None


def rank_queries(
    scorer: GenerativeScorer, records: Sequence[QueryRecord], *, top_n: int | None, progress: bool
) -> list[RankedResults]:
    """Each query's documents best first, all scored by one scorer; a bar on stderr with ``progress``.

    The bar counts documents and shows the rate and the time left. It advances as the engine
    finishes batches; to keep it moving, documents are scored in slices of about 1/100 of the run
    (at least 8 documents), with the batches of a slice spread over its documents.
    """
    from tqdm import tqdm

    from genscore_core.results import rank_results

    owners = [(number, position) for number, r in enumerate(records) for position in range(len(r.documents))]
    pairs = [
        (records[number].query, records[number].documents[position]["text"]) for number, position in owners
    ]
    size = max(_PROGRESS_MIN_SLICE, math.ceil(len(pairs) / _PROGRESS_STEPS)) if progress else len(pairs)
    scored: list[Any] = []
    # mininterval=0: every step is drawn (a hundred or so per run), none is skipped for being quick.
    with tqdm(
        total=len(pairs), disable=not progress, file=sys.stderr, desc="scoring", unit="doc", mininterval=0
    ) as bar:
        for start in range(0, len(pairs), size):
            chunk = pairs[start : start + size]
            try:
                prepared = scorer.prepare_pairs(chunk)
            except InvalidRequestError as error:
                raise InputError(_locate(error, records, owners, start)) from None
            prompts = sum(len(job.prompts) for job in prepared.jobs) or 1
            finished = 0

            def advance(
                count: int, start: int = start, length: int = len(chunk), prompts: int = prompts
            ) -> None:
                # A long document may be several prompts (windows): the bar counts documents.
                nonlocal finished
                finished = min(finished + count, prompts)
                bar.update(start + length * finished // prompts - bar.n)

            scored.extend(prepared.assemble(scorer.backend.score_jobs(prepared.jobs, on_progress=advance)))
            bar.update(start + len(chunk) - bar.n)
    rankings = []
    begin = 0
    for record in records:
        texts = [document["text"] for document in record.documents]
        end = begin + len(texts)
        rankings.append(rank_results(record.query, texts, scored[begin:end], top_n=top_n))
        begin = end
    return rankings


def _locate(
    error: InvalidRequestError, records: Sequence[QueryRecord], owners: list[tuple[int, int]], start: int
) -> str:
    """The engine's complaint about a pair, said with the query line and document it came from."""
    if error.index is None or not 0 <= start + error.index < len(owners):
        return str(error)
    number, position = owners[start + error.index]
    record = records[number]
    if error.param == "query":
        return f"{record.where or '--query'}: the query: {error.message}"
    if record.lines is not None:  # a document of its own line: blank lines make its index differ
        return f"{record.source}, line {record.lines[position]}: {error.message}"
    where = record.where or record.source or "input"
    return f"{where}, element {position}: {error.message}"


def _check_model_folder(out: Path) -> None:
    # Found only when the weights were written otherwise: after a minute or two of training, for
    # the demo model, and then as "File exists".
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; give a folder to write the model into")


def _make_tiny_model(args: argparse.Namespace) -> int:
    from genscore_core.testing.tiny_model import RANDOM_WEIGHTS_NOTICE, make_tiny_model

    out = Path(args.output_dir)
    _check_model_folder(out)
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} is not empty; pass --force to write the tiny model into it anyway")
    try:
        path = make_tiny_model(out, seed=args.seed)
    except ImportError as error:  # the testing extra is not installed
        raise InputError(str(error)) from None
    print(f"wrote {path}", file=sys.stderr)
    print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    return 0


def _make_demo_model(args: argparse.Namespace) -> int:
    from genscore_core.testing.demo_model import DEMO_MODEL_NOTICE, holds_demo_model, make_demo_model

    out = Path(args.output_dir)
    _check_model_folder(out)
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


# The seeds torch.manual_seed takes; a larger one failed after the command had started, as
# "Overflow when unpacking long long".
seed_int = argument_type(int, "an integer from -2**63 to 2**64-1", lambda value: -(2**63) <= value < 2**64)


def build_parser() -> argparse.ArgumentParser:
    # A constant only: the module imports neither torch nor the testing extra's package.
    from genscore_core.testing.demo_model import TRAIN_STEPS as DEMO_TRAIN_STEPS

    parser = argparse.ArgumentParser(
        prog="genscore", description="Rerank documents by a causal LM's next-token label probabilities."
    )
    parser.add_argument("--version", action="version", version=f"genscore {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, help="what to do; genscore COMMAND --help lists its flags"
    )

    rerank = commands.add_parser(
        "rerank",
        help="rerank documents for a query (or for each query of a file); JSON lines out, best first",
        description="One query: --query, with documents from --documents FILE or stdin, as JSON lines "
        "with a 'text' field (other fields are carried along), one JSON array, or plain text lines. "
        'Several queries: --queries FILE, JSON lines of {"query": ..., "documents": [...], "id": ...}; '
        "the model is loaded once for all of them and each output line names its query_index.",
    )
    asked = rerank.add_mutually_exclusive_group(required=True)
    asked.add_argument("--query", help="the query to rank the documents for")
    asked.add_argument(
        "--queries",
        metavar="FILE",
        help='JSON lines of {"query": ..., "documents": [...], "id": ...} (id optional); \'-\' for stdin',
    )
    rerank.add_argument("--documents", metavar="FILE", help="input file; stdin when absent or '-'")
    rerank.add_argument(
        "--format",
        choices=INPUT_FORMATS,
        default="auto",
        help="how --documents is read: text (every line a document, even one starting with '{'), "
        "jsonl (objects with a 'text' field), json (one array), or auto: jsonl when the first line "
        "starts with '{', json with '[', else text (default auto)",
    )
    rerank.add_argument("--top-n", type=positive_int, help="print only the best N (of each query)")
    rerank.add_argument(
        "--no-progress",
        action="store_true",
        help=f"no progress bar on stderr (otherwise shown from {_PROGRESS_MIN_DOCUMENTS} documents on; "
        "it counts documents and shows the time left)",
    )
    # The progress bar is decided above, by --no-progress and the number of documents.
    add_config_arguments(rerank, exclude={"show_progress"}, aliases=SCORER_FLAG_ALIASES)
    rerank.set_defaults(handler=_rerank)

    tiny = commands.add_parser(
        "make-tiny-model",
        help="write a small RANDOM-weight Qwen3 with the real Qwen3 tokenizer, for offline runs",
    )
    tiny.add_argument("output_dir", metavar="DIR", help="folder to write the model and tokenizer to")
    tiny.add_argument("--seed", type=seed_int, default=0, help="seed of the random weights (default 0)")
    tiny.add_argument("--force", action="store_true", help="write into a non-empty folder")
    tiny.set_defaults(handler=_make_tiny_model)

    demo = commands.add_parser(
        "make-demo-model",
        help="write a small Qwen3 reranker that ranks by word overlap (real Qwen3 tokenizer), for offline demos",
        description="Trains (one to two minutes on a CPU) a 2-layer Qwen3 on synthetic queries to score a "
        "document by how many of the query's words it contains, through the Qwen3-Reranker template. "
        "Deterministic for a given seed.",
    )
    demo.add_argument("output_dir", metavar="DIR", help="folder to write the model and tokenizer to")
    demo.add_argument(
        "--seed", type=seed_int, default=0, help="seed of the starting weights and training data (default 0)"
    )
    demo.add_argument(
        "--train-steps",
        type=non_negative_int,  # a negative count wrote the untrained start, labelled as trained
        default=DEMO_TRAIN_STEPS,
        help=f"AdamW steps over all parameters; 0 writes the untrained start (default {DEMO_TRAIN_STEPS})",
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
        said = f"{start}genscore: interrupted{getattr(args, 'interrupted_note', '')}"
        _quietly(lambda: print(said, file=sys.stderr, flush=True))
        _quietly(sys.stdout.flush)
        os._exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (``genscore rerank ... | head -1``): nothing left to say to it.
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as error:  # a full disk, a file that went away: one line, as genscore score says it
        where = f"{error.filename}: " if error.filename else ""
        return _fail(f"{where}{error.strerror or error}", EXIT_BAD_INPUT)
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
