"""Rows in and out of JSON lines, CSV and Parquet files, one chunk at a time.

Readers yield every input row, good or bad, in file order, each with the line (or, for Parquet, row)
number that an error message should name. Writers write one chunk to one part file; :func:`merge_parts`
joins the parts into the final output. Only one chunk is ever held in memory.

JSON lines and CSV need only the standard library; Parquet needs pyarrow
(``pip install "genscore[parquet]"``).
"""

from __future__ import annotations

import _csv
import csv
import functools
import hashlib
import importlib.util
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Literal

from genscore_core import strict_json
from genscore_core.errors import InputFileError as InputFileError
from genscore_core.errors import InvalidRequestError
from genscore_core.protocol import check_text

FileFormat = Literal["jsonl", "csv", "parquet"]
FORMATS: tuple[FileFormat, ...] = ("jsonl", "csv", "parquet")
_SUFFIXES: dict[str, FileFormat] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
PART_SUFFIX: dict[FileFormat, str] = {"jsonl": ".jsonl", "csv": ".csv", "parquet": ".parquet"}
_BOM = b"\xef\xbb\xbf"
# The csv module refuses fields over 128 KiB by default; a long document is a normal row here (the
# scorer cuts text to --max-length before tokenizing). The limit is a C long: 32 bits on Windows.
_CSV_FIELD_LIMIT = 2**31 - 1
# A "\r" not followed by "\n" ends a CSV line too (as in open(newline="")); reading a binary file
# by lines splits only after "\n".
_CSV_LONE_CR = re.compile(rb"\r(?!\n)")


@dataclass(frozen=True)
class Columns:
    """Names of the columns the job reads and writes."""

    query: str = "query"
    document: str = "document"
    score: str = "score"
    score_option: str = "score_column="
    """How the caller takes the score column's name (``--score-column`` on the command line), for the
    message refusing an input that already has that column."""

    def score_taken(self) -> str:
        return (
            f"column {self.score!r} is reserved for the output score (pick another with {self.score_option})"
        )


@dataclass
class InputRow:
    """One row of the input. ``problem`` is set, and ``fields`` may be ``None``, for a bad row."""

    number: int
    """1-based line number (JSON lines, CSV: the row's first line) or row number (Parquet)."""
    fields: dict[str, Any] | None
    problem: str | None = None
    raw: str | None = None
    """The row as it appeared in the input, kept for bad rows only."""
    query: str = ""
    document: str = ""
    skipped: bool = False
    """Passed over unparsed, at the reader's ``skip``: only its place (and its bytes, hashed) count."""


def format_of_suffix(suffix: str) -> FileFormat | None:
    """The format a file extension (``".csv"``, any case) names, or None."""
    return _SUFFIXES.get(suffix.lower())


def detect_format(source: str, given: str | None, option: str) -> FileFormat:
    """The format ``given``, else the one the extension of ``source`` names.

    ``source`` is printed as the caller has it (a local path or a URL such as ``s3://bucket/x``, which
    ``Path`` would print as ``s3:/bucket/x``); ``option`` is how the caller takes the format
    (``--format`` on the command line, ``format=`` in Python), for the message asking for it.
    """
    if given is not None:
        if given not in FORMATS:
            raise InputFileError(
                f"unknown format {given!r}; expected one of {', '.join(FORMATS)}", param="format"
            )
        return given  # type: ignore[return-value]
    suffix = PurePath(source).suffix
    fmt = format_of_suffix(suffix)
    if fmt is None:
        raise InputFileError(
            f"{source}: cannot tell the format from the extension {suffix!r}; "
            f"use .jsonl, .csv or .parquet, or pass {option}",
            param="format",
        )
    return fmt


