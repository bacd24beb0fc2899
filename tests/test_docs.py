"""Every code block of README.md and docs/*.md runs as written, offline, on the demo model.

The hub ids the docs name (``Qwen/Qwen3-Reranker-0.6B``, ...) resolve to the demo model through a
Hugging Face cache this test lays out, with ``HF_HUB_OFFLINE=1``: transformers and genscore load them
by name exactly as they would load the real checkpoints (the recipe is still picked from the name),
but the weights are those of ``genscore make-demo-model``. ``./demo-qwen3``, the folder the README
writes, is the session's demo model too; ``make-demo-model`` keeps a folder that already holds it.
Blocks that cannot run here say why in a ``<!-- not-run: reason -->`` marker (tests/helpers/doc_blocks.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

from genscore_core import GenerativeScorer
from tests.helpers.doc_blocks import NOT_CODE, PAGES, REPO, RUNNABLE, Block, blocks
from tests.helpers.server import free_port

# Hub ids used in the docs, served from the test's cache by the demo model.
HUB_IDS = ("Qwen/Qwen3-Reranker-0.6B", "mixedbread-ai/mxbai-rerank-base-v2")
_REVISION = "0" * 40
# Blocks left out must stay few: each one is a place where the docs can drift from the code unseen.
MAX_NOT_RUN = 12

ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_every_block_says_what_it_is() -> None:
    untagged = [b.where for b in ALL_BLOCKS if b.lang not in RUNNABLE and b.lang not in NOT_CODE]
    assert not untagged, f"code blocks without a known language tag: {untagged}"
    misplaced = [b.where for b in ALL_BLOCKS if b.marker is not None and b.lang not in RUNNABLE]
    assert not misplaced, f"run markers on blocks that are not code: {misplaced}"
    unexplained = [b.where for b in ALL_BLOCKS if b.marker is not None and len(b.reason) < 10]
    assert not unexplained, f"markers without a reason: {unexplained}"
    not_run = [f"{b.where}: {b.reason}" for b in ALL_BLOCKS if b.marker == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, "\n".join(not_run)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "python"], ids=lambda b: b.where)
def test_python_blocks_are_valid_python(block: Block) -> None:
    # Top-level ``await`` is a syntax error in a script: async examples must run their own loop.
    compile(block.code, block.where, "exec", dont_inherit=True)


@pytest.fixture(scope="session")
def hub_home(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Path:
    """A Hugging Face home whose cache holds the demo model under the docs' hub ids."""
    home = tmp_path_factory.mktemp("hf-home")
    for repo_id in HUB_IDS:
        repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / _REVISION
        snapshot.mkdir(parents=True)
        for file in demo_model_dir.iterdir():
            (snapshot / file.name).symlink_to(file)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(_REVISION)
    return home


def _env(hub_home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(
        HF_HOME=str(hub_home),
        HF_HUB_OFFLINE="1",
        # The checkout's code, for the blocks' Python and for the genscore console script.
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONUNBUFFERED="1",
    )
    return env


# Pages whose `genscore rerank` example asks for the capital of France.
FRANCE_FIRST = {"README.md", "quickstart.md"}

RUN_PAGES = [page for page in PAGES if any(b.runs for b in blocks(page))]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_runs_as_written(page: Path, tmp_path: Path, demo_model_dir: Path, hub_home: Path) -> None:
    (tmp_path / "demo-qwen3").symlink_to(demo_model_dir)
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.doc_blocks", str(page), "--port", str(free_port())],
        cwd=tmp_path,
        env=_env(hub_home),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    if page.name in FRANCE_FIRST:
        # The command-line example ranks for "What is the capital of France?": the document that
        # shares its words must come first (the demo model ranks by word overlap).
        ranked = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"index"')]
        assert ranked and ranked[0]["text"] == "Paris is the capital of France.", done.stdout


# --- Claims checked against the code, cheaply (no model) ---------------------------------------------

# Pages that describe the code (the benchmarks page records measurements and names the scripts' flags).
CLAIM_PAGES = [page for page in PAGES if page.name != "benchmarks.md"]
# Flags of other programs the docs show (pip, curl, vLLM, SGLang, Ray, ruff, pytest, the benchmark scripts).
OTHER_FLAGS = {
    "--api-key", "--check", "--clusters", "--data-parallel-size", "--dist", "--dp-size", "--fail-with-body", "--head",
    "--hf_overrides", "--max-model-len", "--model-path", "--no-deps", "--no-index", "--system-config",
    "--upgrade", "--warm-up",
}  # fmt: skip
_FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def _commands() -> dict[str, argparse.ArgumentParser]:
    from genscore_core.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for flag in parser._option_string_actions if flag.startswith("--")}


