"""``genscore score``: every row scored like the official recipe, in order, grouped by query per chunk,
bad rows named by line, a run killed halfway resumed to the very bytes of an uninterrupted run, and
a rerun keeping only what it can prove (its input hashed, each part checked, one run at a time)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genscore_core import GenerativeScorer, InvalidRequestError, ScorerConfig
from genscore_core.cli import main
from genscore_core.errors import InputChangedError, JobLockedError, ModelNotFoundError
from genscore_core.jobs import InputFileError, JobStateError, ScoreFileOptions, ScoreFileReport, score_file
from tests.helpers.reference_recipe import official_qwen3_scores

GENSCORE = shutil.which("genscore")
QUERIES = ["capital of France", "how do plants make food", "tallest mountain"]
WORDS = "the a Paris France Berlin sun light leaf mountain Everest high river city water energy".split()


def make_rows(count: int) -> list[dict[str, Any]]:
    """Rows whose queries interleave, so grouping by query has work to do."""
    rows = []
    for i in range(count):
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 9)]
        rows.append(
            {"id": i, "query": QUERIES[i % 3], "document": " ".join(words), "meta": {"n": i, "tag": "ü"}}
        )
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def config_of(scorer: GenerativeScorer) -> ScorerConfig:
    return scorer.config


class RecordingScorer:
    """Forwards to the real scorer and records the pairs of each scoring call."""

    def __init__(self, scorer: GenerativeScorer) -> None:
        self.scorer = scorer
        self.calls: list[list[tuple[str, str]]] = []

    def score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
        self.calls.append(list(pairs))
        return self.scorer.score_pairs(pairs)

    def prepare_pairs(self, pairs: list[tuple[str, str]]) -> Any:
        return self.scorer.prepare_pairs(pairs)


class InterruptedScorer(RecordingScorer):
    """The real scorer, interrupted (as by Ctrl-C) on its scoring call number ``at`` (from 0)."""

    def __init__(self, scorer: GenerativeScorer, at: int) -> None:
        super().__init__(scorer)
        self.at = at

    def score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
        if len(self.calls) == self.at:
            raise KeyboardInterrupt
        return super().score_pairs(pairs)


def _score(source: Path, output: Path, scorer: GenerativeScorer, **options: Any) -> Any:
    return score_file(
        ScoreFileOptions(input=source, output=output, show_progress=False, **options),
        config_of(scorer),
        scorer,
    )


def _assert_recipe_scores_and_one_null_document(
    scorer: GenerativeScorer,
    pairs: list[tuple[str, str]],
    scores: list[float],
    report: ScoreFileReport,
    line: int,
) -> None:
    """The written scores are the recipe's for ``pairs``, and the one bad row is at ``line``: a null document."""
    expected = official_qwen3_scores(scorer.model, scorer.tokenizer, pairs, max_length=512)
    assert scores == pytest.approx(expected, abs=2e-5)
    assert report.bad_rows_file is not None
    [bad] = read_jsonl(report.bad_rows_file)
    assert (bad["line"], bad["error"]) == (line, "'document' must be a string, got null")


def test_jsonl_rows_come_back_in_order_with_the_official_recipes_scores(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    rows = make_rows(23)
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    recording = RecordingScorer(scorer)
    options = ScoreFileOptions(
        input=source, output=tmp_path / "scored.jsonl", chunk_size=7, show_progress=False
    )
    report = score_file(options, config_of(scorer), recording)  # type: ignore[arg-type]

    out = read_jsonl(tmp_path / "scored.jsonl")
    assert [{k: v for k, v in row.items() if k != "score"} for row in out] == rows
    assert list(out[0]) == ["id", "query", "document", "meta", "score"]
    expected = official_qwen3_scores(
        scorer.model, scorer.tokenizer, [(r["query"], r["document"]) for r in rows], max_length=512
    )
    assert [row["score"] for row in out] == pytest.approx(expected, abs=2e-5)
    assert (report.rows_written, report.rows_scored, report.bad_rows) == (23, 23, 0)
    assert not (tmp_path / "scored.jsonl.partial").exists()
    # One scoring call per chunk, holding the chunk's rows; the pair path makes one job per query in it.
    assert [len(call) for call in recording.calls] == [7, 7, 7, 2]
    for call in recording.calls:
        assert len(scorer.prepare_pairs(call).jobs) == len({query for query, _ in call})


def test_csv_keeps_values_as_text_and_names_bad_rows_by_line(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    source = tmp_path / "pairs.csv"
    with open(source, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "query", "document"])
        writer.writerow(
            ["007", "capital of France", "Paris is the capital.\nIt is on the Seine."]
        )  # lines 2-3
        writer.writerow(["008", "capital of France", "Berlin"])  # line 4
        out.write("009,capital of France\n")  # line 5: a field short
        writer.writerow(["010", "tallest mountain", "Everest, in the Himalaya"])  # line 6
    output = tmp_path / "scored.csv"

    with pytest.raises(InvalidRequestError, match=r"1 bad row \(line 5: 2 fields, but the header has 3\)"):
        _score(source, output, scorer)
    assert not output.exists()

    options = ScoreFileOptions(
        input=source, output=output, on_bad_row="skip", restart=True, chunk_size=2, show_progress=False
    )
    report = score_file(options, config_of(scorer), scorer)
    with open(output, encoding="utf-8", newline="") as scored:
        written = list(csv.DictReader(scored))
    assert [row["id"] for row in written] == ["007", "008", "010"]
    assert written[0]["document"] == "Paris is the capital.\nIt is on the Seine."
    pairs = [(row["query"], row["document"]) for row in written]
    expected = official_qwen3_scores(scorer.model, scorer.tokenizer, pairs, max_length=512)
    assert [float(row["score"]) for row in written] == pytest.approx(expected, abs=2e-5)
    assert report.bad_rows == 1 and report.bad_rows_file is not None
    assert read_jsonl(report.bad_rows_file) == [
        {"line": 5, "error": "2 fields, but the header has 3", "input": "009,capital of France"}
    ]


def test_parquet_keeps_the_schema_and_lists_null_documents(tmp_path: Path, scorer: GenerativeScorer) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = make_rows(9)
    documents: list[str | None] = [row["document"] for row in rows]
    documents[4] = None
    table = pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.int32()),
            "query": [r["query"] for r in rows],
            "document": documents,
        }
    )
    source = tmp_path / "pairs.parquet"
    pq.write_table(table, source, row_group_size=4)
    output = tmp_path / "scored.parquet"
    options = ScoreFileOptions(
        input=source, output=output, chunk_size=3, on_bad_row="skip", show_progress=False
    )
    report = score_file(options, config_of(scorer), scorer)

    scored = pq.read_table(output)
    assert scored.schema.field("id").type == pa.int32() and scored.schema.field("score").type == pa.float64()
    assert scored.column("id").to_pylist() == [0, 1, 2, 3, 5, 6, 7, 8]
    pairs = [(r["query"], r["document"]) for r in rows if r["id"] != 4]
    _assert_recipe_scores_and_one_null_document(scorer, pairs, scored.column("score").to_pylist(), report, 5)


