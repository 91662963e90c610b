"""Where every tool keeps what it downloads or builds once: ``$XDG_CACHE_HOME/semif-adapter`` (default
``~/.cache/semif-adapter``), so pointing ``XDG_CACHE_HOME`` at an empty folder gives a truly cold run."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "semif-adapter"
