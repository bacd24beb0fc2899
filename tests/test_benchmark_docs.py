"""docs/benchmarks.md stays a page of current figures that the code can cite by section.

Every place in the package, the tests and the other pages that cites the page names one of its
headings, so a citation cannot point at a section that was renamed or dropped; the page stays small;
each row of its figures table says on which machine, on which date and by which command the figure is
measured; the scripts it names exist; and the history beside the scripts has its columns.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
MAX_BYTES = 40_000
# A citation: the page, a comma, then a section name in double or single quotes (may wrap lines).
CITATION = re.compile(r"docs/benchmarks\.md,\s*[\"']([^\"']+)[\"']")
FIGURES = "Current figures"
COLUMNS = "date commit machine workload metric value unit baseline command note".split()


def _headings() -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", PAGE.read_text(), flags=re.M)}


def _citing_files() -> list[Path]:
    files = [*(REPO / "genscore_core").rglob("*.py"), *(REPO / "genscore_integrations").rglob("*.py")]
    files += [*(REPO / "tests").rglob("*.py"), REPO / "README.md", *(REPO / "docs").glob("*.md")]
    return [f for f in files if f != PAGE and f != Path(__file__)]


def test_every_citation_names_a_heading_of_the_page() -> None:
    headings = _headings()
    bare, unknown = [], []
    for path in _citing_files():
        text = path.read_text()
        for match in re.finditer(r"docs/benchmarks\.md", text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(REPO)}:{line}"
            cited = CITATION.match(text, match.start())
            if cited is None:
                # A link to the page as a whole ("[...](docs/benchmarks.md)") or its path as a string in
                # code is fine; a claim cited to it is not.
                if text[match.end() : match.end() + 1] not in ("]", ")", '"'):
                    bare.append(where)
            elif " ".join(cited.group(1).split()) not in headings:
                unknown.append(f"{where}: {cited.group(1)!r}")
    assert not bare, f'cite a section: docs/benchmarks.md, "<heading>": {bare}'
    assert not unknown, f"no such heading in docs/benchmarks.md: {unknown}"


def test_the_page_is_small() -> None:
    assert PAGE.stat().st_size <= MAX_BYTES, (
        f"{PAGE.stat().st_size} bytes: history goes to benchmarks/history.csv"
    )


def _figure_rows() -> tuple[list[str], list[list[str]]]:
    section = PAGE.read_text().split(f"## {FIGURES}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return header, [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_each_figure_names_machine_date_and_command() -> None:
    header, rows = _figure_rows()
    assert {"machine", "date", "command"} <= set(header), header
    assert len(rows) >= 6, "a figure for each workload"
    machine, date, command = (header.index(name) for name in ("machine", "date", "command"))
    bad = [
        row[0]
        for row in rows
        if not row[machine]
        or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[date])
        or not re.search(r"python benchmarks/bench_\w+\.py", row[command])
    ]
    assert not bad, f"figure rows without a machine, a date or a command: {bad}"
    workloads = {re.split(r"[ ,]", row[0])[0] for row in rows}
    assert {"W1", "W2", "W3", "W4", "W5", "K1"} <= workloads, workloads


def test_scripts_named_by_the_page_exist() -> None:
    named = set(re.findall(r"python (benchmarks/bench_\w+\.py)", PAGE.read_text()))
    assert named, "the page names the scripts that measure its figures"
    missing = sorted(name for name in named if not (REPO / name).is_file())
    assert not missing, missing


def test_history_rows_have_every_column() -> None:
    with (REPO / "benchmarks" / "history.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    assert list(rows[0]) == COLUMNS
    bad = [
        i for i, row in enumerate(rows, 2)
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]) or not row["machine"] or not row["command"]
        or not re.fullmatch(r"-?[\d.]+(e-?\d+)?", row["value"])
    ]  # fmt: skip
    assert not bad, f"history.csv lines without a date, machine, command or number: {bad[:10]}"