def test_every_bad_row_is_reported_and_none_is_dropped_silently(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    good = make_rows(6)
    lines = [json.dumps(row) for row in good[:2]]
    lines += ["", "{not json", json.dumps(["a", "list"]), json.dumps({"query": "q", "document": 5})]
    lines += [json.dumps(row) for row in good[2:4]]
    lines += [json.dumps({"query": "q"}), json.dumps({"query": "q", "document": "d", "score": 1})]
    lines += [json.dumps(row) for row in good[4:]]
    source = tmp_path / "pairs.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "scored.jsonl"

    with pytest.raises(InvalidRequestError) as failure:
        _score(source, output, scorer)
    for line in (4, 5, 6, 9, 10):
        assert f"line {line}:" in failure.value.message
    assert "pass on_bad_row='skip'" in failure.value.message

    options = ScoreFileOptions(
        input=source, output=output, on_bad_row="skip", chunk_size=4, restart=True, show_progress=False
    )
    report = score_file(options, config_of(scorer), scorer)
    assert [row["id"] for row in read_jsonl(output)] == [row["id"] for row in good]
    assert report.bad_rows_file is not None
    listed = read_jsonl(report.bad_rows_file)
    assert [(entry["line"], entry["error"]) for entry in listed] == [
        (4, "invalid JSON (Expecting property name enclosed in double quotes)"),
        (5, "expected a JSON object"),
        (6, "'document' must be a string, got int"),
        (9, "missing 'document'"),
        (10, "column 'score' is reserved for the output score (pick another with score_column=)"),
    ]
    assert listed[1]["input"] == '["a", "list"]'
    assert report.rows_written + report.bad_rows == len([line for line in lines if line])


def test_a_rerun_refuses_other_settings_and_an_existing_output(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(4))
    output = tmp_path / "scored.jsonl"
    work = tmp_path / "scored.jsonl.partial"
    work.mkdir()
    (work / "job.json").write_text(json.dumps({"version": 1, "chunk_size": 99}))
    (work / "part-00000000.jsonl").write_text("")  # a finished chunk: something to keep or refuse
    options = ScoreFileOptions(input=source, output=output, show_progress=False)
    with pytest.raises(JobStateError, match=r"differs in: .*chunk_size.*restart=True"):
        score_file(options, config_of(scorer), scorer)
    score_file(options.model_copy(update={"restart": True}), config_of(scorer), scorer)
    with pytest.raises(JobStateError, match="already exists; pass overwrite=True"):
        score_file(options, config_of(scorer), scorer)
    first = output.read_bytes()
    score_file(options.model_copy(update={"overwrite": True}), config_of(scorer), scorer)
    assert output.read_bytes() == first


def _genscore(*args: str) -> subprocess.CompletedProcess[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return subprocess.run([GENSCORE, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_bytes_of_an_uninterrupted_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(40))
    common = ["--model", str(tiny_model_dir), "--max-length", "512", "--device", "cpu", "--chunk-size", "6"]

    whole = _genscore("score", str(source), "-o", str(tmp_path / "whole.jsonl"), "--no-progress", *common)
    assert whole.returncode == 0, whole.stderr

    output = tmp_path / "resumed.jsonl"
    killed = _genscore("score", str(source), "-o", str(output), "--crash-after-chunks", "3", *common)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    work = tmp_path / "resumed.jsonl.partial"
    assert sorted(p.name for p in work.iterdir()) == [
        *(f"chunk-{k:08d}.json" for k in range(4)),  # each part's record, written before it
        "job.json",
        "part-00000000.jsonl",
        "part-00000001.jsonl",
        "part-00000002.jsonl",
        "part-00000003.jsonl.tmp",  # the chunk being written when the process died
    ]
    assert not output.exists()
    # The lock's file outlives a killed run; its lock does not (the kernel drops it).
    assert (tmp_path / "resumed.jsonl.lock").exists()

    resumed = _genscore("score", str(source), "-o", str(output), "--no-progress", *common)
    assert resumed.returncode == 0, resumed.stderr
    assert "wrote 40 rows" in resumed.stderr and "18 rows kept from an interrupted run" in resumed.stderr
    assert output.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert not work.exists() and not (tmp_path / "resumed.jsonl.lock").exists()


# -- input files as they come ---------------------------------------------------------------------------


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path, scorer: GenerativeScorer) -> None:
    bom = b"\xef\xbb\xbf"
    (tmp_path / "pairs.csv").write_bytes(bom + b"query,document\ncapital of France,Paris\n")
    (tmp_path / "pairs.jsonl").write_bytes(bom + b'{"query": "capital of France", "document": "Paris"}\n')
    expected = scorer.score_pairs([("capital of France", "Paris")])

    _score(tmp_path / "pairs.csv", tmp_path / "scored.csv", scorer)
    with open(tmp_path / "scored.csv", encoding="utf-8", newline="") as scored:
        [row] = list(csv.DictReader(scored))
    assert list(row) == ["query", "document", "score"]
    _score(tmp_path / "pairs.jsonl", tmp_path / "scored.jsonl", scorer)
    [line] = read_jsonl(tmp_path / "scored.jsonl")
    assert [float(row["score"]), line["score"]] == pytest.approx(expected * 2, abs=1e-6)


def test_a_csv_value_over_128_kib_is_a_row_like_any_other(tmp_path: Path, scorer: GenerativeScorer) -> None:
    document = "Paris is the capital of France. " * 10_000  # 320 KB; the scorer cuts it to --max-length
    source = tmp_path / "pairs.csv"
    with open(source, "w", encoding="utf-8", newline="") as out:
        csv.writer(out).writerows([["query", "document"], ["capital of France", document], ["q", "d"]])

    report = _score(source, tmp_path / "scored.csv", scorer, on_bad_row="skip")
    assert (report.rows_written, report.bad_rows) == (2, 0)  # the merge step counts the long row too
    assert csv.field_size_limit() == 128 * 1024  # raised only while the job reads
    csv.field_size_limit(1 << 20)
    try:
        with open(tmp_path / "scored.csv", encoding="utf-8", newline="") as scored:
            rows = list(csv.DictReader(scored))
    finally:
        csv.field_size_limit(128 * 1024)
    assert rows[0]["document"] == document
    expected = scorer.score_pairs([("capital of France", document), ("q", "d")])
    assert [float(row["score"]) for row in rows] == pytest.approx(expected, abs=1e-6)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe to hold the reader mid-parse")
def test_csv_read_elsewhere_meanwhile_keeps_the_default_field_limit(tmp_path: Path) -> None:
    """The job's reader used to raise the csv module's process-wide limit while it parsed: code reading
    CSV on another thread meanwhile took fields it had not asked to take. The input is a pipe, so the
    job's reader waits for its next line in the middle of parsing, deterministically."""
    import queue
    import threading

    from genscore_core.jobs import Columns, open_reader

    pipe = tmp_path / "pairs.csv"
    os.mkfifo(pipe)
    rows: queue.Queue[Any] = queue.Queue()

    def read_job_input() -> None:
        reader = open_reader(pipe, "csv", Columns())
        try:
            for row in reader:
                rows.put(row)
        finally:
            reader.close()

    job = threading.Thread(target=read_job_input, daemon=True)
    job.start()
    with open(pipe, "w", encoding="utf-8") as feed:
        feed.write(f"query,document\nq,{'long ' * 40_000}\n")  # a 200 KB field
        feed.flush()
        assert rows.get(timeout=30).document.startswith("long long")
        # The job's reader now waits inside the csv parser for its next line.
        seen = set()
        for _ in range(50):
            seen.add(csv.field_size_limit())
            threading.Event().wait(0.01)
        assert seen == {128 * 1024}
        with pytest.raises(csv.Error, match="field larger than field limit"):
            list(csv.reader([f"q,{'x' * 200_000}"]))
        feed.write("q,d\n")
    job.join(timeout=30)
    assert rows.get_nowait().document == "d"


def test_bytes_that_are_not_utf8_are_named_at_their_own_line(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    late = tmp_path / "late.csv"
    body = b"".join(b"q,doc %d\r\n" % i for i in range(1500))  # lines 2-1501
    late.write_bytes(b"query,document\r\n" + body + b'q,"two\nlines"\r\nq,bad \xff\r\n')  # 1502-3, 1504
    with pytest.raises(InputFileError, match=r"late\.csv, line 1504: not UTF-8 text"):
        _score(late, tmp_path / "late.out.csv", scorer)
    early = tmp_path / "early.csv"
    early.write_bytes(b"query,document\na,\xff\n")
    with pytest.raises(InputFileError, match=r"early\.csv, line 2: not UTF-8 text"):
        _score(early, tmp_path / "early.out.csv", scorer)


def test_a_carriage_return_ends_a_csv_line_and_stays_in_a_quoted_value(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    # Lines end as open(newline="") ends them: "\r" alone too. The output must quote a value's "\r".
    old_mac = tmp_path / "cr.csv"
    old_mac.write_bytes(b'query,document\rq,"one\rtwo"\rq,x,extra\r')
    with pytest.raises(InvalidRequestError, match=r"line 4: 3 fields"):
        _score(old_mac, tmp_path / "cr.out.csv", scorer)
    report = _score(old_mac, tmp_path / "cr.out.csv", scorer, on_bad_row="skip")
    with open(tmp_path / "cr.out.csv", encoding="utf-8", newline="") as scored:
        assert [row["document"] for row in csv.DictReader(scored)] == ["one\rtwo"]
    assert report.bad_rows == 1


@pytest.mark.parametrize(
    ("header", "named"), [("query,document,note,note", "'note'"), ("query,document,query", "'query'")]
)
def test_a_csv_header_naming_a_column_twice_is_refused(
    header: str, named: str, tmp_path: Path, scorer: GenerativeScorer
) -> None:
    source = tmp_path / "pairs.csv"
    source.write_text(f"{header}\n" + ",".join(["q", "d", "first", "second"][: header.count(",") + 1]) + "\n")
    with pytest.raises(InputFileError, match=f"more than one column is named {named}"):
        _score(source, tmp_path / "scored.csv", scorer)
    assert not (tmp_path / "scored.csv.partial").exists()


def test_lone_surrogates_from_json_escapes_are_written_back_as_escapes(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    source = tmp_path / "pairs.jsonl"
    source.write_text(
        '{"query": "q", "document": "ok", "note": "half a pair \\ud800"}\n'
        '{"query": "q", "document": "bad \\ud800"}\n'
    )
    report = _score(source, tmp_path / "scored.jsonl", scorer, on_bad_row="skip")
    [row] = read_jsonl(tmp_path / "scored.jsonl")
    assert row["note"] == "half a pair \ud800" and 0.0 <= row["score"] <= 1.0
    assert report.bad_rows_file is not None
    [bad] = read_jsonl(report.bad_rows_file)
    # Named by its column, as a row of the wrong type is: the scorer's "pairs[0][1]" is the row's
    # place in a call of the job's own making, which locates nothing in the file.
    assert bad["line"] == 2
    assert bad["error"].startswith("'document' is not valid text: it holds a lone surrogate U+D800"), bad
    assert json.loads(bad["input"]) == {"query": "q", "document": "bad \ud800"}


# -- reruns ---------------------------------------------------------------------------------------------


def test_a_run_that_stopped_before_its_first_chunk_does_not_block_the_corrected_rerun(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    rows = make_rows(4)
    source = write_jsonl(tmp_path / "pairs.jsonl", [*rows[:3], dict(rows[3], document=None)])
    output = tmp_path / "scored.jsonl"
    with pytest.raises(InvalidRequestError, match="line 4"):
        _score(source, output, scorer)
    write_jsonl(source, rows)
    os.utime(source, ns=(1, 1))  # another input as the record sees it, whatever the clock's resolution
    _score(source, output, scorer)
    assert [row["id"] for row in read_jsonl(output)] == [0, 1, 2, 3]

    # A mistyped --model fails once the work folder is there; the right one then starts afresh.
    retyped = tmp_path / "retyped.jsonl"
    typo = ScoreFileOptions(input=source, output=retyped, show_progress=False)
    with pytest.raises(ModelNotFoundError):
        score_file(typo, config_of(scorer).model_copy(update={"model": str(tmp_path / "no-such")}))
    _score(source, retyped, scorer)
    assert retyped.read_bytes() == output.read_bytes()


def test_an_output_that_cannot_be_written_is_one_line_and_exit_2(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(2))
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "scored.jsonl"
    argv = ["score", str(source), "-o", str(output), "--no-progress"]
    assert main([*argv, "--model", str(tiny_model_dir)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "cannot write the work folder" in error and "Not a directory" in error


def test_a_run_with_bad_rows_left_out_is_resumed_only_with_them_left_out(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    rows: list[Any] = make_rows(10)
    rows[5] = dict(rows[5], document=None)  # in the second chunk of 4
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    _score(source, tmp_path / "whole.jsonl", scorer, chunk_size=4, on_bad_row="skip")
    whole = (tmp_path / "whole.jsonl").read_bytes()

    output = tmp_path / "resumed.jsonl"
    skip = ScoreFileOptions(input=source, output=output, chunk_size=4, on_bad_row="skip", show_progress=False)
    fail = skip.model_copy(update={"on_bad_row": "fail"})
    with pytest.raises(KeyboardInterrupt):  # after two chunks, the second with line 6 left out
        score_file(skip, config_of(scorer), InterruptedScorer(scorer, at=2))  # type: ignore[arg-type]
    with pytest.raises(JobStateError, match="on_bad_row='skip' that left bad rows out"):
        score_file(fail, config_of(scorer), scorer)
    report = score_file(skip, config_of(scorer), scorer)
    assert (report.resumed_chunks, report.bad_rows) == (2, 1)
    assert output.read_bytes() == whole

    # The other way round is exact: a chunk that a fail run finished had no bad row to leave out.
    output.unlink()
    with pytest.raises(InvalidRequestError, match="line 6"):
        score_file(fail, config_of(scorer), scorer)
    report = score_file(skip, config_of(scorer), scorer)
    assert (report.resumed_chunks, report.bad_rows) == (1, 1)
    assert output.read_bytes() == whole


# -- messages name options the way the caller passes them ------------------------------------------------


def test_a_python_caller_is_told_format_and_the_command_line_is_told_flags(
    tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every message asking for an option used to spell it as a flag, also for ScoreFileOptions."""
    plain = write_jsonl(tmp_path / "pairs", make_rows(2))  # no extension to tell the format by
    with pytest.raises(InputFileError, match=r"pairs: cannot tell .* or pass format=$") as error:
        _score(plain, tmp_path / "scored", scorer)
    assert error.value.param == "format"
    taken = tmp_path / "taken.csv"
    taken.write_text("query,document,score\nq,d,1\n")
    with pytest.raises(InputFileError, match=r"output score \(pick another with score_column=\)"):
        _score(taken, tmp_path / "taken.out.csv", scorer)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "q"}])
    with pytest.raises(
        InvalidRequestError, match=r"line 1: missing 'document'\); fix them, or pass on_bad_row='skip'"
    ):
        _score(bad, tmp_path / "bad.out.jsonl", scorer)
    (tmp_path / "exists.jsonl").write_text("")
    with pytest.raises(JobStateError, match="already exists; pass overwrite=True to replace it"):
        _score(write_jsonl(tmp_path / "ok.jsonl", make_rows(1)), tmp_path / "exists.jsonl", scorer)

    def cli_error(*argv: str) -> str:
        args = ["score", *argv, "--model", str(tiny_model_dir), "--device", "cpu", "--no-progress"]
        assert main(args) == 2
        return capsys.readouterr().err

    assert cli_error(str(plain), "-o", str(tmp_path / "scored")).endswith("or pass --format\n")
    assert "(pick another with --score-column)" in cli_error(str(taken), "-o", str(tmp_path / "t.csv"))
    assert "or pass --on-bad-row skip to leave" in cli_error(str(bad), "-o", str(tmp_path / "b.jsonl"))
    exists = cli_error(str(tmp_path / "ok.jsonl"), "-o", str(tmp_path / "exists.jsonl"))
    assert "already exists; pass --overwrite to replace it" in exists


def test_detect_format_prints_a_url_as_given_and_asks_for_the_callers_option() -> None:
    from genscore_core.jobs import detect_format

    with pytest.raises(InputFileError, match=r"^s3://bucket/pairs: .* extension ''; .* or pass format=$"):
        detect_format("s3://bucket/pairs", None, "format=")
    assert detect_format("s3://bucket/pairs.CSV", None, "--format") == "csv"
    assert detect_format("s3://bucket/pairs", "parquet", "--format") == "parquet"


def test_an_output_that_is_a_folder_is_refused_before_anything_is_scored(
    tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to be found when the parts were joined, after every row was scored (even with
    overwrite), leaving OUTPUT.partial/ and OUTPUT.tmp behind."""
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(3))
    folder = tmp_path / "scored.jsonl"
    folder.mkdir()
    recording = RecordingScorer(scorer)
    for overwrite in (False, True):
        options = ScoreFileOptions(input=source, output=folder, overwrite=overwrite, show_progress=False)
        with pytest.raises(JobStateError, match=r"scored\.jsonl is a folder; the output is a file") as error:
            score_file(options, config_of(scorer), recording)  # type: ignore[arg-type]
        assert error.value.param == "output"
    assert recording.calls == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.jsonl", "scored.jsonl"]

    # The command line's summary counts in words that agree with the count.
    (tmp_path / "one.jsonl").write_text('{"query": "q", "document": "d"}\n{"query": "q"}\n')
    argv = ["score", str(tmp_path / "one.jsonl"), "-o", str(tmp_path / "one.out.jsonl"), "--no-progress"]
    assert main([*argv, "--on-bad-row", "skip", "--model", str(tiny_model_dir), "--device", "cpu"]) == 0
    summary = capsys.readouterr().err
    assert "wrote 1 row to" in summary and "1 bad row left out" in summary


def test_a_pandas_categorical_query_column_is_read_as_text(tmp_path: Path, scorer: GenerativeScorer) -> None:
    """pandas writes a categorical column (a natural way to hold a repeated query) as a dictionary of
    strings; it used to be refused as "holds dictionary<values=string, ...>, expected strings"."""
    pd = pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = make_rows(7)
    frame = pd.DataFrame(
        {
            "query": pd.Categorical([row["query"] for row in rows]),
            "document": pd.Categorical([None if row["id"] == 2 else row["document"] for row in rows]),
        }
    )
    source = tmp_path / "pairs.parquet"
    frame.to_parquet(source)
    assert str(pq.read_schema(source).field("query").type).startswith("dictionary<values=string")
    report = _score(source, tmp_path / "scored.parquet", scorer, chunk_size=3, on_bad_row="skip")

    scored = pd.read_parquet(tmp_path / "scored.parquet")
    kept = [row for row in rows if row["id"] != 2]
    assert list(scored["query"].astype(str)) == [row["query"] for row in kept]
    assert list(scored["document"].astype(str)) == [row["document"] for row in kept]
    pairs = [(row["query"], row["document"]) for row in kept]
    _assert_recipe_scores_and_one_null_document(scorer, pairs, list(scored["score"]), report, 3)


def test_a_json_key_given_twice_is_a_bad_row_not_a_lost_value(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    """json.loads keeps the last value of a repeated key: the row was scored with the second query
    and written without the first, without a word."""
    source = tmp_path / "pairs.jsonl"
    source.write_text(
        '{"query": "capital of France", "document": "Paris"}\n'
        '{"query": "capital of France", "query": "tallest mountain", "document": "Everest"}\n'
        '{"query": "q", "document": "d", "meta": {"tag": 1, "tag": 2}}\n'
    )
    with pytest.raises(
        InvalidRequestError, match=r"line 2: the key 'query' appears twice in one object; line 3"
    ):
        _score(source, tmp_path / "scored.jsonl", scorer)
    report = _score(source, tmp_path / "scored.jsonl", scorer, on_bad_row="skip", restart=True)
    assert [row["document"] for row in read_jsonl(tmp_path / "scored.jsonl")] == ["Paris"]
    assert report.bad_rows_file is not None
    assert [(bad["line"], bad["error"]) for bad in read_jsonl(report.bad_rows_file)] == [
        (2, "the key 'query' appears twice in one object"),
        (3, "the key 'tag' appears twice in one object"),
    ]


def test_a_csv_quote_never_closed_is_named_not_read_as_the_rest_of_the_file(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    """The csv module's default reads every line after an unclosed quote into that one value: the rows
    on them were scored as one document and lost without a word."""
    source = tmp_path / "pairs.csv"
    source.write_text('query,document\nq,fine\nq,"opened\nq,second\nq,third\n')
    with pytest.raises(
        InputFileError, match=r"line 3: a quoted value starts in this row and is never closed"
    ):
        _score(source, tmp_path / "scored.csv", scorer, on_bad_row="skip")
    source.write_text('query,document\nq,"said ""hi""\nthen left"\nq,d\n')  # quoted right: fine
    assert _score(source, tmp_path / "scored.csv", scorer).rows_written == 2


def nan_on_token_model(tiny_model_dir: Path, folder: Path, word: str) -> tuple[GenerativeScorer, int]:
    """The tiny model saved with NaN in the embedding of ``word``'s first token: the model scores NaN
    for a prompt holding it and as before for any other (the label rows of the head are untouched)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(tiny_model_dir, folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=512)
    token = scorer.tokenizer.encode(word, add_special_tokens=False)[0]
    assert token not in scorer.label_token_ids
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("nan")
    model.save_pretrained(folder)
    return GenerativeScorer(str(folder), device="cpu", dtype="float32", max_length=512), token


def test_a_row_the_model_scores_nan_is_named_by_line_and_listed_with_skip(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # The engine's error named "prompt 1" of its batch: neither the file nor the line of a row among
    # thousands; with on_bad_row='skip' the whole job stopped on it too.
    broken, _ = nan_on_token_model(tiny_model_dir, tmp_path / "nan-model", " zebra")
    lines = [
        {"id": 0, "query": "q1", "document": "apple"},
        {"id": 1, "query": "q2", "document": "banana"},
        None,  # a blank line: line numbers count it
        {"id": 2, "query": "q1", "document": "a zebra runs"},
        {"id": 3, "query": "q2", "document": "pear"},
        {"id": 4, "query": "q2", "document": "the zebra sleeps"},
        {"id": 5, "query": "q3", "document": "plum"},
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" if row else "\n" for row in lines), encoding="utf-8")
    output = tmp_path / "scored.jsonl"

    with pytest.raises(InvalidRequestError) as failure:
        score_file(ScoreFileOptions(input=source, output=output, show_progress=False), broken.config, broken)
    assert failure.value.message.startswith(
        f"{source}: 1 bad row (line 4: the model scored nan, not a finite"
    )
    assert not output.exists()

    options = ScoreFileOptions(
        input=source, output=output, on_bad_row="skip", chunk_size=4, restart=True, show_progress=False
    )
    report = score_file(options, broken.config, broken)
    good = [row for row in lines if row and "zebra" not in row["document"]]
    out = read_jsonl(output)
    assert [row["id"] for row in out] == [row["id"] for row in good]
    expected = official_qwen3_scores(
        broken.model, broken.tokenizer, [(row["query"], row["document"]) for row in good], max_length=512
    )
    assert [row["score"] for row in out] == pytest.approx(expected, abs=2e-5)
    assert report.bad_rows_file is not None
    listed = read_jsonl(report.bad_rows_file)
    assert [entry["line"] for entry in listed] == [4, 6]
    assert all(entry["error"].startswith("the model scored nan, not a finite") for entry in listed)
    assert json.loads(listed[1]["input"]) == lines[5]
    assert report.rows_written + report.bad_rows == len(good) + 2


def test_settings_that_fit_no_prompt_stop_the_job_instead_of_refusing_every_row(
    tmp_path: Path, scorer: GenerativeScorer, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Qwen3's template and instruction alone take 73 tokens: every row was "refused by the scorer",
    # so with on_bad_row='skip' the job ran to the end and wrote an empty output, all rows bad.
    # The scorer now refuses such settings when it is built, before any file is read or written.
    with pytest.raises(ValueError, match="max_length=64 leaves no room for a document"):
        GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=64)
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(5))
    output = tmp_path / "scored.jsonl"
    argv = ["score", str(source), "-o", str(output), "--model", str(tiny_model_dir), "--device", "cpu"]
    code = main([*argv, "--max-length", "64", "--on-bad-row", "skip", "--no-progress"])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("genscore: error: max_length=64 leaves no room for a document")
    assert not output.exists()
    assert not (tmp_path / "scored.jsonl.bad-rows.jsonl").exists()


class CountingScorer(RecordingScorer):
    """The real scorer, counting the pairs whose prompts it was asked to build."""

    prepared = 0

    def prepare_pairs(self, pairs: list[tuple[str, str]]) -> Any:
        self.prepared += len(pairs)
        return super().prepare_pairs(pairs)


def test_many_refused_rows_are_found_in_time_linear_in_the_chunk(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    # Each refusal was found by building the prompts of all the query's rows left, again: n^2 / 2
    # prompts for a chunk of n refused rows (hours for the default 4096).
    from genscore_core import PromptTemplate

    bare = PromptTemplate(name="bare", body="{query}{document}", label_words=("yes", "no"))
    bare_scorer = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, template=bare, max_length=64)
    rows = [{"id": i, "query": "", "document": "" if i % 10 else f"word {i}"} for i in range(200)]
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    counting = CountingScorer(bare_scorer)
    options = ScoreFileOptions(
        input=source, output=tmp_path / "scored.jsonl", on_bad_row="skip", chunk_size=200, show_progress=False
    )
    report = score_file(options, bare_scorer.config, counting)  # type: ignore[arg-type]
    assert counting.prepared <= 3 * len(rows)
    assert [row["id"] for row in read_jsonl(tmp_path / "scored.jsonl")] == list(range(0, 200, 10))
    assert report.bad_rows == 180
    listed = read_jsonl(tmp_path / "scored.jsonl.bad-rows.jsonl")
    assert [entry["line"] for entry in listed] == [i + 1 for i in range(200) if i % 10]
    assert all("its prompt holds no token" in entry["error"] for entry in listed)


def test_nan_infinity_and_overflowing_numbers_are_bad_rows_not_invalid_output(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    # Python's JSON reader takes NaN and Infinity and reads 1e400 as infinity; the output line then
    # held NaN or Infinity, which strict readers refuse: a valid line (1e400) came back invalid.
    lines = [
        '{"id": 0, "query": "q", "document": "d", "x": 1.5, "big": 123456789012345678901234567890}',
        '{"id": 1, "query": "q", "document": "d", "x": NaN}',
        '{"id": 2, "query": "q", "document": "d", "x": 1e400}',
        '{"id": 3, "query": "q", "document": "d", "x": [-Infinity]}',
        '{"id": 4, "query": "q", "document": "d", "x": -1e-400}',
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "scored.jsonl"
    with pytest.raises(InvalidRequestError) as failure:
        _score(source, output, scorer)
    assert "3 bad rows (line 2: NaN is not a JSON value" in failure.value.message

    options = ScoreFileOptions(input=source, output=output, on_bad_row="skip", show_progress=False)
    report = score_file(options, config_of(scorer), scorer)

    def strict(constant: str) -> Any:
        raise AssertionError(f"{constant} in the output")

    out = [
        json.loads(line, parse_constant=strict) for line in output.read_text(encoding="utf-8").splitlines()
    ]
    assert [(row["id"], row["x"]) for row in out] == [(0, 1.5), (4, -0.0)]
    assert out[0]["big"] == 123456789012345678901234567890
    assert report.bad_rows_file is not None
    assert [(entry["line"], entry["error"]) for entry in read_jsonl(report.bad_rows_file)] == [
        (2, "NaN is not a JSON value (write null or a string)"),
        (3, "the number 1e400 is too large for a float (write it as a string)"),
        (4, "-Infinity is not a JSON value (write null or a string)"),
    ]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"document_column": "query"}, "query_column and document_column both name the column 'query'"),
        ({"score_column": "document"}, "document_column and score_column both name the column 'document'"),
    ],
)
def test_options_refuse_two_fields_naming_one_column(
    tmp_path: Path, columns: dict[str, str], message: str
) -> None:
    # Only the command line checked this: from Python every row was bad, and with on_bad_row="skip"
    # score_file wrote an empty output without an error.
    with pytest.raises(ValueError, match=message):
        ScoreFileOptions(input=tmp_path / "in.jsonl", output=tmp_path / "out.jsonl", **columns)


# -- resuming proves what it keeps: the input hashed, each part checked, one run at a time -------------

CLI_SETTINGS = ["--device", "cpu", "--dtype", "float32", "--max-length", "512", "--no-progress"]


def _interrupted(options: ScoreFileOptions, scorer: GenerativeScorer, chunks: int) -> None:
    """Run ``options`` until ``chunks`` chunks are finished, then stop it as Ctrl-C does."""
    with pytest.raises(KeyboardInterrupt):
        score_file(options, config_of(scorer), InterruptedScorer(scorer, at=chunks))  # type: ignore[arg-type]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".jsonl":
        return write_jsonl(path, rows)
    if path.suffix == ".csv":
        path.write_text(
            "id,query,document\n" + "".join(f"{r['id']},{r['query']},{r['document']}\n" for r in rows)
        )
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("id", "query", "document")} for r in rows]), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_an_input_edited_under_a_kept_chunk_is_refused_whatever_its_size_and_mtime(
    tmp_path: Path, scorer: GenerativeScorer, suffix: str
) -> None:
    """An edit that kept both (cp -p, rsync -t of a regenerated file) resumed with stale scores, exit 0."""
    rows = make_rows(12)
    source = _write(tmp_path / f"pairs{suffix}", rows)
    output = tmp_path / f"scored{suffix}"
    options = ScoreFileOptions(input=source, output=output, chunk_size=4, show_progress=False)
    _interrupted(options, scorer, chunks=2)

    before = source.stat()
    # Same length, one letter changed, in the second chunk (rows 4 to 7).
    edited = [
        dict(row, document=row["document"].replace("a", "o", 1)) if row["id"] == 5 else row for row in rows
    ]
    assert edited != rows
    _write(source, edited)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    if suffix != ".parquet":  # a Parquet file's size may move with its compression; refused all the same
        assert source.stat().st_size == before.st_size
    assert source.stat().st_mtime_ns == before.st_mtime_ns

    recording = RecordingScorer(scorer)
    where = "lines 6-9" if suffix == ".csv" else "lines 5-8"
    with pytest.raises(
        InputChangedError, match=rf"pairs\{suffix} changed .* chunk 1 \({where}\).*restart=True"
    ):
        score_file(options, config_of(scorer), recording)  # type: ignore[arg-type]
    assert recording.calls == []  # refused before anything was scored
    assert not output.exists()

    # Restarting scores the edited input afresh, as a fresh run does.
    score_file(options.model_copy(update={"restart": True}), config_of(scorer), scorer)
    fresh = tmp_path / f"fresh{suffix}"
    score_file(options.model_copy(update={"output": fresh}), config_of(scorer), scorer)
    assert output.read_bytes() == fresh.read_bytes()


def test_an_input_that_lost_rows_of_kept_chunks_is_refused(tmp_path: Path, scorer: GenerativeScorer) -> None:
    rows = make_rows(12)
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    options = ScoreFileOptions(input=source, output=tmp_path / "o.jsonl", chunk_size=4, show_progress=False)
    _interrupted(options, scorer, chunks=2)
    write_jsonl(source, rows[:4])  # chunk 1 (rows 4 to 7) is gone
    with pytest.raises(InputChangedError, match=r"now ends before chunk 1 \(line 5 then\)"):
        score_file(options, config_of(scorer), scorer)


def test_the_command_line_says_a_changed_input_with_exit_code_4(
    tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = make_rows(8)
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "scored.jsonl"
    _interrupted(ScoreFileOptions(input=source, output=output, chunk_size=4, show_progress=False), scorer, 1)
    write_jsonl(source, [dict(rows[0], query="capital of Frence"), *rows[1:]])
    argv = ["score", str(source), "-o", str(output), "--chunk-size", "4", "--model", str(tiny_model_dir)]
    assert main([*argv, *CLI_SETTINGS]) == 4
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert "changed since an earlier run scored its chunk 0 (lines 1-4)" in error and "--restart" in error


def test_damaged_parts_are_scored_again_and_the_output_is_a_fresh_runs(
    tmp_path: Path, scorer: GenerativeScorer
) -> None:
    """Half a part gave "wrote 973 rows" for 1,000 inputs and an emptied one "wrote 950 rows", exit 0."""
    rows = make_rows(18)  # chunks of 4: 4, 4, 4, 4, 2
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "scored.jsonl"
    options = ScoreFileOptions(input=source, output=output, chunk_size=4, show_progress=False)
    score_file(options.model_copy(update={"output": tmp_path / "fresh.jsonl"}), config_of(scorer), scorer)

    _interrupted(options, scorer, chunks=4)
    work = tmp_path / "scored.jsonl.partial"
    parts = sorted(work.glob("part-*.jsonl"))
    assert len(parts) == 4
    parts[0].write_bytes(parts[0].read_bytes()[: parts[0].stat().st_size // 2])  # truncated
    parts[1].write_bytes(b"")  # emptied
    same_size = parts[2].read_bytes()
    digit = same_size.index(b'"score": 0.') + len(b'"score": 0.')
    flipped = b"1" if same_size[digit : digit + 1] != b"1" else b"2"
    parts[2].write_bytes(same_size[:digit] + flipped + same_size[digit + 1 :])  # edited, same size

    recording = RecordingScorer(scorer)
    report = score_file(options, config_of(scorer), recording)  # type: ignore[arg-type]
    assert (report.resumed_chunks, report.rescored_chunks) == (1, 3)
    assert (report.rows_written, report.rows_scored) == (18, 14)
    scored = sorted(pair for call in recording.calls for pair in call)
    assert scored == sorted((row["query"], row["document"]) for row in rows[:12] + rows[16:])
    assert output.read_bytes() == (tmp_path / "fresh.jsonl").read_bytes()


def test_the_command_line_counts_the_damaged_parts_it_scored_again(
    tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(8))
    output = tmp_path / "scored.jsonl"
    _interrupted(ScoreFileOptions(input=source, output=output, chunk_size=4, show_progress=False), scorer, 1)
    (tmp_path / "scored.jsonl.partial" / "part-00000000.jsonl").write_bytes(b"")
    argv = ["score", str(source), "-o", str(output), "--chunk-size", "4", "--model", str(tiny_model_dir)]
    assert main([*argv, *CLI_SETTINGS]) == 0
    said = capsys.readouterr().err
    assert said.startswith("genscore: wrote 8 rows to") and said.endswith(
        " (1 damaged part of an interrupted run scored again)\n"
    ), said
    assert len(output.read_text().splitlines()) == 8


_HOLD_LOCK = """
import sys
from pathlib import Path
from genscore_core.jobs.lock import job_lock
with job_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_run_of_one_job_is_refused_while_the_first_holds_it(
    tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", make_rows(6))
    output = tmp_path / "scored.jsonl"
    options = ScoreFileOptions(input=source, output=output, chunk_size=2, show_progress=False)

    # Another process runs the job: this one is turned away, whatever stage that one is at.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(output)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(
            JobLockedError, match=rf"another run of this job \(pid {holder.pid} on .*\) is writing"
        ):
            score_file(options, config_of(scorer), scorer)
        argv = ["score", str(source), "-o", str(output), "--model", str(tiny_model_dir), *CLI_SETTINGS]
        assert main(argv) == 5
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"pid {holder.pid}" in error and "wait for it to end" in error
        assert not (tmp_path / "scored.jsonl.partial").exists() and not output.exists()
    finally:
        holder.communicate("", timeout=30)

    # A second run started while the first is scoring (here: from inside its scoring call) is refused,
    # so the two cannot both merge; the first one finishes and lets go of the lock.
    refusals: list[str] = []

    class SecondRunMidway(RecordingScorer):
        def score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
            if not self.calls:
                with pytest.raises(JobLockedError) as second:
                    score_file(options, config_of(scorer), scorer)
                refusals.append(str(second.value))
            return super().score_pairs(pairs)

    report = score_file(options, config_of(scorer), SecondRunMidway(scorer))  # type: ignore[arg-type]
    assert report.rows_written == 6 and len(refusals) == 1 and f"pid {os.getpid()}" in refusals[0]
    assert not (tmp_path / "scored.jsonl.lock").exists()
    score_file(options.model_copy(update={"overwrite": True}), config_of(scorer), scorer)  # free again
