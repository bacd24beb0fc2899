"""``python -m genscore_core.server ...``: the same as ``genscore serve ...``."""

from __future__ import annotations

import sys

from genscore_core.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
