"""Every code block of README.md and docs/*.md runs as written, offline, on the demo model.

The hub ids the docs name (``Qwen/Qwen3-Reranker-0.6B``, ...) resolve to the demo model through a
Hugging Face cache this test lays out, with ``HF_HUB_OFFLINE=1``: transformers and genscore load them
by name exactly as they would load the real checkpoints (the recipe is still picked from the name),
but the weights are those of ``genscore make-demo-model``. ``./demo-qwen3``, the folder the README
writes, is the session's demo model too; ``make-demo-model`` keeps a folder that already holds it.
Blocks that cannot run here say why in a ``<!-- not-run: reason -->`` marker (tests/doc_blocks.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import NOT_CODE, PAGES, REPO, RUNNABLE, Block, blocks
from tests.server._support import free_port

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
        [sys.executable, "-m", "tests.doc_blocks", str(page), "--port", str(free_port())],
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