def _prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.S | re.M)


def test_every_flag_named_in_the_docs_exists() -> None:
    commands = _commands()
    known = set().union(*(_flags(parser) for parser in commands.values())) | OTHER_FLAGS
    unknown = {
        f"{page.name}: {flag}"
        for page in CLAIM_PAGES
        for flag in _FLAG.findall(page.read_text())
        if flag not in known
    }
    assert not unknown, sorted(unknown)
    # A command line shown in a code block uses only its own command's flags.
    wrong = []
    for block in ALL_BLOCKS:
        if block.lang not in RUNNABLE or block.page == "docs/benchmarks.md":
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            for command, rest in re.findall(r"\bgenscore ([a-z-]+)(.*)", line):
                own = _flags(commands[command])
                args = re.split(r"[|;&>]", rest)[0]
                wrong += [
                    f"{block.where}: genscore {command} {f}" for f in _FLAG.findall(args) if f not in own
                ]
    assert not wrong, wrong


def test_every_flag_of_every_command_is_documented() -> None:
    # The scorer flags are ScorerConfig's fields (each command's --help lists them with their docs);
    # every other flag is the command's own and must be explained somewhere.
    from genscore_core.config import SETTING_FIELDS

    scorer_flags = {"--batch-tokens"} | {
        f"--{prefix}{name.replace('_', '-')}" for name in SETTING_FIELDS for prefix in ("", "no-")
    }
    text = "\n".join(page.read_text() for page in CLAIM_PAGES)
    missing = [
        f"genscore {command} {flag}".replace("  ", " ")
        for command, parser in _commands().items()
        for flag in sorted(_flags(parser) - scorer_flags - {"--help"})
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
    ]
    assert not missing, missing


def _table_rows(page: Path) -> list[list[str]]:
    """The body rows of the page's tables whose first cell is code."""
    return [row for row in _table_rows_of(page.read_text()) if row[0].startswith("`")]


def test_serve_flag_table_gives_the_parser_defaults() -> None:
    serve = _commands()["serve"]
    defaults = {flag: action.default for flag, action in serve._option_string_actions.items()}
    rows = [row for row in _table_rows(REPO / "docs" / "scaling.md") if re.fullmatch(r"`--[\w-]+`", row[0])]
    assert len(rows) >= 10
    for flag, default, *_ in rows:
        flag = flag.strip("`")
        assert flag in defaults, flag
        assert default.strip("`") == str(defaults[flag]), (
            f"{flag}: docs say {default}, parser {defaults[flag]}"
        )


def test_setting_tables_give_every_setting_its_config_default() -> None:
    from genscore_core.config import (
        SETTING_FIELDS,
        LocalSettings,
        PromptSettings,
        ServerSettings,
        setting_default,
    )

    def part_of(name: str) -> str:
        """The typed part a flat setting belongs to."""
        for part in (PromptSettings, LocalSettings):
            if name in part.model_fields:
                return part.__name__
        return ServerSettings.__name__ if name.startswith("server_") else "ScorerConfig"

    checked = 0
    tabled = set()
    for page in CLAIM_PAGES:
        for intro, rows in _tables_with_intro(page.read_text()):
            for row in rows:
                name = row[0].strip("`")
                if name not in SETTING_FIELDS or len(row) < 3:
                    continue
                if f"`{part_of(name)}`" in intro:  # in the table of its part (PromptSettings, ...)
                    tabled.add(name)
                if name != "max_length":
                    default = setting_default(name)
                    shown = row[1].strip("`").strip('"')
                    assert shown in {str(default), repr(default).strip("'")} or float(shown) == default, (
                        f"{page.name}: {name} default {row[1]}, ScorerConfig {default!r}"
                    )
                    checked += 1
    assert checked >= 5
    # A new setting gets a row with its default in the table of its part (docs/python.md; the
    # ServerSettings in docs/scaling.md), whose introduction names the part.
    assert set(SETTING_FIELDS) <= tabled, (
        f"settings in no table of their part: {sorted(set(SETTING_FIELDS) - tabled)}"
    )


