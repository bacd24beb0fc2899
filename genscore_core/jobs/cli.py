"""The ``genscore score`` subcommand: arguments, and running :func:`~genscore_core.jobs.score_file`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from genscore_core.cli_args import (
    add_config_arguments,
    config_settings,
    flag_of,
    non_negative_int,
    positive_int,
)

EXIT_INPUT_CHANGED = 4
"""A resumed job's input no longer holds what its finished chunks were scored from; nothing written."""
EXIT_JOB_LOCKED = 5
"""Another run of the same job (same output) holds its lock; nothing touched."""


def add_score_command(commands: Any, scorer_flag_aliases: Mapping[str, Sequence[str]] | None = None) -> None:
    """Add ``score`` to the subcommands of the ``genscore`` parser."""
    score = commands.add_parser(
        "score",
        help="score every (query, document) row of a JSONL, CSV or Parquet file; resumable",
        description="Write the input's rows with a score column added, in input order, to OUTPUT "
        "(same format as the input). Rows are scored in chunks, each chunk grouped by query, and "
        "each finished chunk is kept in OUTPUT.partial/: rerun the same command after an "
        "interruption and it resumes where it stopped.",
    )
    score.add_argument("input", metavar="INPUT", type=Path, help=".jsonl, .csv or .parquet file")
    score.add_argument("-o", "--output", required=True, type=Path, help="output file (same format)")
    # The job draws its own progress bar; everything else a scorer takes is a flag.
    add_config_arguments(score, exclude={"show_progress"}, aliases=scorer_flag_aliases)
    score.add_argument("--format", choices=["jsonl", "csv", "parquet"], help="default: from the extension")
    score.add_argument("--query-column", default="query", help="default %(default)s")
    score.add_argument("--document-column", default="document", help="default %(default)s")
    score.add_argument("--score-column", default="score", help="output column (default %(default)s)")
    score.add_argument(
        "--chunk-size",
        type=positive_int,
        default=4096,
        help="rows read, scored and written at a time (default %(default)s)",
    )
    score.add_argument(
        "--on-bad-row",
        choices=["fail", "skip"],
        default="fail",
        help="fail: stop, naming the bad rows by line; skip: leave them out and list them in "
        "OUTPUT.bad-rows.jsonl (default %(default)s)",
    )
    for flag, what in (
        ("--restart", "discard an unfinished earlier run"),
        ("--overwrite", "replace an existing OUTPUT"),
        ("--no-progress", "no progress bar on stderr"),
    ):
        score.add_argument(flag, action="store_true", help=what)
    score.add_argument(
        "--crash-after-chunks",
        type=non_negative_int,
        metavar="N",
        help="testing: after writing N chunks, kill this process (SIGKILL) halfway through writing the "
        "next, to check that a rerun resumes exactly",
    )
    score.set_defaults(handler=run_score)


def command_line_option(field: str, value: Any = None) -> str:
    """A ScoreFileOptions field as ``genscore score`` takes it: ``--on-bad-row skip``, ``--overwrite``."""
    flag = flag_of(field)
    return flag if value is None or value is True else f"{flag} {value}"


def run_score(args: argparse.Namespace) -> int:
    from genscore_core.config import ScorerConfig
    from genscore_core.errors import InputChangedError, JobLockedError
    from genscore_core.jobs.score import ScoreFileOptions, column_clash, score_file

    # Checked before the model loads (ScoreFileOptions checks it too, naming the Python fields).
    flags = {"--query-column": args.query_column, "--document-column": args.document_column}
    problem = column_clash({**flags, "--score-column": args.score_column})
    if str(args.input) == "-":
        # rerank's convention: read as a file of that name, it was "cannot tell the format from the
        # extension ''", or with --format "-: no such file".
        problem = (
            "genscore score reads INPUT again to resume, so it takes a file, not stdin ('-'); save it first"
        )
    if problem is not None:
        print(f"genscore: error: {problem}", file=sys.stderr)
        return 2
    # Said by genscore's Ctrl-C handler: that this job, unlike rerank's, is not lost.
    work = args.output.with_name(args.output.name + ".partial")
    args.interrupted_note = f"; finished chunks are kept in {work}: rerun the same command to resume"
    args.progress_bar = not args.no_progress
    settings = config_settings(args)
    options = ScoreFileOptions(
        input=args.input,
        output=args.output,
        format=args.format,
        query_column=args.query_column,
        document_column=args.document_column,
        score_column=args.score_column,
        chunk_size=args.chunk_size,
        on_bad_row=args.on_bad_row,
        restart=args.restart,
        overwrite=args.overwrite,
        show_progress=not args.no_progress,
        crash_after_chunks=args.crash_after_chunks,
    )
    try:
        report = score_file(options, ScorerConfig(**settings), option_name=command_line_option)
    except InputChangedError as error:
        print(f"genscore: error: {error}", file=sys.stderr)
        return EXIT_INPUT_CHANGED
    except JobLockedError as error:
        print(f"genscore: error: {error}", file=sys.stderr)
        return EXIT_JOB_LOCKED
    except ImportError as error:  # pyarrow, for Parquet
        print(f"genscore: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, a file that went away: one line, like every other error
        where = f"{error.filename}: " if error.filename else ""
        print(f"genscore: error: {where}{error.strerror or error}", file=sys.stderr)
        return 2
    kept = report.rows_written - report.rows_scored
    notes = [f"{kept} rows kept from an interrupted run"] if report.resumed_chunks else []
    if report.rescored_chunks:
        parts = "part" if report.rescored_chunks == 1 else "parts"
        notes.append(
            f"{report.rescored_chunks} damaged {parts} of it scored again"
            if notes
            else f"{report.rescored_chunks} damaged {parts} of an interrupted run scored again"
        )
    resumed = f" ({'; '.join(notes)})" if notes else ""
    rows = "row" if report.rows_written == 1 else "rows"
    print(f"genscore: wrote {report.rows_written} {rows} to {report.output}{resumed}", file=sys.stderr)
    if report.bad_rows:
        print(
            f"genscore: {report.bad_rows} bad {'row' if report.bad_rows == 1 else 'rows'} left out; "
            f"listed with line numbers in {report.bad_rows_file}",
            file=sys.stderr,
        )
    return 0
