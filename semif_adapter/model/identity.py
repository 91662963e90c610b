"""The served model's identity: the GGUF's sha256, known for every model, never ``null``.

An audit trail that says which model answered needs the file's hash, and so does the scoring version. The
manifest gives it where there is one (``manifest``). Otherwise, in order:

1. a demo model that ``demo_models`` assembled and verified: its pinned hash, when the file has the pinned
   name and size and the marker written after verification is newer than the file;
2. the hash kept from an earlier start, keyed by the file's path, size, inode and modification time;
3. the file hashed, once (about a second per GB; the engine does it in a worker thread while the model
   loads), and kept for the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from semif_adapter import user_cache
from semif_adapter.model.demo_models import MODELS, sha256_file

log = logging.getLogger(__name__)

_HEX = frozenset("0123456789abcdef")


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= _HEX


def demo_pin(path: Path) -> str | None:
    """The pinned sha256 of a demo model that ``demo_models.ensure_model`` verified, else None."""
    stat = path.stat()
    for model in MODELS.values():
        if path.name != model.filename or stat.st_size != model.size:
            continue
        marker = path.with_suffix(path.suffix + ".sha256")
        try:
            written = marker.read_text(encoding="utf-8").strip()
            fresh = marker.stat().st_mtime_ns >= stat.st_mtime_ns
        except OSError:
            return None
        return model.sha256 if fresh and written == model.sha256 else None
    return None


def _key(path: Path) -> str:
    stat = path.stat()
    parts = [str(path.resolve()), stat.st_size, stat.st_ino, stat.st_mtime_ns]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def model_sha256(path: Path, cache_folder: Path | None = None) -> str:
    """The sha256 of the GGUF at ``path``: a verified demo pin, a kept hash, or the file hashed now."""
    path = Path(path)
    pinned = demo_pin(path)
    if pinned is not None:
        return pinned
    folder = cache_folder if cache_folder is not None else user_cache.cache_folder("sha256")
    kept = folder / f"{_key(path)}.txt" if folder is not None else None
    if kept is not None:
        try:
            text = kept.read_text(encoding="utf-8").strip()
            if _is_sha256(text):
                return text
        except OSError:
            pass
    digest = sha256_file(path)
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            tmp.write_text(digest + "\n", encoding="utf-8")
            tmp.replace(kept)
        except OSError as exc:  # a read-only home only costs the next start another hash
            log.info("model sha256 not kept (%s)", exc)
    return digest
