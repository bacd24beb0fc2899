"""``genscore rerank`` on odd input, run as users run it: the console script in a subprocess."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.recipe_ranking import RecipeReference, assert_ranked_like_recipe

GENSCORE = shutil.which("genscore")
QUERY = "capital of France"
TEXTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]


def _as_from_a_terminal() -> None:
    """In the child, before genscore starts: Ctrl-C as a terminal delivers it (the default action,
    not blocked). A child inherits an ignored or blocked SIGINT from its parent, and the pytest
    worker that starts it may have had one left so by an earlier test's library (in a full CI run
    all three Ctrl-C tests saw genscore run to the end and exit 0)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.getcwd(), **extra}


def _command(model: Path, *args: str | bytes) -> list[str | bytes]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return [GENSCORE, "rerank", "--model", str(model), "--max-length", "512", "--no-progress", *args]


def _run(
    model: Path, *args: str | bytes, stdin: bytes = b"", **env: str
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        _command(model, *args), input=stdin, capture_output=True, timeout=300, env=_env(**env)
    )


def _expect_ranked(result: subprocess.CompletedProcess[bytes], model: Path, texts: list[str]) -> list[dict]:
    """The output ranks ``texts`` as the official recipe does on ``model`` (scores and order)."""
    assert result.returncode == 0, result.stderr.decode()
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    reference = RecipeReference(model).scores(QUERY, texts, max_length=512)
    assert_ranked_like_recipe([(line["index"], line["score"]) for line in lines], reference)
    for line in lines:
        assert line["text"] == texts[line["index"]]
    return lines


@pytest.mark.slow
def test_a_byte_order_mark_is_not_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"\xef\xbb\xbf" + "\n".join(TEXTS).encode() + b"\n")
    _expect_ranked(_run(tiny_model_dir, "--query", QUERY, "--documents", str(plain)), tiny_model_dir, TEXTS)
    lines = b"\xef\xbb\xbf" + b"\n".join(json.dumps({"text": t}).encode() for t in TEXTS)
    _expect_ranked(_run(tiny_model_dir, "--query", QUERY, stdin=lines), tiny_model_dir, TEXTS)