def _check_pair(row: InputRow, columns: Columns) -> InputRow:
    """Fill in the row's query and document, or say what is wrong with it."""
    fields = row.fields
    assert fields is not None
    if columns.score in fields:
        row.problem = columns.score_taken()
        return row
    for name in (columns.query, columns.document):
        if name not in fields:
            row.problem = f"missing {name!r}"
            return row
        value = fields[name]
        if value is None:
            row.problem = f"{name!r} must be a string, got null"
            return row
        try:
            # A lone surrogate (a JSON \ud800 escape) too, here by column: the scorer would name the
            # row by its place in a call the job made up.
            check_text(value, repr(name))
        except InvalidRequestError as error:
            row.problem = error.message
            return row
    row.query = fields[columns.query]
    row.document = fields[columns.document]
    return row


SkipRows = Callable[[int], bool]
"""Whether to pass over the row of this 0-based place (blank lines not counted) without parsing it."""


class RowReader:
    """Iterate the rows of an input file; a row that ``skip`` names comes as a bare ``skipped`` row.

    ``total`` and :meth:`position` measure progress (bytes for text formats, rows for Parquet).
    A text reader also reads an already open binary ``stream`` (a file on S3, say, that Ray's
    file job reads with these rules); ``path`` then only names it in messages, and ``total`` is 0.

    Everything read is hashed as it is read (SHA-256): :meth:`take_digest` gives the hash of what
    was read since its last call, so that a resumed job can tell whether the rows a finished chunk
    was scored from are still the input's (text formats: the bytes, blank lines and the header
    included; Parquet: the schema and each row's values).
    """

    unit = "B"

    def __init__(
        self,
        path: Path | str,
        columns: Columns,
        skip: SkipRows | None = None,
        stream: BinaryIO | None = None,
    ) -> None:
        self.path = path
        self.columns = columns
        self.skip: SkipRows = skip or _skip_none
        self.total = os.path.getsize(path) if stream is None else 0
        self._stream = stream
        self._digest = hashlib.sha256()

    def take_digest(self) -> str:
        """The SHA-256 (hex) of what was read since the last call; the count starts again."""
        digest, self._digest = self._digest.hexdigest(), hashlib.sha256()
        return digest

    def _open_binary(self) -> BinaryIO:
        return self._stream if self._stream is not None else open(self.path, "rb")

    def position(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[InputRow]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _skip_none(place: int) -> bool:
    return False


class JsonLinesReader(RowReader):
    """JSON objects, one a line; blank lines are not rows and are passed over."""

    def __init__(
        self, path: Path | str, columns: Columns, skip: SkipRows | None = None, stream: BinaryIO | None = None
    ) -> None:
        super().__init__(path, columns, skip, stream)
        self._file: BinaryIO = self._open_binary()  # closed by close()

    def position(self) -> int:
        return self._file.tell()

    def __iter__(self) -> Iterator[InputRow]:
        seen = 0
        for number, line in enumerate(self._file, start=1):
            self._digest.update(line)
            if number == 1:
                line = line.removeprefix(_BOM)
            if not line.strip():
                continue
            seen += 1
            if self.skip(seen - 1):
                yield InputRow(number, None, skipped=True)  # resumed: already written, no need to parse
                continue
            yield self._parse(number, line)

    def _parse(self, number: int, line: bytes) -> InputRow:
        record, problem, raw = parse_json_line(line)
        if record is None:
            return InputRow(number, None, problem, raw)
        row = _check_pair(InputRow(number, record), self.columns)
        if row.problem:
            row.raw = raw
        return row

    def close(self) -> None:
        self._file.close()


def parse_json_line(line: bytes) -> tuple[dict[str, Any] | None, str | None, str]:
    """One line of a JSON lines file as ``(the object, None, the line)``, or, where it is not a JSON
    object, ``(None, what is wrong, the line as a bad-rows list shows it)``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text", repr(line)
    shown = text.rstrip("\r\n")
    try:
        record = strict_json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg})", shown
    except strict_json.StrictJSONError as error:
        return None, str(error), shown
    if not isinstance(record, dict):
        return None, "expected a JSON object", shown
    return record, None, shown


class CsvReader(RowReader):
    """A CSV file with a header row; every value is a string."""

    def __init__(
        self, path: Path | str, columns: Columns, skip: SkipRows | None = None, stream: BinaryIO | None = None
    ) -> None:
        super().__init__(path, columns, skip, stream)
        self._binary: BinaryIO = self._open_binary()  # closed by close()
        self._lines = 0
        self._parser = _csv_parser()
        # strict: a quote opened and never closed is an error; otherwise the parser reads every later
        # line into that one value, and the rows on them are lost without a word.
        self._reader = self._parser.reader(self._decoded_lines(), strict=True)
        try:
            with _long_csv_fields(self._parser):
                self.header: list[str] = next(self._reader)
        except StopIteration:
            raise InputFileError(f"{path}: empty CSV file (no header row)") from None
        except self._parser.Error as error:
            raise InputFileError(f"{path}, line 1: cannot read the header ({error})") from None
        _refuse_repeated_names(path, self.header)
        for name in (columns.query, columns.document):
            if name not in self.header:
                raise InputFileError(f"{path}: no {name!r} column in the header {self.header}")
        if columns.score in self.header:
            raise InputFileError(f"{path}: {columns.score_taken()}")

    def _decoded_lines(self) -> Iterator[str]:
        """The file's lines, split as ``open(newline="")`` splits them, decoded one at a time: a text
        wrapper decodes blocks ahead of the parser, so its error would name some earlier line."""
        for raw in self._binary:
            self._digest.update(raw)
            if self._lines == 0:
                raw = raw.removeprefix(_BOM)
            start = 0
            for end in _CSV_LONE_CR.finditer(raw):
                yield self._decode(raw[start : end.end()])
                start = end.end()
            if start < len(raw):
                yield self._decode(raw[start:])

    def _decode(self, line: bytes) -> str:
        self._lines += 1
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError:
            raise InputFileError(f"{self.path}, line {self._lines}: not UTF-8 text") from None

    def position(self) -> int:
        return self._binary.tell()

    def __iter__(self) -> Iterator[InputRow]:
        seen = 0
        width = len(self.header)
        while True:
            number = self._reader.line_num + 1
            try:
                with _long_csv_fields(self._parser):
                    values = next(self._reader)
            except StopIteration:
                return
            except self._parser.Error as error:
                if str(error) == "unexpected end of data":
                    problem = "a quoted value starts in this row and is never closed"
                else:
                    problem = f"malformed CSV ({error})"
                raise InputFileError(f"{self.path}, line {number}: {problem}") from None
            if not values:
                continue  # a blank line
            seen += 1
            if self.skip(seen - 1):
                yield InputRow(number, None, skipped=True)
                continue
            if len(values) != width:
                yield InputRow(
                    number,
                    None,
                    f"{len(values)} fields, but the header has {width}",
                    _csv_line(values),
                )
                continue
            yield _check_pair(InputRow(number, dict(zip(self.header, values))), self.columns)

    def close(self) -> None:
        self._binary.close()


@functools.cache
def _csv_parser() -> Any:
    """The csv module's parser (``_csv``) with the long field limit: a second instance of it, which
    keeps its own limit (CPython 3.10 and later keep it per module instance), so that other code
    reading CSV in this process meanwhile keeps the limit it set; the shared one where that fails."""
    spec = importlib.util.find_spec("_csv")
    if spec is None or spec.loader is None:
        return _csv
    try:
        private = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(private)
    except ImportError:  # a build that allows one instance only
        return _csv
    if private is _csv:
        return _csv
    shared = csv.field_size_limit()
    private.field_size_limit(_CSV_FIELD_LIMIT)
    if csv.field_size_limit() == shared:
        return private
    csv.field_size_limit(shared)  # one limit for both after all: put it back
    return _csv


@contextmanager
def _long_csv_fields(parser: Any) -> Iterator[None]:
    if parser is not _csv:
        yield  # its own limit, set once
        return
    # The shared limit: raised only while the job parses, then put back.
    earlier = csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        yield
    finally:
        csv.field_size_limit(earlier)


def _refuse_repeated_names(path: Path | str, names: Sequence[str]) -> None:
    # Rows become dicts: a second column of the same name would overwrite the first.
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputFileError(
            f"{path}: more than one column is named {', '.join(map(repr, repeated))}; "
            "every column needs a name of its own"
        )


class ParquetReader(RowReader):
    """A Parquet file, read one record batch at a time."""

    unit = "row"

    def __init__(
        self, path: Path, columns: Columns, skip: SkipRows | None = None, batch_rows: int = 4096
    ) -> None:
        super().__init__(path, columns, skip)
        pq = import_pyarrow_parquet()
        import pyarrow as pa

        self._file = pq.ParquetFile(path)
        self.schema = self._file.schema_arrow
        self.total = self._file.metadata.num_rows
        self._batch_rows = batch_rows
        self._position = 0
        _refuse_repeated_names(path, self.schema.names)
        for name in (columns.query, columns.document):
            index = self.schema.get_field_index(name)
            if index < 0:
                raise InputFileError(f"{path}: no {name!r} column (columns: {self.schema.names})")
            kind = self.schema.field(index).type
            if not _holds_text(pa, kind):
                raise InputFileError(f"{path}: column {name!r} holds {kind}, expected strings")
        if columns.score in self.schema.names:
            raise InputFileError(f"{path}: {columns.score_taken()}")
        self._digest.update(self.schema.serialize().to_pybytes())

    def position(self) -> int:
        return self._position

    def __iter__(self) -> Iterator[InputRow]:
        number = 0
        for batch in self._file.iter_batches(batch_size=self._batch_rows):
            for record in batch.to_pylist():
                # A row's values, not its bytes (a Parquet file has none of its own): each one's
                # repr, which tells apart 1, 1.0, "1" and a key order.
                self._digest.update(repr(record).encode("utf-8", "backslashreplace") + b"\n")
                self._position = number = number + 1
                if self.skip(number - 1):
                    yield InputRow(number, None, skipped=True)
                    continue
                row = _check_pair(InputRow(number, record), self.columns)
                if row.problem:
                    row.raw = json.dumps(record, ensure_ascii=False, default=str)
                yield row

    def close(self) -> None:
        self._file.close()


def _holds_text(pa: Any, kind: Any) -> bool:
    """Whether a column of Arrow type ``kind`` reads as Python strings: any string type, also dictionary
    encoded (a pandas categorical column is written so: a natural way to keep a repeated query)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    is_string_view = getattr(pa.types, "is_string_view", None)  # pyarrow 16 and later
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or (is_string_view is not None and is_string_view(kind))
    )


