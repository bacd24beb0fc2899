"""No folder of this checkout can hide an installed distribution from the tests.

pytest puts folders of the checkout on ``sys.path``; a test folder named like a package that a
dependency imports (``tests/kernels`` once hid the ``kernels`` package that transformers 5.25 needs)
breaks every test that loads a model, on a fresh machine only. Every test folder is a package under
``tests``, so the checkout's root is the only entry; this test compares the names importable from
each checkout entry on ``sys.path`` with the top-level names of every installed distribution.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = {"genscore_core", "genscore_integrations"}


def _regular_names(folder: Path) -> set[str]:
    """Names a plain ``import`` finds in ``folder``: modules and packages with an ``__init__.py``."""
    names = {path.stem for path in folder.glob("*.py")}
    names |= {path.name for path in folder.iterdir() if (path / "__init__.py").is_file()}
    return names


def _checkout_entries() -> list[Path]:
    entries = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        inside = path == ROOT or ROOT in path.parents
        # A virtual environment made inside the checkout (CI's .venv-ci) is where the
        # distributions live, not a folder that could hide one.
        in_venv = (
            any(part.startswith(".") or part == "site-packages" for part in path.relative_to(ROOT).parts)
            if inside
            else False
        )
        if path.is_dir() and inside and not in_venv:
            entries.append(path)
    return entries


def test_only_the_checkout_root_is_on_the_path() -> None:
    assert set(_checkout_entries()) == {ROOT}


def test_every_test_folder_is_a_package() -> None:
    missing = [
        str(folder.relative_to(ROOT))
        for folder in [ROOT / "tests", *(ROOT / "tests").rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py"))
        if not (folder / "__init__.py").is_file()
    ]
    assert missing == []


def test_no_checkout_name_shadows_an_installed_distribution() -> None:
    installed = importlib.metadata.packages_distributions()
    clashes = {
        f"{entry.relative_to(ROOT) if entry != ROOT else '.'}/{name}": installed[name]
        for entry in _checkout_entries()
        for name in _regular_names(entry) - OURS
        if name in installed
    }
    assert clashes == {}