def _tables_with_intro(text: str) -> list[tuple[str, list[list[str]]]]:
    """Each table of ``text`` whose first cell is code, with the paragraph just above it."""
    tables: list[tuple[str, list[list[str]]]] = []
    paragraph: list[str] = []
    ended = False  # a blank line ended the paragraph: the next prose line starts another
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            tables.append((" ".join(paragraph), _table_rows_of("\n".join(_table_lines(lines, i)))))
        if not line.strip():
            ended = True
        elif not line.startswith("|"):
            paragraph = [line] if ended else [*paragraph, line]
            ended = False
    return [(intro, [row for row in rows if row[0].startswith("`")]) for intro, rows in tables]


def _table_lines(lines: list[str], start: int) -> list[str]:
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def test_adapter_docs_list_every_scorer_setting() -> None:
    from genscore_core import scorer_setting_names

    for name in ("langchain.md", "llama_index.md"):
        text = _prose(REPO / "docs" / name)
        listed = re.split(
            r"or a\s+whole", text.split("fields of `genscore_core.ScorerConfig`", 1)[1], maxsplit=1
        )[0]
        named = set(re.findall(r"`(\w+)`", listed)) | {"model", "config"}
        plain = {n for n in scorer_setting_names() if not n.startswith("server_")}
        assert plain <= named, f"{name} leaves out {sorted(plain - named)}"
        assert named <= set(scorer_setting_names()), (
            f"{name} names {sorted(named - set(scorer_setting_names()))}"
        )


# In a fresh interpreter: importing modules such as genscore_integrations.ray_preload loads Triton,
# and in a test process whose kernel tests loaded Triton under its CPU interpreter that import
# fails (the interpreter setting is scoped to the kernel tests; Triton remembers the modules).
_IMPORT_DOTTED = """
import importlib, importlib.util, json, sys

def is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent that is a module, not a package
        return False

broken = []
for dotted in json.loads(sys.argv[1]):
    # The longest importable module, then attributes.
    parts = dotted.split(".")
    cut = next(n for n in range(len(parts), 0, -1) if is_module(".".join(parts[:n])))
    target = importlib.import_module(".".join(parts[:cut]))
    for attribute in parts[cut:]:
        target = getattr(target, attribute, None)
    if target is None:
        broken.append(dotted)
print(json.dumps(broken))
"""


def test_dotted_names_in_the_docs_import() -> None:
    named = {
        dotted: page.name
        for page in CLAIM_PAGES
        for dotted in re.findall(r"`(genscore_(?:core|integrations)[\w.]*)(?:\(\))?`", page.read_text())
    }
    assert len(named) > 10, "the pages name modules and attributes"
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_DOTTED, json.dumps(sorted(named))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    broken = [f"{named[dotted]}: {dotted}" for dotted in json.loads(done.stdout)]
    assert not broken, broken


def test_every_public_name_is_documented() -> None:
    """The reverse of the checks above: what a user can reach is named somewhere, so a new export or
    method cannot land unseen by the docs."""
    import genscore_core
    from genscore_core import GenerativeScorer, RankedResult, RankedResults

    text = "\n".join(page.read_text() for page in CLAIM_PAGES)
    named = set(re.findall(r"`(?:[\w.]*\.)?(\w+)", text))
    public = set(genscore_core.__all__)
    public |= {name for name in vars(GenerativeScorer) if not name.startswith("_")}
    public |= {name for name in vars(RankedResults) if not name.startswith("_")} - {"model_config"}
    public |= set(RankedResults.model_fields) | set(RankedResult.model_fields)
    missing = sorted(public - named)
    assert not missing, f"public names no page documents: {missing}"


