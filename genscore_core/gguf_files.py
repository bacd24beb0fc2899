"""GGUF checkpoints (llama.cpp's single-file format): a ``.gguf`` file, or a folder holding one, loaded
through transformers' GGUF reader (``from_pretrained(folder, gguf_file=name)``, which needs the
``gguf`` package) and dequantised to ``dtype``, tokenizer included.

transformers' own errors on a file it cannot read name no file ("cannot reshape array of size ...",
"unpack_from requires a buffer of at least ... bytes"): :func:`gguf_failures` names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from genscore_core.errors import ConfigurationError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


@dataclass(frozen=True)
class GgufSource:
    """Where a GGUF checkpoint lies, as transformers takes it."""

    folder: str
    file: str
    """The file's name inside ``folder`` (``gguf_file=``)."""

    @property
    def path(self) -> Path:
        return Path(self.folder) / self.file


def gguf_source(name_or_path: str) -> GgufSource | None:
    """The GGUF checkpoint ``name_or_path`` names: a ``.gguf`` file, or a folder without a
    ``config.json`` that holds exactly one; None for anything else (a hub id, a transformers folder).

    Raises:
        ModelNotFoundError: A folder holding several ``.gguf`` files (naming them).
    """
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return GgufSource(str(path.parent), path.name)
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        raise ModelNotFoundError(
            f"model {name_or_path!r}: the folder {path.resolve()} holds {len(found)} GGUF files "
            f"({', '.join(found)}); pass the path of the one to load",
            setting="model",
        )
    return GgufSource(str(path), found[0]) if found else None


def check_gguf_header(source: GgufSource) -> None:
    """Refuse a file that does not start as a GGUF file does, before transformers reads it.

    Raises:
        ConfigurationError: Naming the file and what its first bytes are.
    """
    try:
        with source.path.open("rb") as file:
            head = file.read(len(GGUF_MAGIC))
    except OSError as error:
        raise ConfigurationError(
            f"model {str(source.path)!r}: cannot read the GGUF file: {error}", setting="model"
        ) from error
    if head != GGUF_MAGIC:
        raise ConfigurationError(
            f"model {str(source.path)!r} is not a GGUF file: it starts with {head!r}, not {GGUF_MAGIC!r} "
            "(a download that stored an error page, or another format named .gguf?)",
            setting="model",
        )


@contextlib.contextmanager
def gguf_failures(source: GgufSource, part: str) -> Iterator[None]:
    """transformers' errors on reading ``part`` of a GGUF file, as a :class:`ConfigurationError` that
    names the file; a missing ``gguf`` package as an ``ImportError`` that says how to install it."""
    from transformers.utils import is_gguf_available

    if not is_gguf_available():
        raise ImportError(
            f"loading {source.path} needs the 'gguf' package, which transformers reads GGUF files with: "
            'pip install "gguf>=0.10"'
        )
    try:
        yield
    except Exception as error:  # struct.error, ValueError, KeyError...: whatever a torn file raises
        raise ConfigurationError(
            f"model {str(source.path)!r}: cannot read its {part} from the GGUF file ({source.path.stat().st_size} "
            f"bytes; truncated, or written by a newer llama.cpp than the installed gguf package reads?): "
            f"{type(error).__name__}: {error}",
            setting="model",
        ) from error