@pytest.mark.slow
def test_a_json_array_is_read_as_documents(tiny_model_dir: Path, tmp_path: Path) -> None:
    strings = tmp_path / "strings.json"
    strings.write_text(json.dumps(TEXTS, indent=2))
    _expect_ranked(_run(tiny_model_dir, "--query", QUERY, "--documents", str(strings)), tiny_model_dir, TEXTS)
    records = [{"text": t, "id": f"doc-{i}"} for i, t in enumerate(TEXTS)]
    lines = _expect_ranked(
        _run(tiny_model_dir, "--query", QUERY, stdin=json.dumps(records).encode()), tiny_model_dir, TEXTS
    )
    assert all(line["id"] == f"doc-{line['index']}" for line in lines)


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        (b'["one", 2]', "stdin, element 1: expected a string or an object with a string 'text' field"),
        (b'["one",\n "two"', "stdin: starts with '[' but is not one JSON array"),
        (b'{"text": "bad \\ud800 escape"}', "stdin, line 1: the document is not valid text: it holds a lone"),
        (b'["ok", "bad \\ud800"]', "stdin, element 1: the document is not valid text: it holds a lone"),
    ],
)
def test_bad_input_is_one_line(tiny_model_dir: Path, stdin: bytes, message: str) -> None:
    result = _run(tiny_model_dir, "--query", QUERY, stdin=stdin)
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("locale", ["C", "POSIX"])
def test_invalid_bytes_are_not_utf8_text_under_the_c_locale(tiny_model_dir: Path, locale: str) -> None:
    result = _run(
        tiny_model_dir, "--query", QUERY, stdin=b"good line\nbad \xff\n", LC_ALL=locale, LANG=locale
    )
    assert (result.returncode, result.stderr) == (2, b"genscore: error: stdin, line 2: not UTF-8 text\n")
    result = _run(tiny_model_dir, "--query", b"bad \xff query", stdin=b"fine\n", LC_ALL=locale, LANG=locale)
    assert (result.returncode, result.stderr) == (2, b"genscore: error: --query is not UTF-8 text\n")


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(tiny_model_dir: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails
    try:
        result = subprocess.run(
            _command(tiny_model_dir, "--query", QUERY),
            input="\n".join(TEXTS).encode(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=300,
            env=_env(),
        )
    finally:
        os.close(write_end)
    assert result.stderr == b""
    assert result.returncode == 141


@pytest.mark.slow
def test_head_one_reads_the_best_line_and_nothing_else_is_said(tiny_model_dir: Path, tmp_path: Path) -> None:
    documents = tmp_path / "many.txt"
    # About 100 KB of output: more than a pipe holds, so the writer meets the closed pipe.
    documents.write_text("\n".join(f"document {i} about {'France ' * (i % 7)}" for i in range(1000)) + "\n")
    command = " ".join(
        [str(GENSCORE), "rerank", "--model", str(tiny_model_dir), "--max-length", "128", "--no-progress",
         "--query", "France", "--documents", str(documents), "| head -1"]
    )  # fmt: skip
    result = subprocess.run(["bash", "-c", command], capture_output=True, timeout=300, env=_env())
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 1 and json.loads(result.stdout)["index"] >= 0
    assert result.stderr == b""


@pytest.mark.slow
def test_ctrl_c_stops_with_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    documents = tmp_path / "long.txt"
    documents.write_text(
        "\n".join(f"{i} " + "a long document about many things " * 60 for i in range(4000)) + "\n"
    )
    assert GENSCORE is not None
    process = subprocess.Popen(
        [GENSCORE, "rerank", "--model", str(tiny_model_dir), "--max-length", "512", "--query", "things",
         "--documents", str(documents)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    assert process.stderr is not None
    seen = b""
    while b"scoring" not in seen:  # the progress bar: the forward has started
        chunk = process.stderr.read1(4096)
        assert chunk, f"genscore ended before scoring: {seen.decode(errors='replace')}"
        seen += chunk
    process.send_signal(signal.SIGINT)
    rest, more = process.communicate(timeout=300)
    stderr = (seen + more).decode(errors="replace")
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    said = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("genscore")]
    assert said == ["genscore: interrupted"]
    assert rest == b""


@pytest.mark.slow
def test_ctrl_c_in_genscore_score_says_how_to_resume_and_the_rerun_does(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    texts = [f"document {i} about things" for i in range(2000)]
    rows.write_text(
        "".join(json.dumps({"query": f"q{i // 10}", "document": t}) + "\n" for i, t in enumerate(texts))
    )
    output = tmp_path / "scored.jsonl"
    command = [GENSCORE, "score", str(rows), "-o", str(output), "--model", str(tiny_model_dir), "--max-length", "512",
               "--chunk-size", "64"]  # fmt: skip
    process = subprocess.Popen(  # type: ignore[call-overload]
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), preexec_fn=_as_from_a_terminal
    )
    first_chunk = output.with_name("scored.jsonl.partial") / "part-00000000.jsonl"
    while not first_chunk.exists():
        assert process.poll() is None, process.communicate()[1].decode()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)
    stderr = err.decode(errors="replace")
    assert process.returncode == 130, stderr
    said = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("genscore")]
    # Before: "genscore: interrupted", as rerank says it, whose work is lost.
    assert said == [
        f"genscore: interrupted; finished chunks are kept in {output}.partial: rerun the same command to resume"
    ]
    assert out == b"" and not output.exists()
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env())
    assert rerun.returncode == 0, rerun.stderr
    assert "rows kept from an interrupted run" in rerun.stderr
    assert [json.loads(line)["document"] for line in output.read_text().splitlines()] == texts


# -- --queries streams: each query is answered as it is read ----------------------------------------------

STREAMED = [
    {"query": QUERY, "id": "first", "documents": TEXTS},
    {"query": "Which river flows through Paris?", "documents": ["The Seine.", "The Rhine.", "The Po."]},
    {"query": "food in Lyon", "documents": TEXTS[::-1]},
]