def open_reader(path: Path, fmt: FileFormat, columns: Columns, skip: SkipRows | None = None) -> RowReader:
    readers: dict[FileFormat, type[RowReader]] = {
        "jsonl": JsonLinesReader,
        "csv": CsvReader,
        "parquet": ParquetReader,
    }
    try:
        return readers[fmt](path, columns, skip)
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a folder, expected a file") from None


def import_pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            'Parquet files need pyarrow; install it with: pip install "genscore[parquet]"'
        ) from None
    return pq


def _csv_line(values: Sequence[str]) -> str:
    """One CSV row, without its line end. The csv module quotes a value holding a character of the
    line terminator: with "\r\n" that is every value holding either, as a reader needs."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerow(values)
    return buffer.getvalue()[:-2]


# -- writing -----------------------------------------------------------------------------------------


def output_header(reader: RowReader, columns: Columns) -> Any:
    """What every part needs besides its rows: the CSV header or the Parquet schema (None for JSON lines)."""
    if isinstance(reader, CsvReader):
        return [*reader.header, columns.score]
    if isinstance(reader, ParquetReader):
        import pyarrow as pa

        return reader.schema.append(pa.field(columns.score, pa.float64()))
    return None


def encode_part(fmt: FileFormat, rows: list[dict[str, Any]], header: Any) -> bytes:
    """One chunk of output rows as the bytes of a part file."""
    if fmt == "jsonl":
        return "".join(json_line(row) for row in rows).encode("utf-8")
    if fmt == "csv":
        lines = (_csv_line([_csv_value(row[name]) for name in header]) + "\n" for row in rows)
        return "".join(lines).encode("utf-8")
    import pyarrow as pa

    pq = import_pyarrow_parquet()
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=header), sink)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def json_line(value: Any) -> str:
    """``value`` as one line of JSON that UTF-8 can hold: text as it is, except where it holds a lone
    surrogate (which a JSON ``\\ud800`` escape can put in a string), written as an escape again."""
    line = json.dumps(value, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(value)
    return line + "\n"


def _csv_value(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def write_atomically(path: Path, data: bytes, *, crash_midway: bool = False) -> None:
    """Write ``path`` so that it either does not exist or holds all of ``data``, even after a crash."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        if crash_midway:
            # Fault injection for the resume tests: die like a killed process, half a file written.
            out.write(data[: len(data) // 2])
            out.flush()
            os.fsync(out.fileno())
            _die()
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _die() -> None:
    import signal

    kill = getattr(signal, "SIGKILL", None)
    if kill is not None:
        os.kill(os.getpid(), kill)
    os._exit(137)


def merge_parts(fmt: FileFormat, parts: Sequence[Path], header: Any, output: Path) -> int:
    """Join the part files, in order, into ``output`` (written atomically); return its row count."""
    temporary = output.with_name(output.name + ".tmp")
    rows = 0
    if fmt == "parquet":
        rows = _merge_parquet(parts, header, temporary)
    else:
        with open(temporary, "wb") as out:
            if fmt == "csv":
                out.write(_csv_line(header).encode("utf-8") + b"\n")
            for part in parts:
                with open(part, "rb") as source:
                    while block := source.read(1 << 20):
                        out.write(block)
                rows += _count_text_rows(fmt, part)
    with open(temporary, "rb+") as done:
        os.fsync(done.fileno())
    os.replace(temporary, output)
    return rows


PARQUET_ROW_GROUP_ROWS = 4096
"""Rows in each row group of a Parquet output (the last one may hold fewer), whatever the parts: so
that the output's bytes depend on its rows alone, not on how they were chunked (``genscore score``'s
``chunk_size``, Ray's batches)."""


def _merge_parquet(parts: Sequence[Path], header: Any, target: Path) -> int:
    import pyarrow as pa

    pq = import_pyarrow_parquet()
    rows = 0
    pending: list[Any] = []
    held = 0
    with pq.ParquetWriter(target, header) as writer:

        def flush(count: int) -> None:
            nonlocal pending, held
            # One chunk per column, however the rows came: a row group is then written alike.
            table = pa.concat_tables(pending).unify_dictionaries().combine_chunks()
            writer.write_table(_dictionaries_of_their_own(pa, table.slice(0, count)))
            rest = table.slice(count)
            pending, held = ([rest] if rest.num_rows else []), rest.num_rows

        for part in parts:
            table = pq.read_table(part, schema=header)
            rows += table.num_rows
            pending.append(table)
            held += table.num_rows
            while held >= PARQUET_ROW_GROUP_ROWS:
                flush(PARQUET_ROW_GROUP_ROWS)
        if held:
            flush(held)
    return rows


def _dictionaries_of_their_own(pa: Any, table: Any) -> Any:
    """``table`` with each dictionary column encoded afresh from its own values: a slice keeps the
    whole dictionary of what it was cut from, which Parquet would write, unused entries and all."""
    for index, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            values = table.column(index).cast(field.type.value_type)
            table = table.set_column(index, field, values.dictionary_encode().cast(field.type))
    return table


def _count_text_rows(fmt: FileFormat, part: Path) -> int:
    if fmt == "csv":  # a quoted value may span lines
        parser = _csv_parser()
        with open(part, encoding="utf-8", newline="") as source, _long_csv_fields(parser):
            return sum(1 for _ in parser.reader(source))
    with open(part, "rb") as source:  # JSON lines never hold a raw newline
        return sum(1 for _ in source)