def _heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.*)$", _prose(page), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_links_between_pages_reach_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"\w+://", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.name}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _heading_anchors(target):
                broken.append(f"{page.name}: {link} (no such heading)")
    assert not broken, broken


def test_exit_codes_are_those_of_the_command_line() -> None:
    from genscore_core import cli

    said = _prose(REPO / "docs" / "cli.md").split("Exit codes:", 1)[1].split("\n\n", 1)[0]
    codes = {value for name, value in vars(cli).items() if name.startswith("EXIT_")}
    assert {int(code) for code in re.findall(r"\b(\d+)\s", said)} == {0} | codes, said


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = next(b.code.strip() for b in blocks(REPO / "README.md") if "python -m pytest" in b.code)
    assert readme == ci.replace("pip install -q ", "pip install "), (readme, ci)


def test_every_module_has_a_room_in_architecture() -> None:
    """docs/architecture.md names each module in its table, under the folder it lives in."""
    section = (REPO / "docs" / "architecture.md").read_text().split("## The rooms", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for row in _table_rows_of(section):
        folder = ""
        for token in re.findall(r"`([\w./]+)`", row[1]):
            if token.startswith(("genscore_core", "genscore_integrations")):
                folder = token if token.endswith("/") else token.rpartition("/")[0] + "/"
                if token.endswith(".py"):
                    named.add(token)
            elif token.endswith(".py") and folder and not token.startswith("tests/"):
                named.add(folder + token)
    modules = {
        str(path.relative_to(REPO))
        for package in ("genscore_core", "genscore_integrations")
        for path in (REPO / package).rglob("*.py")
    }
    assert not named - modules, f"rooms for modules that do not exist: {sorted(named - modules)}"
    missing = {
        m for m in modules - named if not m.endswith("/__init__.py") or m == "genscore_core/__init__.py"
    }
    assert not missing, f"modules without a room in docs/architecture.md: {sorted(missing)}"


def _table_rows_of(text: str) -> list[list[str]]:
    """The body rows of every table in ``text`` (header rows left out), as lists of cells."""
    lines = text.splitlines()
    return [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for i, line in enumerate(lines)
        if line.startswith("| ") and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))
    ]


def test_server_endpoints_and_stats_are_those_documented(scorer: GenerativeScorer) -> None:
    import httpx

    from genscore_core.server import create_app
    from tests.helpers.server import TEST_LIMITS, serve_in_thread

    rows = {row[0]: row[1] for row in _table_rows_of(_prose(REPO / "docs" / "scaling.md")) if len(row) == 2}
    documented = set()
    for cell in rows:  # `POST /v1/rerank` (also `/rerank`, ...): a bare path takes the method before it
        method = ""
        for verb, path in re.findall(r"`((?:GET|POST) )?(/[\w/]+)`", cell):
            method = verb.strip() or method
            documented.add(f"{method} {path}")
    app = create_app(scorer, TEST_LIMITS)
    served = {
        f"{verb} {route.path}"
        for route in app.routes
        for verb in getattr(route, "methods", ())
        if verb in {"GET", "POST"} and not route.path.startswith(("/openapi", "/docs", "/redoc"))
    }
    assert served == documented
    with serve_in_thread(app) as live:
        stats = httpx.get(f"{live.url}/stats").json()
    said = next(cell for name, cell in rows.items() if "/stats" in name)
    assert not [key for key in stats if f"`{key}`" not in said], (
        f"/stats keys missing from scaling.md: {stats}"
    )


