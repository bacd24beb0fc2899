"""The code blocks of README.md and docs/*.md: found, and run in order as a reader would run them.

A page's blocks run in one process, top to bottom: Python blocks share one namespace (a later block
may use what an earlier one defined, as a reader's session would), shell blocks run with bash in the
page's working folder. Markers, an HTML comment on the line before a block (invisible when rendered):

* ``<!-- not-run: reason -->``: the block is not run (it needs a GPU, a hub model, another server).
* ``<!-- background: reason -->``: a shell block that starts a server; it runs in the background
  until the page is done, and the next block runs once the server answers ``/health``.

The only change made to a block before it runs: port 8000 of the loopback examples becomes a free
port, so that pages can run while something else holds 8000.

Run one page by hand (inside a folder holding ``demo-qwen3`` and the test's Hugging Face cache, see
``tests/test_docs.py``): ``python -m tests.helpers.doc_blocks docs/quickstart.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))

RUNNABLE = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
# Blocks that are not code to run: outputs, configuration files of other programs, diagrams.
NOT_CODE = {"json", "text", "nginx", "haproxy"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(?P<kind>not-run|background):\s*(?P<reason>.*?)\s*-->$")
_PORT = re.compile(r"(?<=127\.0\.0\.1:)8000\b|(?<=--port )8000\b")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "not-run" or "background"
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.marker != "not-run"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the marker on the line before it, if any."""
    lines = page.read_text().splitlines()
    name = str(page.relative_to(REPO))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        indent = len(opening["indent"])
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"{name}:{start + 1}: a code block is never closed")
        code = "\n".join(line[indent:] for line in lines[start + 1 : i]) + "\n"
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        found.append(
            Block(
                page=name,
                line=start + 1,
                lang=opening["lang"],
                code=code,
                marker=marker["kind"] if marker else None,
                reason=marker["reason"] if marker else "",
            )
        )
        i += 1
    return found


def run_page(page: Path, port: int) -> None:
    """Run the page's runnable blocks in order, in the current folder; the first failure raises."""
    from tests.helpers.server import wait_healthy

    namespace: dict[str, object] = {"__name__": "__main__"}
    background: list[subprocess.Popen[bytes]] = []
    try:
        for block in blocks(page):
            if not block.runs:
                continue
            code = _PORT.sub(str(port), block.code)
            print(f"--- {block.where} ({block.lang})", flush=True)
            if block.lang == "python":
                exec(compile(code, block.where, "exec"), namespace)
            elif block.marker == "background":
                process = subprocess.Popen(["bash", "-c", code], start_new_session=True)
                background.append(process)
                wait_healthy(
                    f"http://127.0.0.1:{port}", timeout=300, alive=lambda p=process: p.poll() is None
                )
            else:
                done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], timeout=600)
                if done.returncode != 0:
                    raise SystemExit(f"{block.where}: the shell block exited with {done.returncode}")
            sys.stdout.flush()
    finally:
        for process in background:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run one documentation page's code blocks.")
    parser.add_argument("page", type=Path)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    run_page(args.page.resolve(), args.port)


if __name__ == "__main__":
    main()
