"""What a user of the ``genscore`` command sees: help on every flag, a fast ``--help`` and
``--version``, several queries in one run, ``--format``, a progress bar per document with the time
left, and ``make-tiny-model`` that keeps a folder it would overwrite."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import genscore_core.scorer
from genscore_core import GenerativeScorer
from genscore_core.cli import QueryRecord, build_parser, main, rank_queries
from tests.helpers.reference_recipe import official_qwen3_scores

GENSCORE = shutil.which("genscore")
COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return subprocess.run([GENSCORE, *args], input=stdin, capture_output=True, text=True, timeout=300)


def entries_without_help(help_text: str) -> list[str]:
    """The arguments ``--help`` lists with no description: an entry line (two spaces, then the
    argument) with nothing after it, and no deeper-indented line below it carrying its help."""
    lines = help_text.splitlines()
    missing = []
    for number, line in enumerate(lines):
        entry = re.match(r"^  (\S(?:\S| (?! ))*)(?: {2,}(\S.*))?$", line)
        if entry is None or line.endswith(":"):
            continue
        described = entry.group(2) is not None
        following = lines[number + 1] if number + 1 < len(lines) else ""
        if not described and not re.match(r"^ {4,}\S", following):
            missing.append(entry.group(1))
    return missing


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0
    out: str = capsys.readouterr().out
    return out


def test_the_help_parser_sees_a_missing_description() -> None:
    text = "options:\n  -h, --help            show this help\n  --query QUERY\n  --seed SEED           the seed\n"
    assert entries_without_help(text) == ["--query QUERY"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_flag_has_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(capsys, *([command] if command else []))
    assert entries_without_help(text) == []
    parser = build_parser()
    if command is not None:
        parser = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    for action in parser._actions:
        assert action.help, f"{command}: {action.option_strings or action.dest} has no help"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"genscore \S+\n", capsys.readouterr().out)


def test_help_and_version_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from genscore_core.cli import main\n"
        f"for args in ([['--version'], ['--help']] + [[c, '--help'] for c in {COMMANDS!r}]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as done:\n"
        "        assert done.code == 0, (args, done.code)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


# -- several queries in one run -------------------------------------------------------------------------

QUERIES = [
    {"query": "Which river flows through Paris?", "id": "q-paris", "documents": [
        "The Seine flows through Paris.", "Berlin lies on the Spree.", {"text": "The Loire is long.", "src": "a"},
    ]},
    {"query": "What do bakeries sell?", "documents": ["Croissants and bread.", "Rivers and lakes."]},
    {"query": "Where is the Thames?", "id": 7, "documents": [{"text": "The Thames flows through London."}]},
]  # fmt: skip


def _text(document: str | dict[str, Any]) -> str:
    return document if isinstance(document, str) else document["text"]


@pytest.mark.slow
def test_several_queries_in_one_run_score_as_the_official_recipe(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUERIES) + "\n\n")
    result = _run(
        "rerank", "--queries", str(path), "--model", str(tiny_model_dir), "--max-length", "512",
        "--dtype", "float32", "--device", "cpu", "--top-n", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = []
    for number, query in enumerate(QUERIES):
        texts = [_text(d) for d in query["documents"]]
        scores = official_qwen3_scores(model, tokenizer, [(query["query"], t) for t in texts], max_length=512)
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[:2]
        for index in order:
            document = query["documents"][index]
            line = {"query_index": number, **({"query_id": query["id"]} if "id" in query else {})}
            line |= {"index": index, "score": scores[index], "truncated": False}
            expected.append(line | (document if isinstance(document, dict) else {"text": document}))
    assert [{k: v for k, v in line.items() if k != "score"} for line in lines] == [
        {k: v for k, v in line.items() if k != "score"} for line in expected
    ]
    assert [line["score"] for line in lines] == pytest.approx([line["score"] for line in expected], abs=1e-5)


def test_the_model_is_loaded_once_for_all_queries(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loads: list[str] = []
    real = genscore_core.scorer.load_causal_lm

    def counted(name: str, **options: Any) -> Any:
        loads.append(name)
        return real(name, **options)

    monkeypatch.setattr(genscore_core.scorer, "load_causal_lm", counted)
    path = tmp_path / "queries.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUERIES))
    assert main(["rerank", "--queries", str(path), "--model", str(tiny_model_dir), "--no-progress"]) == 0
    assert loads == [str(tiny_model_dir)]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query_index"] for line in lines] == [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"query": "q"}', "line 1: expected a non-empty 'documents' array"),
        ('{"query": "q", "documents": []}', "line 1: expected a non-empty 'documents' array"),
        ('\n{"documents": ["a"]}', "line 2: expected a string 'query' field"),
        ('{"query": "q", "documents": [1]}', "line 1, element 0: expected a string or an object"),
        ('{"query": "q", "documents": ["a"], "top": 1}', "line 1: unknown field 'top'"),
        ('{"query": "q", "documents": [{"text": "a", "score": 1}]}', "field 'score' is reserved"),
        ("not json", "line 1: invalid JSON"),
        ('\n{"query": "q", "id": NaN, "documents": ["a"]}', "line 2: NaN is not"),
        ("", "no queries to rerank for"),
    ],
)
def test_a_bad_queries_file_is_one_line_naming_the_place(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_text(content)
    # The first query is read before the model is loaded: the model named here does not exist.
    # (A bad line after a good one comes after that query's results: tests/robustness/test_cli_input.py.)
    assert main(["rerank", "--queries", str(path), "--model", str(tmp_path / "no-model")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"text": "ok"}\n\n{"text": "bad \\ud800"}\n', ", line 3: "),  # a blank line before it
        ('["ok", "bad \\ud800"]', ", element 1: "),
    ],
)
def test_a_document_the_scorer_refuses_is_named_by_its_line(
    content: str, where: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "documents.jsonl"
    path.write_text(content)
    argv = ["rerank", "--query", "q", "--documents", str(path), "--no-progress"]
    assert main([*argv, "--model", str(tiny_model_dir)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{path}{where}" in error and "lone surrogate" in error, error


@pytest.mark.parametrize(
    ("flag", "content", "line"),
    [
        ("--documents", b"fine\n\nfine too\ncaf\xe9 au lait\n", 4),  # text lines
        ("--documents", b'{"text": "fine"}\n{"text": "caf\xe9"}\n', 2),  # JSON lines
        ("--documents", b'\n["fine",\n "fine too",\n "caf\xe9"]\n', 4),  # one JSON array
        ("--queries", b'\n{"query": "caf\xe9", "documents": ["a"]}\n', 2),
    ],
)
def test_bytes_that_are_not_utf8_are_named_by_their_line(
    flag: str, content: bytes, line: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin-1"
    path.write_bytes(content)
    query = ["--query", "q"] if flag == "--documents" else []
    # Read before any model is loaded: the model named here does not exist.
    assert main(["rerank", *query, flag, str(path), "--model", str(tmp_path / "no-model")]) == 2
    assert capsys.readouterr().err == f"genscore: error: {path}, line {line}: not UTF-8 text\n"


def test_query_and_queries_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["rerank", "--query", "q", "--queries", "f.jsonl"])
    assert done.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# -- --format ---------------------------------------------------------------------------------------------

BRACE_LINES = '{not JSON, a document about braces}\n{"text": "this line is text too"}\nplain words\n'


@pytest.mark.slow
def test_format_text_reads_lines_starting_with_a_brace_as_text(tiny_model_dir: Path) -> None:
    args = ["rerank", "--model", str(tiny_model_dir), "--query", "braces", "--no-progress"]
    auto = _run(*args, stdin=BRACE_LINES)
    assert auto.returncode == 2 and "line 1: invalid JSON" in auto.stderr
    forced = _run(*args, "--format", "text", stdin=BRACE_LINES)
    assert forced.returncode == 0, forced.stderr
    texts = {json.loads(line)["text"] for line in forced.stdout.splitlines()}
    assert texts == set(BRACE_LINES.splitlines())


@pytest.mark.parametrize(
    ("input_format", "stdin", "message"),
    [
        ("jsonl", "plain words\n", "line 1: invalid JSON"),
        ("json", '{"text": "a"}\n', "expected one JSON array of documents"),
        ("json", "[1, 2", "is not one JSON array"),
    ],
)
def test_a_forced_format_is_held_to(
    input_format: str, stdin: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "docs"
    path.write_text(stdin)
    argv = ["rerank", "--query", "q", "--documents", str(path), "--format", input_format]
    assert main([*argv, "--model", str(tmp_path / "no-model")]) == 2
    assert message in capsys.readouterr().err


# -- progress ---------------------------------------------------------------------------------------------


def test_the_bar_counts_documents_and_shows_the_time_left(
    scorer: GenerativeScorer, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = [{"text": f"Passage {i} about rivers and the towns along them."} for i in range(40)]
    records = [QueryRecord("Which river?", documents[:25]), QueryRecord("Which town?", documents[25:])]
    # All 40 prompts fit one batch of the engine: a bar moved by batches would jump from 0 to 40.
    assert scorer.config.run.max_batch_tokens > 40 * 64
    rankings = rank_queries(scorer, records, top_n=None, progress=True)
    states = [(int(n), rest) for n, rest in re.findall(r"(\d+)/40 (\[[^\]]*\])", capsys.readouterr().err)]
    counts = [n for n, _ in states]
    assert counts == sorted(counts) and counts[-1] == 40
    assert len(set(counts)) >= 5, counts
    assert any(re.match(r"\[\d\d:\d\d<\d\d:\d\d, ", rest) for n, rest in states if 0 < n < 40), states
    assert "doc/s" in states[-1][1]
    # Slicing for the bar changes the batches (float32 rounding), not the results.
    for record, ranked in zip(records, rankings):
        want = scorer.rerank(record.query, [d["text"] for d in record.documents])
        assert [r.index for r in ranked] == [r.index for r in want]
        assert [r.score for r in ranked] == pytest.approx([r.score for r in want], abs=1e-6)


# -- make-tiny-model --------------------------------------------------------------------------------------


def test_make_tiny_model_keeps_a_non_empty_folder_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("my project\n")
    assert main(["make-tiny-model", str(tmp_path)]) == 2
    assert "is not empty; pass --force" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]
    assert main(["make-tiny-model", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "config.json").is_file()


@pytest.mark.parametrize("steps", ["-5", "two"])
def test_make_demo_model_refuses_a_step_count_that_is_not_one(
    steps: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A negative count trained nothing, and the folder said "DEMO MODEL ... ranks by word overlap".
    out = tmp_path / "demo"
    with pytest.raises(SystemExit) as done:
        main(["make-demo-model", str(out), "--train-steps", steps])
    assert done.value.code == 2
    assert "argument --train-steps: expected a non-negative integer" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("command", ["make-tiny-model", "make-demo-model"])
def test_a_model_folder_that_is_a_file_is_refused_before_any_work(command: str, tmp_path: Path) -> None:
    # Before: make-demo-model trained for a minute or two, then failed with "File exists".
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    result = _run(command, str(taken), "--force")
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"genscore: error: {taken} is a file; give a folder to write the model into\n"
    assert taken.read_text() == "mine\n"


@pytest.mark.parametrize("command", ["make-tiny-model", "make-demo-model"])
@pytest.mark.parametrize("seed", [str(2**64), str(-(2**63) - 1)])
def test_a_seed_torch_cannot_take_is_a_usage_error(
    command: str, seed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "genscore: error: Overflow when unpacking long long", from inside the command.
    out = tmp_path / "model"
    with pytest.raises(SystemExit) as done:
        main([command, str(out), "--seed", seed])
    assert done.value.code == 2
    assert (
        f"argument --seed: expected an integer from -2**63 to 2**64-1, got {seed}" in capsys.readouterr().err
    )
    assert not out.exists()
