"""Memory of one long document on the CPU: the packed forward's attention works in bounded blocks.

Each forward scores one 8,192-token prompt in a fresh process (a model with 16 attention heads built
from a Qwen3 config). Peak memory is the kernel's high-water mark of the process's resident memory
(``VmHWM``), reset just before scoring (``/proc/self/clear_refs``), minus the resident memory at that
moment: what scoring added, whatever else runs on the machine. Where the reset is not available the
peak is ``ru_maxrss``, which can only overstate it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_MEASURE = """
import json, resource, sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from genscore_core.config import LocalSettings
from genscore_core.engine import ScoringEngine, ScoringJob

def resident(key):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

kind, length = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=16,
    num_key_value_heads=8, head_dim=16, max_position_embeddings=length + 1,
)
model = Qwen3ForCausalLM(config).eval()
engine = ScoringEngine.for_model(model, LocalSettings(forward=kind), pad_token_id=0)
forward = engine.forward
job = ScoringJob([torch.randint(0, 1000, (length,)).tolist()], [5, 6])
try:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    reset = True
except OSError:
    reset = False
before = resident("VmRSS:")
score = engine.score_jobs([job])[0][0]
peak = resident("VmHWM:") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"forward": type(forward).__name__, "added": peak - before, "score": score}))
"""


def _measure(kind: str, length: int) -> dict[str, object]:
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, kind, str(length)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_one_long_document_on_the_cpu_peaks_near_the_padded_forward() -> None:
    padded = _measure("padded", 8192)
    packed = _measure("packed", 8192)
    assert (padded["forward"], packed["forward"]) == ("PaddedForward", "PackedForward")
    assert abs(float(padded["score"]) - float(packed["score"])) < 1e-5  # type: ignore[arg-type]
    ratio = float(packed["added"]) / float(padded["added"])  # type: ignore[arg-type]
    assert ratio < 1.5, f"packed {packed['added']} B vs padded {padded['added']} B: {ratio:.2f}x"
