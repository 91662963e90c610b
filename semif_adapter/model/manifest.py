"""``model-manifest.json``: what GGUF a deployment serves, pinned by size and sha256.

The manifest travels inside ``model.tar.gz`` next to the GGUF. At start-up the server checks the file it is
about to load against it (size first because it is free, then a streamed sha256), so a truncated upload, a
wrong quantisation or a swapped file stops the container with one clear line instead of serving the wrong
model. Packaging (``semif-ops model package``) uses the same checks before anything is uploaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from semif_adapter.errors import ModelLoadError

MANIFEST_NAME = "model-manifest.json"
HASH_BLOCK_BYTES = 1 << 20  # 1 MiB: large enough to be I/O bound, small enough to stay flat in memory.

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REVISION = re.compile(r"^[0-9a-f]{40}$")


class ModelManifest(BaseModel):
    """Schema of ``model-manifest.json`` (version 1). Unknown keys are rejected so typos cannot hide."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    name: str = Field(min_length=1, description="Model name reported in answers and metadata.")
    source_repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="Hub repository, owner/name.")
    revision: str = Field(description="Full 40-hex commit of source_repo the file was taken from.")
    file: str = Field(min_length=1, description="GGUF file name inside the repo and inside model.tar.gz.")
    bytes: int = Field(gt=0, description="Exact file size in bytes.")
    sha256: str = Field(description="Lower-case hex sha256 of the file.")
    license: str = Field(min_length=1, description="SPDX id or licence name of the weights.")
    prompt_version: str = Field(min_length=1, description="semif prompt format the model was validated with.")

    @field_validator("sha256")
    @classmethod
    def _sha256_hex(cls, value: str) -> str:
        value = value.lower()
        if not _SHA256.fullmatch(value):
            raise ValueError("sha256 must be 64 hex characters")
        return value

    @field_validator("revision")
    @classmethod
    def _revision_is_commit(cls, value: str) -> str:
        if not _REVISION.fullmatch(value):
            raise ValueError("revision must be a full 40-hex commit id, not a branch or tag")
        return value

    @field_validator("file")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if "/" in value or "\\" in value or value in (".", "..") or not value.endswith(".gguf"):
            raise ValueError("file must be a bare *.gguf file name")
        return value


@dataclass(frozen=True)
class VerifiedModel:
    """A GGUF whose size and sha256 matched its manifest (reported in model metadata)."""

    path: Path
    manifest_path: Path
    manifest: ModelManifest
    sha256: str
    bytes: int


def load_manifest(path: Path) -> ModelManifest:
    """Read and validate a manifest; any problem becomes a one-line ``ModelLoadError``."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"model manifest not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"model manifest {path} is not readable JSON: {exc}") from None
    try:
        return ModelManifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise ModelLoadError(f"model manifest {path} is invalid: {problems}") from None


def sha256_file(
    path: Path,
    *,
    block_bytes: int = HASH_BLOCK_BYTES,
    progress: Callable[[int], object] | None = None,
) -> str:
    """Stream a file through sha256 in fixed blocks; ``progress`` gets the byte count of each block."""
    digest = hashlib.sha256()
    buffer = bytearray(block_bytes)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            if progress is not None:
                progress(n)
    return digest.hexdigest()


def check_file_against(
    gguf_path: Path,
    manifest: ModelManifest,
    *,
    manifest_path: Path,
    progress: Callable[[int], object] | None = None,
) -> VerifiedModel:
    """Check name, size, then sha256 of ``gguf_path``; raise ModelLoadError on any mismatch."""
    if manifest.file != gguf_path.name:
        raise ModelLoadError(
            f"model manifest {manifest_path} describes {manifest.file!r} but the model file is "
            f"{gguf_path.name!r}"
        )
    try:
        size = gguf_path.stat().st_size
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {gguf_path}") from None
    if size != manifest.bytes:
        raise ModelLoadError(
            f"model file {gguf_path} is {size} bytes but {manifest_path.name} expects {manifest.bytes} "
            "(truncated or wrong file)"
        )
    actual = sha256_file(gguf_path, progress=progress)
    if actual != manifest.sha256:
        raise ModelLoadError(
            f"model file {gguf_path} has sha256 {actual} but {manifest_path.name} expects {manifest.sha256}"
        )
    return VerifiedModel(
        path=gguf_path, manifest_path=manifest_path, manifest=manifest, sha256=actual, bytes=size
    )


def verify_model_file(gguf_path: Path, *, manifest_path: Path | None = None) -> VerifiedModel | None:
    """Verify ``gguf_path`` against the manifest beside it (or ``manifest_path``).

    Returns None when no manifest sits next to the GGUF (nothing to verify). An explicitly named manifest
    that does not exist is an error, because the caller asked for verification.
    """
    gguf_path = Path(gguf_path)
    if manifest_path is None:
        manifest_path = gguf_path.parent / MANIFEST_NAME
        if not manifest_path.is_file():
            return None
    manifest_path = Path(manifest_path)
    manifest = load_manifest(manifest_path)
    if not gguf_path.is_file():
        raise ModelLoadError(f"model file not found: {gguf_path}")
    return check_file_against(gguf_path, manifest, manifest_path=manifest_path)
