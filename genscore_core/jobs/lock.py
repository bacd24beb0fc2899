"""One run at a time per output: the lock a ``genscore score`` job holds from its first look at the
work folder to the end of its merge.

Two runs of one job (the same command started twice, a scheduler's retry beside a run still alive)
would otherwise score the same chunks, and both merge. The lock is ``OUTPUT.lock`` held with
``flock``, which the kernel lets go when its process dies, however it dies: a killed run leaves no
stale lock to clear by hand. The file holds the holder's pid and host, for the message of the run it
turns away, and is removed when the job ends. Where ``fcntl`` is missing (Windows) the file is
created exclusively instead; one left by a killed run must then be removed by hand, as its message says.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from genscore_core.errors import JobLockedError, JobStateError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# A run that finishes removes the file while another opens it: the opener then holds a lock on a
# file no longer at the path, and tries again.
_ATTEMPTS = 5


def lock_path(output: Path) -> Path:
    return output.with_name(output.name + ".lock")


@contextmanager
def job_lock(output: Path) -> Iterator[None]:
    """Hold the lock of the job writing ``output`` while the block runs.

    Raises:
        JobLockedError: Another run holds it; the message names its pid and host.
    """
    path = lock_path(output)
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True)  # as the work folder beside it is made
        descriptor = _acquire(path) if fcntl is not None else _create_exclusively(path)
    except OSError as error:
        raise JobStateError(
            f"cannot write the work folder's lock file {path}: {error.strerror}", param="output"
        ) from None
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        # Removed while still held, so no run can find it locked by nobody.
        path.unlink(missing_ok=True)
        os.close(descriptor)


def _acquire(path: Path) -> int:
    for _ in range(_ATTEMPTS):
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise JobLockedError(_locked_message(path, holder), param="output") from None
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return descriptor
        os.close(descriptor)  # the file was removed (a run ended) after it was opened: again
    raise JobLockedError(_locked_message(path, "another run"), param="output")


def _create_exclusively(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        holder = path.read_text(errors="replace").strip() or "another run"
        raise JobLockedError(
            _locked_message(path, holder) + f"; if no run is alive, remove {path}", param="output"
        ) from None


def _holder(descriptor: int) -> str:
    try:
        text = os.pread(descriptor, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another run"


def _locked_message(path: Path, holder: str) -> str:
    output = path.with_name(path.name.removesuffix(".lock"))
    return (
        f"another run of this job ({holder}) is writing {output} and holds {path}; "
        "wait for it to end (or stop it), then rerun to resume"
    )
