"""Offline jobs: ``genscore score`` scores the (query, document) rows of a file, resumably.

See :func:`score_file` and ``docs/scaling.md``. The same job runs on a Ray cluster through
``genscore_integrations.ray``.
"""

from genscore_core.jobs.files import Columns, InputFileError, InputRow, detect_format, open_reader
from genscore_core.jobs.score import JobStateError, ScoreFileOptions, ScoreFileReport, score_file

__all__ = [
    "Columns",
    "InputFileError",
    "InputRow",
    "JobStateError",
    "ScoreFileOptions",
    "ScoreFileReport",
    "detect_format",
    "open_reader",
    "score_file",
]
