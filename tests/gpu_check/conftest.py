"""The GPU bundle, built once per session (pip downloads hit pip's cache after the first run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import gpu_bundle
from semif_ops.cache import cache_home


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory, qwen_gguf: Path) -> dict:
    """``make gpu-bundle`` into a temporary folder: its path and manifest."""
    out = tmp_path_factory.mktemp("gpu") / "gpu-bundle"
    manifest = gpu_bundle.build(out, qwen_gguf)
    return {"path": out, "manifest": manifest}


@pytest.fixture(scope="session")
def gpu_check_work() -> Path:
    """Where the dry run keeps its venv, unpacked source and CPU build between runs (keyed by content, so
    a new bundle or wheel set builds afresh); a fresh machine starts empty."""
    return Path(os.environ.get("SEMIF_GPU_CHECK_WORK", cache_home() / "gpu-check-work"))
