"""``genscore make-demo-model`` run the way the README runs it: a command in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def make_demo_model_cli(out: Path, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command on ``out`` with ``flags``, its output captured (the caller checks its exit code)."""
    return subprocess.run(
        [sys.executable, "-m", "genscore_core.cli", "make-demo-model", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
