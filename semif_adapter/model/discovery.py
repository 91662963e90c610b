"""Which GGUF to serve: ``SEMIF_GGUF_PATH``, else the single GGUF SageMaker extracted into the model dir."""

from __future__ import annotations

import re
from pathlib import Path

from semif_adapter.errors import ModelLoadError
from semif_adapter.settings import Settings

_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _candidates(model_dir: Path) -> list[Path]:
    found = sorted(model_dir.glob("*.gguf")) + sorted(model_dir.glob("*/*.gguf"))
    return [path for path in found if path.is_file()]


def _single_sharded_model(paths: list[Path]) -> Path | None:
    """A split GGUF (``name-00001-of-00003.gguf`` …) counts as one model; llama.cpp opens shard 1."""
    matches = [_SHARD.match(path.name) for path in paths]
    if not all(matches):
        return None
    keys = {(path.parent, m["stem"], m["count"]) for path, m in zip(paths, matches, strict=True) if m}
    if len(keys) != 1:
        return None
    first = [path for path, m in zip(paths, matches, strict=True) if m and m["index"] == "00001"]
    return first[0] if first else None


def discover_gguf(settings: Settings) -> Path:
    if settings.gguf_path is not None:
        if not settings.gguf_path.is_file():
            raise ModelLoadError(f"SEMIF_GGUF_PATH={settings.gguf_path} does not exist or is not a file")
        return settings.gguf_path
    model_dir = settings.model_dir
    if not model_dir.is_dir():
        raise ModelLoadError(
            f"model directory {model_dir} does not exist; set SEMIF_GGUF_PATH or SEMIF_MODEL_DIR"
        )
    found = _candidates(model_dir)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        sharded = _single_sharded_model(found)
        if sharded is not None:
            return sharded
        names = ", ".join(str(path.relative_to(model_dir)) for path in found)
        raise ModelLoadError(
            f"found {len(found)} GGUF files under {model_dir} ({names}); keep one or set SEMIF_GGUF_PATH"
        )
    raise ModelLoadError(
        f"no *.gguf file under {model_dir} (searched it and one level of sub-folders); "
        "set SEMIF_GGUF_PATH or package the model into model.tar.gz"
    )
