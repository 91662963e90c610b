"""model-manifest.json schema and start-up verification against the real small test GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semif_adapter.errors import ModelLoadError
from semif_adapter.model.manifest import ModelManifest, load_manifest, verify_model_file
from tests.helpers.deploy import GEMMA_BYTES, GEMMA_SHA256, REPO_ROOT, manifest_for, write_manifest


@pytest.fixture
def model_dir(tmp_path: Path, gemma_gguf: Path) -> Path:
    """A model directory holding a symlink to the shared GGUF (the shared file is never written)."""
    (tmp_path / gemma_gguf.name).symlink_to(gemma_gguf)
    return tmp_path


def test_repo_manifest_pins_the_production_model() -> None:
    manifest = load_manifest(REPO_ROOT / "model-manifest.json")
    assert manifest.source_repo == "bartowski/Qwen_Qwen3.5-4B-GGUF"
    assert manifest.revision == "4168f45a16a1290d65a4ec0fa312ae917a4c15d6"
    assert manifest.file == "Qwen_Qwen3.5-4B-Q4_K_M.gguf"
    assert manifest.bytes == 3_013_027_808
    assert manifest.sha256 == "13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983"
    assert manifest.prompt_version == "semif-decision-v1"


def test_prompt_version_matches_the_engine() -> None:
    from semif_adapter.engine.prompt import PROMPT_VERSION

    assert load_manifest(REPO_ROOT / "model-manifest.json").prompt_version == PROMPT_VERSION


def test_matching_file_is_verified(model_dir: Path) -> None:
    gguf = model_dir / "gemma-3-270m-q4_k_m.gguf"
    write_manifest(model_dir, gguf)
    verified = verify_model_file(gguf)
    assert verified is not None
    assert verified.sha256 == GEMMA_SHA256
    assert verified.bytes == GEMMA_BYTES
    assert verified.manifest.name == "gemma-3-270m-q4_k_m"


def test_no_manifest_means_nothing_to_verify(model_dir: Path) -> None:
    assert verify_model_file(model_dir / "gemma-3-270m-q4_k_m.gguf") is None


def test_size_mismatch_refuses(model_dir: Path) -> None:
    gguf = model_dir / "gemma-3-270m-q4_k_m.gguf"
    write_manifest(model_dir, gguf, bytes=GEMMA_BYTES + 1)
    with pytest.raises(ModelLoadError, match=r"is 253113024 bytes but model-manifest.json expects 253113025"):
        verify_model_file(gguf)


def test_sha256_mismatch_refuses(model_dir: Path) -> None:
    gguf = model_dir / "gemma-3-270m-q4_k_m.gguf"
    write_manifest(model_dir, gguf, sha256="0" * 64)
    with pytest.raises(ModelLoadError) as err:
        verify_model_file(gguf)
    message = str(err.value)
    assert "\n" not in message
    assert f"has sha256 {GEMMA_SHA256}" in message and "expects " + "0" * 64 in message


def test_manifest_naming_another_file_refuses(model_dir: Path) -> None:
    gguf = model_dir / "gemma-3-270m-q4_k_m.gguf"
    write_manifest(model_dir, gguf, file="Qwen_Qwen3.5-4B-Q4_K_M.gguf")
    with pytest.raises(ModelLoadError, match=r"describes 'Qwen_Qwen3\.5-4B-Q4_K_M\.gguf'"):
        verify_model_file(gguf)


def test_explicit_manifest_path_and_missing_model(tmp_path: Path, gemma_gguf: Path) -> None:
    manifest = write_manifest(tmp_path, gemma_gguf)
    assert verify_model_file(gemma_gguf, manifest_path=manifest) is not None
    with pytest.raises(ModelLoadError, match="model manifest not found"):
        verify_model_file(gemma_gguf, manifest_path=tmp_path / "absent.json")
    missing = tmp_path / "gone" / gemma_gguf.name
    with pytest.raises(ModelLoadError, match="model file not found"):
        verify_model_file(missing, manifest_path=manifest)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("sha256", "xyz", "sha256 must be 64 hex"),
        ("revision", "main", "full 40-hex commit"),
        ("file", "../evil.gguf", "bare *.gguf"),
        ("bytes", 0, "greater than 0"),
        ("surprise", 1, "Extra inputs are not permitted"),
    ],
)
def test_invalid_manifest_is_one_clear_line(
    tmp_path: Path, gemma_gguf: Path, field: str, value: object, fragment: str
) -> None:
    path = tmp_path / "model-manifest.json"
    path.write_text(json.dumps(manifest_for(gemma_gguf, **{field: value})))
    with pytest.raises(ModelLoadError) as err:
        load_manifest(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model-manifest.json"
    path.write_text("{not json")
    with pytest.raises(ModelLoadError, match="not readable JSON"):
        load_manifest(path)


def test_schema_uppercase_sha_is_normalised(gemma_gguf: Path) -> None:
    manifest = ModelManifest.model_validate(manifest_for(gemma_gguf, sha256=GEMMA_SHA256.upper()))
    assert manifest.sha256 == GEMMA_SHA256
