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
import queue
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
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
from genscore_core.errors import GenScoreError, InputError, InvalidRequestError, RemoteScoringError
from genscore_core.evaluation.cli import add_eval_commands
from genscore_core.jobs.cli import (  # genscore score's own exit codes, listed with the others
    EXIT_INPUT_CHANGED as EXIT_INPUT_CHANGED,
)
from genscore_core.jobs.cli import EXIT_JOB_LOCKED as EXIT_JOB_LOCKED
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
# --queries: queries already read are scored together up to about this many documents (one model
# call per query line cost ~20x the time of one call for 60 two-document queries on a CPU) ...
_GROUP_DOCUMENTS = 64
# ... and at most this many lines are read ahead of the scoring.
_QUEUED_LINES = 64


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


def _query_line(number: int, raw: str, source: str) -> QueryRecord | None:
    """The query of line ``number`` of a ``--queries`` file; None for a blank line."""
    line = raw.rstrip("\r\n")
    if number == 1:
        line = line.removeprefix("\ufeff")
    if not line.strip():
        return None
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
    return QueryRecord(query, _documents_of(documents, where), record.get("id"), where)


_END = object()
"""The input has no more lines."""
_NOT_READY = object()
"""No line has arrived yet: scoring what is at hand beats waiting for more (a pipe may be slow)."""


class _QueryLines:
    """The queries of a ``--queries`` stream, read by a thread a few lines ahead of the scoring.

    The thread lets the scoring take the lines that have already arrived without blocking on the
    next one, so that queries are grouped when the input is a file and a slow pipe still gets each
    answer before it sends its next line. At most :data:`_QUEUED_LINES` lines wait: memory does not
    grow with the input.
    """

    def __init__(self, stream: TextIO, source: str) -> None:
        self.source = source
        self._lines: queue.Queue[Any] = queue.Queue(maxsize=_QUEUED_LINES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), name="genscore-input", daemon=True)
        self._thread.start()

    def _read(self, stream: TextIO) -> None:
        try:
            for line in enumerate(stream, start=1):
                if not self._put(line):
                    return
            self._put(_END)
        except Exception as error:  # the scoring thread reports it, after what came before it
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():  # a reader that has stopped taking lines must not pin the thread
            try:
                self._lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self, wait: bool) -> Any:
        """The next query, :data:`_END`, or without ``wait`` :data:`_NOT_READY`; a bad line raises."""
        while True:
            try:
                item = self._lines.get(block=wait)
            except queue.Empty:
                return _NOT_READY
            if item is _END:
                self._lines.put(_END)  # asked again, it is still the end
                return _END
            if isinstance(item, UnicodeDecodeError):
                raise InputError(f"{self.source}: not UTF-8 text")
            if isinstance(item, Exception):
                raise item
            number, raw = item
            record = _query_line(number, raw, self.source)
            if record is not None:
                return record

    def close(self) -> None:
        self._stop.set()


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
            return _rerank_queries(args, stream, source)
        try:
            documents, lines = _read_documents(stream, source, args.format)
        except UnicodeDecodeError:
            raise InputError(f"{source}: not UTF-8 text") from None
    finally:
        if stream is not sys.stdin:
            stream.close()
    records = [QueryRecord(args.query, documents, lines=lines, source=source)]

    from genscore_core.scorer import GenerativeScorer

    settings = config_settings(args)
    settings["show_progress"] = not args.no_progress and len(documents) >= _PROGRESS_MIN_DOCUMENTS
    args.progress_bar = settings["show_progress"]
    with _loaded_scorer(GenerativeScorer, settings) as scorer:
        rankings = rank_queries(scorer, records, top_n=args.top_n, progress=args.progress_bar)
    out = _utf8_stdout()
    out.write(_output_lines(records, rankings, first_index=None))
    out.flush()
    return 0


def _rerank_queries(args: argparse.Namespace, stream: TextIO, source: str) -> int:
    """Each query's lines written, and flushed, once it is scored: memory holds one group of queries,
    a reader of the output sees answers as they come, and a bad line or Ctrl-C keeps what came before."""
    from tqdm import tqdm

    from genscore_core.scorer import GenerativeScorer

    lines = _QueryLines(stream, source)
    try:
        # A file that is wrong from its first line fails before the model loads.
        record = lines.next(wait=True)
        if record is _END:
            raise InputError(f"{source}: no queries to rerank for")
        settings = config_settings(args)
        settings["show_progress"] = not args.no_progress
        out = _utf8_stdout()
        done = 0
        scored_documents = 0
        bar: Any = None
        with _loaded_scorer(GenerativeScorer, settings) as scorer:
            while record is not _END:
                group = [record]
                failure: InputError | None = None
                try:
                    while sum(len(r.documents) for r in group) < _GROUP_DOCUMENTS:
                        record = lines.next(wait=False)
                        if record is _NOT_READY or record is _END:
                            break
                        group.append(record)
                    else:
                        record = _NOT_READY
                except InputError as error:
                    failure, record = error, _END
                documents = sum(len(r.documents) for r in group)
                if (
                    bar is None
                    and not args.no_progress
                    and scored_documents + documents >= _PROGRESS_MIN_DOCUMENTS
                ):
                    # The number of documents to come is not known: the bar counts, with no time left.
                    bar = tqdm(
                        file=sys.stderr, desc="scoring", unit="doc", initial=scored_documents, mininterval=0
                    )
                    args.progress_bar = True
                for part in _scorable(scorer, group, args.top_n, bar):
                    text = _output_lines(*part, first_index=done)
                    with _ctrl_c_after():
                        out.write(text)
                        done += len(part[0])
                        args.interrupted_note = (
                            f"; results written for {done} quer{'y' if done == 1 else 'ies'}"
                        )
                    out.flush()
                scored_documents += documents
                if failure is not None:
                    raise failure
                if record is _NOT_READY:
                    record = lines.next(wait=True)
            if bar is not None:
                bar.close()
    finally:
        lines.close()
    return 0


@contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Ctrl-C is held until the block is done: the count of queries that the message of an
    interrupted run gives is then the count of queries on stdout (which is unbuffered under
    ``PYTHONUNBUFFERED``, so a write alone puts the lines there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *caught: held.append(caught))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(*held[0])


def _scorable(
    scorer: GenerativeScorer, group: list[QueryRecord], top_n: int | None, bar: Any
) -> Iterator[tuple[list[QueryRecord], list[RankedResults]]]:
    """The group ranked in one go, or, when a document of it is refused, query by query: the queries
    before the refused one are written, and the error names its line."""
    try:
        rankings = rank_queries(scorer, group, top_n=top_n, progress=bar is not None, bar=bar)
    except InputError:
        if len(group) == 1:
            raise
        for record in group:
            yield [record], rank_queries(scorer, [record], top_n=top_n, progress=bar is not None, bar=bar)
        return
    yield group, rankings


def _utf8_stdout() -> TextIO:
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(encoding="utf-8")  # JSON lines are UTF-8 whatever the locale
    return out


def _output_lines(
    records: Sequence[QueryRecord], rankings: Sequence[RankedResults], first_index: int | None
) -> str:
    """The JSON lines of ranked queries; with ``first_index`` (several queries) each names its query."""
    text = []
    for number, (record, ranked) in enumerate(zip(records, rankings)):
        for result in ranked:
            line: dict[str, Any] = {}
            if first_index is not None:
                line["query_index"] = first_index + number
                if record.id is not None:
                    line["query_id"] = record.id
            line.update({"index": result.index, "score": result.score, "truncated": result.truncated})
            line.update(record.documents[result.index])
            text.append(json.dumps(line, ensure_ascii=False) + "\n")
    return "".join(text)


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
    scorer: GenerativeScorer,
    records: Sequence[QueryRecord],
    *,
    top_n: int | None,
    progress: bool,
    bar: Any = None,
) -> list[RankedResults]:
    """Each query's documents best first, all scored by one scorer; a bar on stderr with ``progress``.

    The bar counts documents and shows the rate and the time left. It advances as the engine
    finishes batches; to keep it moving, documents are scored in slices of about 1/100 of the run
    (at least 8 documents), with the batches of a slice spread over its documents. ``bar``, a tqdm
    bar of the caller that spans several calls, is advanced instead of a bar of this call's own.
    """
    from tqdm import tqdm

    from genscore_core.results import rank_results

    owners = [(number, position) for number, r in enumerate(records) for position in range(len(r.documents))]
    pairs = [
        (records[number].query, records[number].documents[position]["text"]) for number, position in owners
    ]
    # A caller's bar spans many calls: a group of queries is not cut into slices smaller than a group.
    least = _PROGRESS_MIN_SLICE if bar is None else _GROUP_DOCUMENTS
    size = max(least, math.ceil(len(pairs) / _PROGRESS_STEPS)) if progress else len(pairs)
    scored: list[Any] = []
    # mininterval=0: every step is drawn (a hundred or so per run), none is skipped for being quick.
    own = (
        tqdm(
            total=len(pairs), disable=not progress, file=sys.stderr, desc="scoring", unit="doc", mininterval=0
        )
        if bar is None
        else None
    )
    with own if own is not None else nullcontext(bar) as bar:
        base = bar.n
        try:
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
                    bar.update(base + start + length * finished // prompts - bar.n)

                scored.extend(
                    prepared.assemble(scorer.backend.score_jobs(prepared.jobs, on_progress=advance))
                )
                bar.update(base + start + len(chunk) - bar.n)
        except InputError:
            if own is None:  # the caller scores these documents again, one query at a time
                bar.n = base
            raise
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


def _model_folder_command(
    commands: Any, name: str, seed_help: str, **options: Any
) -> argparse.ArgumentParser:
    """A command that writes a model folder: its ``DIR`` and ``--seed``; ``options`` are the
    command's ``add_parser`` options (help, description)."""
    command: argparse.ArgumentParser = commands.add_parser(name, **options)
    command.add_argument("output_dir", metavar="DIR", help="folder to write the model and tokenizer to")
    command.add_argument("--seed", type=seed_int, default=0, help=seed_help)
    return command


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

    tiny = _model_folder_command(
        commands,
        "make-tiny-model",
        "seed of the random weights (default 0)",
        help="write a small RANDOM-weight Qwen3 with the real Qwen3 tokenizer, for offline runs",
    )
    tiny.add_argument("--force", action="store_true", help="write into a non-empty folder")
    tiny.set_defaults(handler=_make_tiny_model)

    demo = _model_folder_command(
        commands,
        "make-demo-model",
        "seed of the starting weights and training data (default 0)",
        help="write a small Qwen3 reranker that ranks by word overlap (real Qwen3 tokenizer), for offline demos",
        description="Trains (one to two minutes on a CPU) a 2-layer Qwen3 on synthetic queries to score a "
        "document by how many of the query's words it contains, through the Qwen3-Reranker template. "
        "Deterministic for a given seed.",
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
    add_eval_commands(commands)
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