def _expect_query(lines: list[dict], number: int, model: Path, top_n: int | None = None) -> None:
    """``lines`` are query ``number`` of STREAMED ranked as the official recipe ranks it."""
    query = STREAMED[number]
    assert [line["query_index"] for line in lines] == [number] * len(lines)
    assert all(line.get("query_id") == query.get("id") for line in lines)
    reference = RecipeReference(model).scores(query["query"], query["documents"], max_length=512)
    assert_ranked_like_recipe([(line["index"], line["score"]) for line in lines], reference, top_n=top_n)
    assert [line["text"] for line in lines] == [query["documents"][line["index"]] for line in lines]


def _read_line(process: subprocess.Popen[bytes]) -> dict:
    """The next output line; failing, not hanging, when none comes (a reader that waits for EOF)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 120)
    assert ready, "no output line while the input is still open"
    line = process.stdout.readline()
    assert line, process.stderr.read().decode() if process.stderr else "no output"
    parsed: dict = json.loads(line)
    return parsed


def _piped(model: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _command(model, "--queries", "-", *args),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
        preexec_fn=_as_from_a_terminal,
        bufsize=0,  # a buffered reader would take the next lines into its buffer, where select cannot see them
    )  # fmt: skip


def _send(process: subprocess.Popen[bytes], query: dict) -> None:
    assert process.stdin is not None
    process.stdin.write(json.dumps(query).encode() + b"\n")
    process.stdin.flush()


def test_a_piped_query_is_answered_before_the_next_is_sent(tiny_model_dir: Path) -> None:
    process = _piped(tiny_model_dir, "--top-n", "2")
    try:
        # Before: every query was read up to EOF before any was scored; nothing came while stdin was open.
        for number in range(2):
            _send(process, STREAMED[number])
            _expect_query([_read_line(process), _read_line(process)], number, tiny_model_dir, top_n=2)
        out, err = process.communicate(b"", timeout=300)
    finally:
        process.kill()
    assert (process.returncode, out, err) == (0, b"", b"")


def test_ctrl_c_between_queries_keeps_their_results_and_says_how_many(tiny_model_dir: Path) -> None:
    process = _piped(tiny_model_dir)
    try:
        _send(process, STREAMED[0])
        first = [_read_line(process) for _ in STREAMED[0]["documents"]]
        process.send_signal(signal.SIGINT)  # waiting for the second query
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    _expect_query(first, 0, tiny_model_dir)
    assert (process.returncode, out) == (130, b"")
    assert err.decode().splitlines() == ["genscore: interrupted; results written for 1 query"]


@pytest.mark.parametrize(
    ("third", "message"),
    [
        (b'{"query": "q", "documents": ["a"]', "line 3: invalid JSON"),
        (b'{"query": "caf\xe9", "documents": ["a"]}', "line 3: not UTF-8 text"),
        (b'{"query": "q", "documents": ["a"], "top_n": 1}', "line 3: unknown field 'top_n'"),
        # A lone surrogate, written as a JSON escape: valid JSON, not valid text.
        (b'{"query": "q", "documents": ["a", "bad \\ud800"]}', "line 3, element 1: "),
    ],
)
def test_a_bad_line_after_good_ones_keeps_their_results_and_is_named(
    third: bytes, message: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_bytes(b"".join(json.dumps(q).encode() + b"\n" for q in STREAMED[:2]) + third + b"\n")
    result = _run(tiny_model_dir, "--queries", str(path))
    # Before: the error came before any scoring, and the two good queries' results were lost.
    assert result.returncode == 2
    errors = result.stderr.decode().splitlines()
    assert len(errors) == 1 and f"{path}, {message}" in errors[0], errors
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [line["query_index"] for line in lines] == [0, 0, 0, 1, 1, 1]
    _expect_query(lines[:3], 0, tiny_model_dir)
    _expect_query(lines[3:], 1, tiny_model_dir)
