"""Constants and builders shared by the deployment tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
GEMMA_PATH = REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
GEMMA_BYTES = 253_113_024
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DIGEST = "0123456789abcdef" * 4
IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-cpu@sha256:{DIGEST}"


def manifest_for(gguf: Path, **overrides: Any) -> dict[str, Any]:
    """A valid manifest describing ``gguf`` (the test model), with optional wrong fields."""
    data: dict[str, Any] = {
        "schema_version": 1,
        "name": "gemma-3-270m-q4_k_m",
        "source_repo": "ggml-org/gemma-3-270m-GGUF",
        "revision": "a" * 40,
        "file": gguf.name,
        "bytes": GEMMA_BYTES,
        "sha256": GEMMA_SHA256,
        "license": "gemma",
        "prompt_version": "semif-decision-v1",
    }
    data.update(overrides)
    return data


def write_manifest(directory: Path, gguf: Path, **overrides: Any) -> Path:
    path = directory / "model-manifest.json"
    path.write_text(json.dumps(manifest_for(gguf, **overrides)), encoding="utf-8")
    return path