def test_the_demo_model_is_described_as_it_is_built() -> None:
    import nbformat

    from genscore_core.testing import demo_model

    texts = {str(page.relative_to(REPO)): page.read_text() for page in CLAIM_PAGES}
    for notebook in sorted((REPO / "examples").glob("*.ipynb")):
        cells = nbformat.read(notebook, as_version=4).cells
        texts[notebook.name] = "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")
    claims = [
        (where, int(n)) for where, text in texts.items() for n in re.findall(r"(\d+)-layer Qwen3", text)
    ]
    assert claims, "no page describes the demo model's size any more: drop this test"
    wrong = [where for where, layers in claims if layers != demo_model._LAYERS]
    assert not wrong, f"demo model layers said wrongly in {wrong}; it has {demo_model._LAYERS}"


def test_readme_names_every_extra_and_the_wheel_of_this_version() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    readme = (REPO / "README.md").read_text()
    said = readme.split("The extras:", 1)[1].split("When an extra", 1)[0]
    named = set(re.findall(r"`([\w-]+)`", re.sub(r"\([^)]*\)", "", said)))  # what the brackets say left out
    assert named == set(project["optional-dependencies"])
    versions = set(
        re.findall(r"genscore-([\w.]+)-py3-none-any\.whl", "\n".join(p.read_text() for p in CLAIM_PAGES))
    )
    assert versions == {project["version"]}


def test_server_error_table_uses_the_servers_error_types() -> None:
    from genscore_core.server.schemas import ERROR_TYPES

    answered = {**ERROR_TYPES, 500: "InternalServerError"}
    documented = {}
    for row in _table_rows_of(_prose(REPO / "docs" / "scaling.md")):
        found = re.fullmatch(r"(\d{3}) `(\w+)`", row[0])
        if found:
            documented[int(found[1])] = found[2]
    assert documented == answered


@pytest.mark.parametrize(
    "block", [b for b in ALL_BLOCKS if b.lang == "python" and b.marker == "not-run"], ids=lambda b: b.where
)
def test_blocks_not_run_call_genscore_as_it_is_defined(block: Block) -> None:
    """A block that cannot run here (GPUs, a cluster) still calls genscore's functions with arguments
    they take: positional counts and keywords are bound to each signature, and keywords that land in
    ``**settings`` must be ScorerConfig fields."""
    import ast
    import inspect

    from genscore_core.config import scorer_setting_names

    tree = ast.parse(block.code)
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("genscore_"):
            module = importlib.import_module(node.module or "")
            names.update({alias.asname or alias.name: getattr(module, alias.name) for alias in node.names})
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]
    assert calls, "no genscore call to check: drop the marker or this test's premise"
    for call in calls:
        target = names[call.func.id]
        signature = inspect.signature(target)
        keywords = {k.arg: None for k in call.keywords if k.arg is not None}
        bound = signature.bind(*[None] * len(call.args), **keywords)
        for name, parameter in signature.parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD and name in bound.arguments:
                unknown = set(bound.arguments[name]) - scorer_setting_names()
                assert not unknown, f"{block.where}: {call.func.id}(...) gets settings {unknown}"


def _table(page: Path, first_header: str) -> list[list[str]]:
    """Body rows of the table on ``page`` whose header row starts with ``first_header``."""
    lines = _prose(page).splitlines()
    start = next(
        i
        for i, line in enumerate(lines[:-1])
        if line.startswith(f"| {first_header} |") and lines[i + 1].startswith("|---")
    )
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


@pytest.mark.parametrize(
    ("page", "header", "choices"),
    [
        ("models.md", "mode", lambda: set(typing.get_args(_field("score_mode"))) - {"auto"}),
        ("concepts.md", "preset", lambda: set(_templates())),
        ("scaling.md", "`server_kind`", lambda: set(typing.get_args(_field("server_kind")))),
    ],
)
def test_tables_of_choices_list_every_choice(page: str, header: str, choices: Callable[[], set[str]]) -> None:
    listed = {row[0].strip("`").strip('"') for row in _table(REPO / "docs" / page, header)}
    assert listed == choices()


def _field(name: str) -> object:
    from genscore_core.config import SETTING_FIELDS

    return SETTING_FIELDS[name].annotation


def _templates() -> list[str]:
    from genscore_core import TEMPLATES

    return list(TEMPLATES)
