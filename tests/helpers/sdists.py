"""llama-cpp-python sdists for the binding/layout tests, fetched once into a cache outside git.

Only the pure-Python binding (``llama_cpp/*.py``) and the vendored llama.cpp headers are kept, keyed by
version: ``$SEMIF_SDIST_CACHE`` (default ``~/.cache/semif-adapter/sdists``)/<version>/. Nothing is compiled.

    python tests/deploy/sdists.py 0.3.30 0.3.35 0.3.36     # what `make sdists` runs
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from semif_ops.cache import cache_home

VERSIONS = ("0.3.30", "0.3.35", "0.3.36")
KEEP = (
    "llama_cpp/",
    "vendor/llama.cpp/include/",
    "vendor/llama.cpp/ggml/include/",
    "vendor/llama.cpp/CMakeLists.txt",
    "CHANGELOG.md",  # names the vendored llama.cpp commit
)


def cache_root() -> Path:
    return Path(os.environ.get("SEMIF_SDIST_CACHE", cache_home() / "sdists"))


def sdist(version: str) -> Path:
    """The unpacked (binding + headers) part of llama-cpp-python==version; downloads on first use."""
    target = cache_root() / version
    if (target / ".complete").is_file() and all((target / k.rstrip("/")).exists() for k in KEEP):
        return target
    with tempfile.TemporaryDirectory(prefix="sdist-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version}", "-d", tmp],
            check=True,
        )  # fmt: skip
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        staging = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            members = []
            for member in tar.getmembers():
                relative = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.isfile() and relative.startswith(KEEP):
                    member.name = relative
                    members.append(member)
            tar.extractall(staging, members=members, filter="data")
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), target)
    (target / ".complete").write_text(version + "\n")
    return target


if __name__ == "__main__":
    for name in sys.argv[1:] or VERSIONS:
        print(sdist(name))
