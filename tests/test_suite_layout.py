"""How the test suite is laid out: shared code in tests/helpers only, no test module importing another,
and the Triton interpreter set only for the kernel tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
HELPERS = TESTS / "helpers"

# An import statement (or the text of one, for the scripts tests run in a subprocess) naming a test
# module, absolute (``tests.server.test_openapi``) or relative (``.test_batcher``).
_IMPORTS_A_TEST = re.compile(r"^\s*(from|import)\s+(\.+|tests\.)?([\w]+\.)*test_\w+", re.MULTILINE)
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.", re.MULTILINE)


def _modules() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def test_shared_code_lives_in_the_helpers_package() -> None:
    elsewhere = [
        str(path.relative_to(ROOT))
        for path in _modules()
        if HELPERS not in path.parents
        and not path.name.startswith("test_")
        and path.name not in ("conftest.py", "__init__.py")
    ]
    assert not elsewhere, f"shared test code outside tests/helpers: {elsewhere}"
    assert (HELPERS / "__init__.py").is_file()


def test_no_test_module_imports_another() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for path in _modules()
        for match in [
            *_IMPORTS_A_TEST.finditer(path.read_text()),
            *_RELATIVE_IMPORT.finditer(path.read_text()),
        ]
    ]
    assert not offenders, f"import shared code from tests.helpers instead: {offenders}"


def test_the_import_check_sees_the_imports_it_forbids() -> None:
    for line in (
        "from tests.server.test_openapi import check_against_spec",
        "from .test_batcher import RecordingBackend",
        "    from tests.test_packed_forward import ATOL",
        "import tests.test_score_modes",
    ):
        assert _IMPORTS_A_TEST.search(line), line
    assert _RELATIVE_IMPORT.search("from ._support import LiveServer")
    assert not _IMPORTS_A_TEST.search("from tests.helpers.server import serve_in_thread")


_PROBE = """
import os


def test_after_the_kernel_tests():
    assert "TRITON_INTERPRET" not in os.environ, os.environ["TRITON_INTERPRET"]
"""


def test_the_triton_interpreter_is_set_for_kernel_tests_only(tmp_path: Path) -> None:
    """A kernel test that needs the interpreter (impl="triton" on CPU tensors) passes, and a test run
    after it in the same process finds TRITON_INTERPRET unset, as the caller left it."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(_PROBE)
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    kernel_test = "tests/kernels/test_fused_ops.py::test_silu_mul"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"--rootdir={ROOT}", kernel_test, str(probe)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) >= 2, result.stdout[-2000:]
