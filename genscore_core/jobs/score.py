"""``genscore score``: score every (query, document) row of a file, resumably, in constant memory.

The input is read in chunks of ``chunk_size`` rows. Each chunk is scored through the scorer's pair
path, which groups the chunk's rows by query so that each query's shared prompt prefix is computed once,
and written as one part file in a work folder beside the output (``OUTPUT.partial/``), atomically:
a part either exists whole or not at all. When every chunk is done the parts are joined into
``OUTPUT`` and the work folder is removed.

Chunk ``k`` always holds input rows ``k * chunk_size`` to ``(k + 1) * chunk_size - 1``, so a rerun
after an interruption keeps the finished parts, skips their rows and scores the rest exactly as an
uninterrupted run would have; the work folder records the input file and the settings, and a rerun
with other ones is refused rather than mixed in. What a rerun keeps it checks (``work.py``): each
part against the hash recorded when it was written (a damaged one is scored again), each kept
chunk's input against the hash of what it read then (a changed input is refused). One run per
output at a time (``lock.py``).

Bad rows (invalid JSON, NaN or Infinity in JSON, a JSON key given twice, a missing or non-string query or document, text the scorer refuses,
a row the model scores NaN, infinite or out of range) are reported with their line number. (Settings under which no
prompt fits ``max_length`` are refused when the scorer is built.) With ``on_bad_row="fail"`` (the default) the job stops at the first
chunk holding any, naming them all; with ``"skip"`` they are left out of the output and listed, with
the reason, in ``OUTPUT.bad-rows.jsonl``, and the summary counts them. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm

from genscore_core.config import ScorerConfig
from genscore_core.errors import (
    InputFileError,
    InvalidRequestError,
    JobStateError,
    ScoreRangeError,
)
from genscore_core.jobs import work as work_folder
from genscore_core.jobs.files import (
    PART_SUFFIX,
    Columns,
    FileFormat,
    InputRow,
    RowReader,
    detect_format,
    encode_part,
    json_line,
    merge_parts,
    open_reader,
    output_header,
)
from genscore_core.jobs.lock import job_lock

if TYPE_CHECKING:
    from genscore_core.scorer import GenerativeScorer

_MANIFEST_VERSION = 2
# How many bad rows one error message lists before it says "and N more".
_LISTED_BAD_ROWS = 20


class ScoreFileOptions(BaseModel):
    """What ``genscore score`` reads, writes and how (the scorer's own settings are a ScorerConfig)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Path
    output: Path
    format: Literal["jsonl", "csv", "parquet"] | None = None
    """Input (and output) format; ``None`` reads it from the input's extension."""
    query_column: str = "query"
    document_column: str = "document"
    score_column: str = "score"
    chunk_size: int = Field(default=4096, gt=0)
    """Rows read, scored and written at a time: the memory bound and the unit of resumption."""
    on_bad_row: Literal["fail", "skip"] = "fail"
    restart: bool = False
    """Discard the parts of an earlier, unfinished run instead of resuming it."""
    overwrite: bool = False
    """Replace an existing output file."""
    show_progress: bool = True
    crash_after_chunks: int | None = Field(default=None, ge=0)
    """Fault injection for testing resumption: after writing this many chunks, the process kills itself
    (SIGKILL) halfway through writing the next one."""

    @model_validator(mode="after")
    def _columns_differ(self) -> ScoreFileOptions:
        fields = ("query_column", "document_column", "score_column")
        problem = column_clash({field: getattr(self, field) for field in fields})
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def columns(self) -> Columns:
        return Columns(self.query_column, self.document_column, self.score_column)


def column_clash(columns: dict[str, str]) -> str | None:
    """What is wrong when two of ``columns`` (option name -> column name) name one column; None when
    each names its own. A job whose query and document are one column, or whose score would replace
    one of them, finds every row bad: with ``on_bad_row="skip"`` it wrote an empty output."""
    seen: dict[str, str] = {}
    for option, column in columns.items():
        if column in seen:
            return f"{seen[column]} and {option} both name the column {column!r}; each needs its own"
        seen[column] = option
    return None


OptionName = Callable[..., str]
"""How a caller of :func:`score_file` takes an option, for the messages that ask for one:
``(field)`` names it, ``(field, value)`` sets it (``--on-bad-row skip``, ``on_bad_row='skip'``)."""


def python_option(field: str, value: Any = None) -> str:
    """An option as a Python caller passes it: ``on_bad_row='skip'``, or the name alone, ``format=``."""
    return f"{field}=" if value is None else f"{field}={value!r}"


@dataclass
class ScoreFileReport:
    output: Path
    rows_written: int
    """Rows in the output (resumed and new)."""
    rows_scored: int
    """Rows scored by this run (the rest came from an earlier, interrupted run)."""
    bad_rows: int
    bad_rows_file: Path | None
    resumed_chunks: int
    """Finished chunks of an earlier, interrupted run kept as they were."""
    rescored_chunks: int = 0
    """Chunks an earlier run finished whose part was found damaged (truncated, emptied, edited), and
    which this run scored again."""


@dataclass
class _Chunk:
    index: int
    rows: list[InputRow]


def score_file(
    options: ScoreFileOptions,
    scorer_config: ScorerConfig,
    scorer: GenerativeScorer | None = None,
    *,
    option_name: OptionName = python_option,
) -> ScoreFileReport:
    """Score every row of ``options.input`` into ``options.output``; see the module docs.

    Args:
        options: Files, columns, chunking and what to do with bad rows.
        scorer_config: The scorer's settings; recorded so that a resumed run scores like the first.
        scorer: A ready scorer built from ``scorer_config``; ``None`` loads one once the input and the
            work folder have been checked and the first chunk to score is read (so a mistake, and an
            input changed under a resumed run, are reported before the model loads).
        option_name: How the caller takes the options that messages ask for: Python's
            ``overwrite=True`` by default; ``genscore score`` passes its flags' spelling.

    Raises:
        InvalidRequestError: A bad row with ``on_bad_row="fail"`` (its message names every bad row of
            the chunk by line), an unreadable input (:class:`~genscore_core.jobs.files.InputFileError`),
            an output or work folder in the way (:class:`JobStateError`).
    """
    fmt = detect_format(str(options.input), options.format, option_name("format"))
    out_fmt = detect_format(str(options.output), options.format, option_name("format"))
    if out_fmt != fmt:
        raise InputFileError(
            f"the output {options.output} would be {out_fmt} but the input is {fmt}; "
            "the output keeps the input's format"
        )
    if options.output.resolve() == options.input.resolve():
        raise JobStateError("the output must not be the input file")
    if options.output.is_dir():
        # Found only when the parts are joined, after every row was scored, otherwise.
        raise JobStateError(f"{options.output} is a folder; the output is a file", param="output")
    columns = Columns(
        options.query_column, options.document_column, options.score_column, option_name("score_column")
    )
    work = options.output.with_name(options.output.name + ".partial")
    bad_rows_file = options.output.with_name(options.output.name + ".bad-rows.jsonl")
    # Checks the columns and the header before any state is touched.
    open_reader(options.input, fmt, columns).close()

    manifest = _manifest(options, fmt, scorer_config)
    suffix = PART_SUFFIX[fmt]
    with job_lock(options.output):
        resumed = _prepare_work_folder(options, work, manifest, option_name)
        kept = resumed.kept
        size = options.chunk_size
        reader = open_reader(options.input, fmt, columns, skip=lambda place: place // size in kept)
        try:
            header = output_header(reader, columns)
            records = dict(kept)
            scored = written_now = chunks_read = 0
            restart = option_name("restart", True)
            with tqdm(
                total=reader.total,
                unit=reader.unit,
                unit_scale=reader.unit == "B",
                disable=not options.show_progress,
                file=sys.stderr,
                desc="scoring",
            ) as bar:
                for chunk in _chunks(reader, size):
                    digest = reader.take_digest()
                    chunks_read += 1
                    if chunk.index in kept:
                        work_folder.check_unchanged(
                            options.input, chunk.index, kept[chunk.index], chunk.rows, digest, restart
                        )
                        bar.update(reader.position() - bar.n)
                        continue
                    if scorer is None:
                        # Loaded once a chunk needs it: the kept chunks' input is checked first.
                        scorer = _load_scorer(scorer_config)
                    good, bad = _score_chunk(scorer, chunk.rows, options.on_bad_row)
                    if bad and options.on_bad_row == "fail":
                        raise InvalidRequestError(
                            _describe_bad_rows(options.input, bad, option_name), param="input"
                        )
                    rows = [dict(row.fields or {}, **{columns.score: score}) for row, score in good]
                    crash = (
                        options.crash_after_chunks is not None and written_now == options.crash_after_chunks
                    )
                    # Bad rows and the record before the part: a committed part always has them beside it.
                    records[chunk.index] = work_folder.commit_chunk(
                        work,
                        chunk.index,
                        suffix,
                        part=encode_part(fmt, rows, header),
                        rows=len(rows),
                        bad=_bad_rows_lines(bad) if bad else None,
                        input_rows=chunk.rows,
                        input_sha256=digest,
                        crash_midway=crash,
                    )
                    written_now += 1
                    scored += len(rows)
                    bar.update(reader.position() - bar.n)
            work_folder.missing_chunks(options.input, kept, chunks_read, restart)
            if scorer is None and not kept:
                _load_scorer(scorer_config)  # no rows: a mistyped model is still named, as before
            parts = work_folder.check_parts(work, records, suffix)
            written = merge_parts(fmt, parts, header, options.output)
            bad_count = _join_bad_rows(sorted(work.glob("bad-*.jsonl")), bad_rows_file)
        finally:
            reader.close()
        shutil.rmtree(work)
    return ScoreFileReport(
        output=options.output,
        rows_written=written,
        rows_scored=scored,
        bad_rows=bad_count,
        bad_rows_file=bad_rows_file if bad_count else None,
        resumed_chunks=len(kept),
        rescored_chunks=len(resumed.damaged),
    )


def _load_scorer(config: ScorerConfig) -> GenerativeScorer:
    from genscore_core.scorer import GenerativeScorer

    return GenerativeScorer(config=config)


def _manifest(options: ScoreFileOptions, fmt: FileFormat, config: ScorerConfig) -> dict[str, Any]:
    # The input's contents are identified chunk by chunk, by a hash of what each chunk read (see
    # work.py): its size and modification time stay the same through an edit made with cp -p.
    return {
        "version": _MANIFEST_VERSION,
        "input": str(options.input.resolve()),
        "format": fmt,
        "columns": [options.query_column, options.document_column, options.score_column],
        "chunk_size": options.chunk_size,
        # Every setting by its flat name, as before the settings were typed: a run started then resumes.
        "scorer": config.to_settings(mode="json", exclude={"show_progress", "server_api_key"}, every=True),
    }


def _prepare_work_folder(
    options: ScoreFileOptions, work: Path, manifest: dict[str, Any], option_name: OptionName
) -> work_folder.Resumed:
    """Make the work folder ready; return the chunks an earlier run finished that this one keeps."""
    suffix = PART_SUFFIX[manifest["format"]]
    if work.is_dir() and (options.restart or not any(work.glob(f"part-*{suffix}"))):
        # Without a finished chunk there is nothing to resume, and nothing a rerun could mix with:
        # a run that stopped early (a bad row, a mistyped --model) must not block the corrected one.
        shutil.rmtree(work)
    if not work.exists():
        if options.output.exists() and not options.overwrite:
            raise JobStateError(
                f"{options.output} already exists; pass {option_name('overwrite', True)} to replace it",
                param="output",
            )
        work_folder.start(work, manifest)
        return work_folder.Resumed({}, [])
    _, resumed = work_folder.resume(work, manifest, suffix, option_name("restart", True))
    skip = option_name("on_bad_row", "skip")
    if options.on_bad_row == "fail" and any(work.glob("bad-*.jsonl")):
        # Chunks finished with --on-bad-row skip left rows out; a fail run must not keep them. (The
        # other way round is exact: a chunk finished in fail mode had no bad row to leave out.)
        raise JobStateError(
            f"{work} holds chunks of an unfinished run with {skip} that left bad rows out; "
            f"rerun with {skip} to resume it, or pass {option_name('restart', True)} to discard it",
            param="output",
        )
    return resumed


def _chunks(reader: RowReader, size: int) -> Iterator[_Chunk]:
    """The reader's rows, ``size`` at a time; the reader has read nothing past a chunk when it comes
    (its digest is the chunk's)."""
    rows: list[InputRow] = []
    index = 0
    for row in reader:
        rows.append(row)
        if len(rows) == size:
            yield _Chunk(index, rows)
            rows, index = [], index + 1
    if rows:
        yield _Chunk(index, rows)


def _score_chunk(
    scorer: GenerativeScorer, rows: list[InputRow], on_bad_row: str
) -> tuple[list[tuple[InputRow, float]], list[InputRow]]:
    """Scores of the chunk's good rows, in order, and its bad rows (the scorer's refusals and rows
    the model scores out of range included)."""
    bad = [row for row in rows if row.problem]
    good = [row for row in rows if not row.problem]
    if bad and on_bad_row == "fail":
        return [], bad
    scorable = good
    try:
        scores = _scores_isolating_range_errors(scorer, scorable, first_only=on_bad_row == "fail")
    except InvalidRequestError:
        # Rows already found scored out of range keep their problem and are not checked again.
        if not _find_refused(scorer, [row for row in good if not row.problem]):
            raise
        scorable = [row for row in good if not row.problem]
        scores = (
            [] if on_bad_row == "fail" else _scores_isolating_range_errors(scorer, scorable, first_only=False)
        )
    bad = sorted(bad + [row for row in good if row.problem], key=lambda row: row.number)
    if bad and on_bad_row == "fail":
        return [], bad
    return [(row, score) for row, score in zip(scorable, scores) if score is not None], bad


def _scores_isolating_range_errors(
    scorer: GenerativeScorer, rows: list[InputRow], *, first_only: bool
) -> list[float | None]:
    """The rows' scores; where the model scores some row NaN, infinite or out of range, that row's
    score is None and its problem says so.

    The engine's error names a prompt of its batch, not an input row, so the rows are halved until
    each bad one stands alone: a job of thousands of rows would otherwise stop without a line number.
    With ``first_only`` (the job stops anyway) the search ends at the first bad row.
    """
    if not rows:
        return []
    try:
        return list(scorer.score_pairs([(row.query, row.document) for row in rows]))
    except ScoreRangeError as error:
        if len(rows) == 1:
            rows[0].problem = _unusable_score(error)
            rows[0].raw = json.dumps(rows[0].fields, ensure_ascii=False, default=str)
            return [None]
    half = len(rows) // 2
    first = _scores_isolating_range_errors(scorer, rows[:half], first_only=first_only)
    if first_only and None in first:
        return first + [None] * (len(rows) - half)
    return first + _scores_isolating_range_errors(scorer, rows[half:], first_only=first_only)


def _unusable_score(error: ScoreRangeError) -> str:
    # The scorer names the pair by its place in the call ("pairs[0] scored nan..."): a call of this
    # one row, so that place would only mislead beside the row's line number.
    place = f"{error.param}[{error.index}] "
    if error.param is not None and error.index is not None and error.message.startswith(place):
        return f"the model {error.message.removeprefix(place)}"
    return f"the model's score is not usable: {error.message}"


def _find_refused(scorer: GenerativeScorer, rows: list[InputRow]) -> list[InputRow]:
    """Mark the rows whose prompts the scorer refuses to build (no scoring): a query's rows together,
    then, where that fails, each alone, so that the cost stays linear in the rows however many are
    refused."""
    by_query: dict[str, list[InputRow]] = {}
    for row in rows:
        by_query.setdefault(row.query, []).append(row)
    refused: list[InputRow] = []
    for query, group in by_query.items():
        try:
            scorer.prepare_pairs([(query, row.document) for row in group])
            continue
        except InvalidRequestError as error:
            if error.index is None:  # the query is at fault, not a document
                refused.extend(_refuse(group, error))
                continue
        for row in group:
            try:
                scorer.prepare_pairs([(query, row.document)])
            except InvalidRequestError as error:
                refused.extend(_refuse([row], error))
    return refused


def _refuse(rows: list[InputRow], error: InvalidRequestError) -> list[InputRow]:
    for row in rows:
        row.problem = f"refused by the scorer: {error.message}"
        row.raw = json.dumps(row.fields, ensure_ascii=False, default=str)
    return rows


def _describe_bad_rows(source: Path, bad: list[InputRow], option_name: OptionName) -> str:
    lines = [f"line {row.number}: {row.problem}" for row in bad[:_LISTED_BAD_ROWS]]
    more = f"; and {len(bad) - _LISTED_BAD_ROWS} more" if len(bad) > _LISTED_BAD_ROWS else ""
    noun = "bad row" if len(bad) == 1 else "bad rows"
    return (
        f"{source}: {len(bad)} {noun} ({'; '.join(lines)}{more}); fix them, or pass {option_name('on_bad_row', 'skip')} "
        "to leave them out and list them in OUTPUT.bad-rows.jsonl"
    )


def _bad_rows_lines(bad: list[InputRow]) -> bytes:
    return "".join(
        json_line({"line": row.number, "error": row.problem, "input": row.raw}) for row in bad
    ).encode("utf-8")


def _join_bad_rows(parts: list[Path], target: Path) -> int:
    count = 0
    if not parts:
        target.unlink(missing_ok=True)  # a stale list from an earlier run would mislead
        return 0
    temporary = target.with_name(target.name + ".tmp")
    with open(temporary, "wb") as out:
        for part in parts:
            data = part.read_bytes()
            count += data.count(b"\n")
            out.write(data)
    temporary.replace(target)
    return count
