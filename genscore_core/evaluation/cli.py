"""The ``genscore eval`` and ``genscore calibrate`` subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from genscore_core.cli_args import add_config_arguments, config_settings, positive_int

DEFAULT_DEPTH = 100
"""Candidates of each query reranked (``--top-k``)."""


def _add_data_arguments(parser: argparse.ArgumentParser, model_help: str) -> None:
    parser.add_argument(
        "data",
        metavar="DATA",
        type=Path,
        help="BEIR folder: corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv (docs/evaluation.md)",
    )
    parser.add_argument(
        "--split", default="test", help="the qrels file read: qrels/SPLIT.tsv (default %(default)s)"
    )
    parser.add_argument("--qrels", type=Path, help="judgements to use instead: BEIR .tsv or TREC qrels")
    parser.add_argument(
        "--run",
        type=Path,
        help="first stage: a TREC run (qid Q0 docid rank score tag) over the corpus; without it, BM25 "
        "over the corpus (docs/evaluation.md)",
    )
    parser.add_argument(
        "--top-k",
        type=positive_int,
        default=DEFAULT_DEPTH,
        help="candidates of each query taken from the first stage and reranked; also the k of "
        "Recall@k (default %(default)s)",
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="MODEL",
        help=model_help,
    )
    add_config_arguments(parser, exclude={"show_progress", "model"})
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_eval_commands(commands: Any) -> None:
    """Add ``eval`` and ``calibrate`` to the subcommands of the ``genscore`` parser."""
    evaluate = commands.add_parser(
        "eval",
        help="measure a first stage and each model reranking it (nDCG@10, MRR@10, MAP@100, Recall@k, pairs/s)",
        description="Reranks each judged query's top-k first-stage candidates with each --model and "
        "reports, for the first stage and each model, nDCG@10, MRR@10, MAP@100 and Recall@k as "
        "trec_eval defines them, with pairs/s and per-query latency. docs/evaluation.md.",
    )
    _add_data_arguments(evaluate, "hub id or folder of a reranker; give it again to compare several")
    evaluate.add_argument("--format", choices=["table", "json"], default="table", help="default %(default)s")
    evaluate.add_argument(
        "--results-dir",
        type=Path,
        help="keep each query's scores in DIR/SYSTEM.jsonl as they come: rerun the same command after "
        "an interruption and only the missing queries are scored",
    )
    evaluate.add_argument(
        "--restart", action="store_true", help="score every query again (with --results-dir)"
    )
    evaluate.add_argument(
        "--runs-dir", type=Path, help="also write each system's ranking as a TREC run into DIR"
    )
    evaluate.set_defaults(handler=run_eval)

    from genscore_core.evaluation.calibration import CALIBRATION_FILE

    calibrate = commands.add_parser(
        "calibrate",
        help="fit a model's scores to probabilities of relevance on judged data (score_mode=calibrated)",
        description="Scores each judged query's top-k first-stage candidates and its judged documents "
        "(relevant: relevance >= 1; unjudged candidates count as not relevant), fits Platt scaling on "
        "the score's logit on part of the queries, and reports the calibration error (ECE, Brier) "
        "before and after on the others. The fit is written where score_mode='calibrated' reads it.",
    )
    _add_data_arguments(calibrate, "hub id or folder of the reranker to calibrate")
    calibrate.set_defaults(top_k=20)
    calibrate.add_argument(
        "-o",
        "--output",
        type=Path,
        help=f"where to write the calibration (default: MODEL/{CALIBRATION_FILE} for a model folder; "
        "required for a hub id); a scorer reads it with calibration=PATH",
    )
    calibrate.add_argument(
        "--held-out",
        type=float,
        default=0.3,
        help="share of the queries kept out of the fit to measure it on (default %(default)s)",
    )
    calibrate.add_argument("--format", choices=["table", "json"], default="table", help="default %(default)s")
    calibrate.set_defaults(handler=run_calibrate)


def _data(args: argparse.Namespace) -> Any:
    from genscore_core.evaluation.data import read_judged_data

    return read_judged_data(args.data, split=args.split, qrels=args.qrels, run=args.run)


def _scorer_settings(args: argparse.Namespace, model: str) -> dict[str, Any]:
    settings = config_settings(args)
    settings["model"] = model
    return settings


def run_eval(args: argparse.Namespace) -> int:
    from genscore_core.cli import _loaded_scorer
    from genscore_core.evaluation.data import write_trec_run
    from genscore_core.evaluation.metrics import evaluate
    from genscore_core.evaluation.run import SystemReport, first_stage, rerank_run, system_name
    from genscore_core.scorer import GenerativeScorer

    data = _data(args)
    candidates = first_stage(data, args.top_k)
    reports = [SystemReport("first-stage", evaluate(candidates, data.qrels, args.top_k))]
    if args.runs_dir is not None:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        write_trec_run(candidates, args.runs_dir / "first-stage.run", tag="first-stage")
    args.progress_bar = not args.no_progress
    if args.results_dir is not None:
        args.interrupted_note = f"; scored queries are kept in {args.results_dir}: rerun to resume"
    names: list[str] = []
    for model in args.model:
        name = system_name(model, names)
        names.append(name)
        with _loaded_scorer(GenerativeScorer, _scorer_settings(args, model)) as scorer:
            report, run = rerank_run(
                scorer,
                data,
                candidates,
                system=name,
                recall_depth=args.top_k,
                results_dir=args.results_dir,
                restart=args.restart,
                progress=not args.no_progress,
            )
        reports.append(report)
        if args.runs_dir is not None:
            write_trec_run(run, args.runs_dir / f"{name}.run", tag=name)
    rows = [report.as_dict() for report in reports]
    print(_json_lines(rows) if args.format == "json" else format_table(rows), end="")
    return 0


def _json_lines(rows: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows of ``--format json`` as aligned columns; a blank cell where a system has no such value."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    cells = [[_cell(column, row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [columns, *cells]
    return "".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        ).rstrip()
        + "\n"
        for line in lines
    )


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Measures and calibration errors to 4 places; rates and milliseconds to one.
        return f"{value:.4f}" if "@" in column or column in ("ece", "brier") else f"{value:.1f}"
    return str(value)


def run_calibrate(args: argparse.Namespace) -> int:
    from genscore_core.cli import _loaded_scorer
    from genscore_core.errors import InputError
    from genscore_core.evaluation.calibration import calibrate_on, default_calibration_path
    from genscore_core.evaluation.run import first_stage
    from genscore_core.scorer import GenerativeScorer

    if len(args.model) != 1:
        raise InputError("genscore calibrate fits one model at a time: give --model once")
    if not 0.0 < args.held_out < 1.0:
        raise InputError(
            f"--held-out is a share of the queries, strictly between 0 and 1, got {args.held_out}"
        )
    if getattr(args, "score_mode", None) == "calibrated":
        raise InputError(
            "--score-mode calibrated is what calibrate fits; give the mode to calibrate (or none)"
        )
    model = args.model[0]
    output = args.output if args.output is not None else default_calibration_path(model)
    data = _data(args)
    candidates = first_stage(data, args.top_k)
    args.progress_bar = not args.no_progress
    with _loaded_scorer(GenerativeScorer, _scorer_settings(args, model)) as scorer:
        report = calibrate_on(scorer, data, candidates, held_out=args.held_out, progress=not args.no_progress)
    report.calibration.save(output)
    print(
        f"genscore: wrote {output}; use it with --score-mode calibrated --calibration {output}",
        file=sys.stderr,
    )
    rows = report.rows()
    print(_json_lines(rows) if args.format == "json" else format_table(rows), end="")
    return 0
