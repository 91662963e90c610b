"""Where the server keeps what it learnt about a library or a model file between starts.

``$XDG_CACHE_HOME/semif-adapter/<name>`` (else ``~/.cache/...``), or None without a home directory (a
container user without a passwd entry): then nothing is kept and the work is redone at every start.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(name: str) -> Path | None:
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:
            return None
    return Path(base) / "semif-adapter" / name
