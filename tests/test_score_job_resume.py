"""A resumed ``genscore score`` keeps only what it can prove: the input each finished chunk was scored
from (hashed, not its size and modification time), each finished part intact (a damaged one is scored
again), and one run at a time per job (a lock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genscore_core import GenerativeScorer
from genscore_core.cli import main
from genscore_core.errors import InputChangedError, JobLockedError
from genscore_core.jobs import ScoreFileOptions, score_file
from tests.test_score_job import InterruptedScorer, RecordingScorer, config_of, make_rows, write_jsonl

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
    assert "wrote 8 rows" in capsys.readouterr().err
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
