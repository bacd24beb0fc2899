"""torch's threads for a model on the CPU (``cpu_threads``): the default on a small machine, the
setting, and the user's own choice left alone. In fresh interpreters, since torch's thread count
belongs to the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from genscore_core.cpu_threads import default_threads, usable_cores

# Engines built one after the other in one process, torch's count read after each.
_CHILD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
from genscore_core.config import LocalSettings
from genscore_core.engine import ScoringEngine

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
seen = {"start": torch.get_num_threads()}
for step in json.loads(sys.argv[2]):
    if step.get("user") is not None:
        torch.set_num_threads(step["user"])
    ScoringEngine.for_model(model, LocalSettings(**step.get("settings", {})), pad_token_id=0)
    seen[step["name"]] = torch.get_num_threads()
print(json.dumps(seen))
"""


def _run(model: Path, steps: list[dict], env: dict[str, str]) -> dict[str, int]:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), json.dumps(steps)],
        env={**environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_default_threads() -> None:
    assert [default_threads(n) for n in (1, 2, 3, 4, 5, 16)] == [1, 1, 2, 3, 5, 16]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="usable cores are read on Linux")
def test_threads_of_a_model_on_the_cpu(tiny_model_dir: Path) -> None:
    seen = _run(
        tiny_model_dir,
        [
            {"name": "default"},
            {"name": "setting", "settings": {"cpu_threads": 3}},
            {"name": "user", "user": 5},  # torch.set_num_threads after genscore's import: kept
        ],
        env={},
    )
    assert seen["default"] == min(seen["start"], default_threads(usable_cores()))
    assert seen["setting"] == 3
    assert seen["user"] == 5
    # OMP_NUM_THREADS set: torch's own count stays, whatever genscore would have chosen.
    kept = _run(tiny_model_dir, [{"name": "default"}], env={"OMP_NUM_THREADS": str(usable_cores())})
    assert kept["default"] == kept["start"]
