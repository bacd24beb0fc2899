"""``genscore serve`` as a subprocess: memory follows the prompt, not the request."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.server._support import free_port, wait_healthy

GENSCORE = shutil.which("genscore")


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line")


def _serve(model: Path, *flags: str) -> Iterator[Served]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    port = free_port()
    command = [GENSCORE, "serve", "--model", str(model), "--port", str(port), "--device", "cpu",
               "--dtype", "float32", "--log-level", "warning", *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=120, alive=lambda: process.poll() is None)
        yield Served(url, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    """The default maximum length (the tiny model's 8,192 positions) and default limits."""
    yield from _serve(tiny_model_dir)


SMALL = {"query": "which fox?", "documents": ["a small document about a fox " * 20] * 4}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_rss_after_an_8mb_document_returns_near_where_it_was(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=600) as client:
        assert client.post("/v1/rerank", json=SMALL).status_code == 200
        before = served.rss_mb()
        document = ("The quick brown fox jumps over the lazy dog. " * 200_000)[:8_000_000]
        answer = client.post("/v1/rerank", json={"query": "which fox?", "documents": [document]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == 8192
        assert client.post("/v1/rerank", json=SMALL).status_code == 200
        after = served.rss_mb()
    assert after - before < 300, f"RSS {before:.0f} MB before, {after:.0f} MB after an 8 MB document"
