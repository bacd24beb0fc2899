"""The work folder of a ``genscore score`` job (``OUTPUT.partial/``): what it records, and what a rerun
may keep of it.

``job.json`` records the input's path, the format, columns, chunking and scorer settings; a rerun
with other ones is refused. Each finished chunk ``N`` leaves, written in this order and each atomically:

- ``bad-N.jsonl``: its bad rows (``on_bad_row="skip"``), where it had any;
- ``chunk-N.json``: its record: how many input rows it read and the SHA-256 of what it read of the
  input (:meth:`~genscore_core.jobs.files.RowReader.take_digest`), how many rows its part holds and
  the SHA-256 of the part (and of its bad rows);
- ``part-N.EXT``: its scored rows.

A rerun keeps a part only where its record is there and its bytes (and its bad rows') hash to what
the record says: a part truncated, emptied or edited from outside is removed, and its chunk scored
again. A kept chunk's input is hashed again as the rerun reads past it (:func:`check_unchanged`):
where the input no longer holds those bytes, whatever its size and modification time, the rerun is
refused rather than merge scores of rows that are not the input's any more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from genscore_core.errors import InputChangedError, JobStateError
from genscore_core.jobs.files import InputRow, write_atomically

MANIFEST = "job.json"


@dataclass(frozen=True)
class ChunkRecord:
    """What a finished chunk read and wrote (``chunk-N.json``)."""

    input_rows: int
    """Rows of the input in the chunk, bad ones included."""
    input_sha256: str
    first_line: int
    last_line: int
    rows: int
    """Rows in its part."""
    part_sha256: str
    bad_sha256: str | None


@dataclass
class Resumed:
    kept: dict[int, ChunkRecord]
    """Finished chunks found intact, by index."""
    damaged: list[int]
    """Chunks whose part was found damaged (and removed): scored again."""


def _name(kind: str, index: int, suffix: str) -> str:
    return f"{kind}-{index:08d}{suffix}"


def part_path(work: Path, index: int, suffix: str) -> Path:
    return work / _name("part", index, suffix)


def _index(path: Path) -> int | None:
    number = path.name.split(".")[0].split("-")[-1]
    return int(number) if number.isdigit() else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def start(work: Path, manifest: dict[str, Any]) -> None:
    """Make a new work folder holding ``manifest``."""
    try:
        work.mkdir(parents=True)
        write_atomically(work / MANIFEST, json.dumps(manifest, indent=1).encode())
    except OSError as error:
        raise JobStateError(
            f"cannot write the work folder {work}: {error.strerror}", param="output"
        ) from None


def resume(
    work: Path, manifest: dict[str, Any], suffix: str, restart_option: str
) -> tuple[dict[str, Any] | None, Resumed]:
    """The finished chunks of ``work`` that a rerun may keep; everything else in it is removed.

    Returns ``(the earlier manifest, the chunks)``; the manifest is None where it is missing or
    unreadable. The caller compares it with its own before keeping anything.
    """
    try:
        earlier = json.loads((work / MANIFEST).read_text())
    except (OSError, ValueError):
        earlier = None
    if earlier != manifest:
        changed = (
            ["the work folder's record is missing or unreadable"]
            if not isinstance(earlier, dict)
            else sorted(key for key in {*manifest, *earlier} if earlier.get(key) != manifest.get(key))
        )
        raise JobStateError(
            f"{work} holds an unfinished run with other settings or another input "
            f"(differs in: {', '.join(changed)}); rerun with the same ones to resume, "
            f"or pass {restart_option} to discard it",
            param="output",
        )
    kept: dict[int, ChunkRecord] = {}
    damaged: list[int] = []
    for part in sorted(work.glob(f"part-*{suffix}")):
        index = _index(part)
        if index is None:
            continue
        record = _read_record(work, index)
        if record is not None and _intact(work, index, part, record):
            kept[index] = record
        else:
            damaged.append(index)
    # Left over from an interrupted chunk (half-written files, a record without its part) or from a
    # damaged one: its chunk is scored again.
    for path in work.iterdir():
        if path.name != MANIFEST and (path.name.endswith(".tmp") or _index(path) not in kept):
            path.unlink()
    return earlier, Resumed(kept, damaged)


def _read_record(work: Path, index: int) -> ChunkRecord | None:
    try:
        return ChunkRecord(**json.loads((work / _name("chunk", index, ".json")).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _intact(work: Path, index: int, part: Path, record: ChunkRecord) -> bool:
    if file_sha256(part) != record.part_sha256:
        return False
    bad = work / _name("bad", index, ".jsonl")
    if record.bad_sha256 is None:
        return not bad.exists()
    return bad.is_file() and file_sha256(bad) == record.bad_sha256


def commit_chunk(
    work: Path,
    index: int,
    suffix: str,
    *,
    part: bytes,
    rows: int,
    bad: bytes | None,
    input_rows: Sequence[InputRow],
    input_sha256: str,
    crash_midway: bool = False,
) -> ChunkRecord:
    """Write a finished chunk: its bad rows, its record, then its part (see the module docs)."""
    if bad:
        write_atomically(work / _name("bad", index, ".jsonl"), bad)
    record = ChunkRecord(
        input_rows=len(input_rows),
        input_sha256=input_sha256,
        first_line=input_rows[0].number,
        last_line=input_rows[-1].number,
        rows=rows,
        part_sha256=hashlib.sha256(part).hexdigest(),
        bad_sha256=hashlib.sha256(bad).hexdigest() if bad else None,
    )
    write_atomically(work / _name("chunk", index, ".json"), json.dumps(asdict(record)).encode())
    write_atomically(part_path(work, index, suffix), part, crash_midway=crash_midway)
    return record


def check_unchanged(
    source: Path, index: int, record: ChunkRecord, rows: Sequence[InputRow], digest: str, restart_option: str
) -> None:
    """Refuse to keep finished chunk ``index`` where the input read for it now is not what it was."""
    if len(rows) == record.input_rows and digest == record.input_sha256:
        return
    where = (
        f"lines {record.first_line}-{record.last_line}"
        if record.input_rows > 1
        else f"line {record.first_line}"
    )
    raise InputChangedError(
        f"{source} changed since an earlier run scored its chunk {index} ({where}): what it holds "
        "there no longer hashes to what was scored, so the kept scores would be stale; restore the "
        f"input, or pass {restart_option} to score it afresh",
        param="input",
    )


def missing_chunks(source: Path, kept: dict[int, ChunkRecord], read: int, restart_option: str) -> None:
    """Refuse kept chunks past the end of the input: it lost rows that an earlier run scored."""
    beyond = sorted(index for index in kept if index >= read)
    if beyond:
        raise InputChangedError(
            f"{source} changed since an earlier run scored it: it now ends before chunk {beyond[0]} "
            f"(line {kept[beyond[0]].first_line} then), so the kept scores would be stale; restore the "
            f"input, or pass {restart_option} to score it afresh",
            param="input",
        )


def check_parts(work: Path, records: dict[int, ChunkRecord], suffix: str) -> list[Path]:
    """The parts to merge, in order, each checked once more against its record."""
    parts = []
    for index in range(len(records)):
        record = records.get(index)
        part = part_path(work, index, suffix)
        if record is None or not part.is_file() or file_sha256(part) != record.part_sha256:
            raise JobStateError(
                f"{part} is missing or no longer holds what was written to it (changed from outside "
                "while the job ran); rerun the same command to score its chunk again",
                param="output",
            )
        parts.append(part)
    return parts
