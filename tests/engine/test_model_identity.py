"""Model identity: ``model.sha256`` is known for every model served, from the manifest, a verified demo
model, a hash kept from an earlier start, or the file hashed once at load; and a calibration is bound to
the scoring version and model it was fitted under."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.errors import ModelLoadError
from semif_adapter.eval.calibrate import write_calibration
from semif_adapter.model import identity
from semif_adapter.model.calibration import CalibrationFile
from semif_adapter.model.demo_models import MODELS
from tests.helpers.support import engine_settings

DECISION = {
    "id": "d",
    "state": "The build is green.",
    "question": "Merge it?",
    "options": [{"id": "yes"}, {"id": "no"}],
}


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> str:
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(identity, "sha256_file", refuse)


def test_a_verified_demo_model_gives_its_pin_without_hashing(
    gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_hashing(monkeypatch)
    assert identity.model_sha256(gemma_gguf, tmp_path) == MODELS["gemma"].sha256


def test_a_demo_marker_older_than_the_file_is_not_trusted(tmp_path: Path) -> None:
    model = MODELS["gemma"]
    path = tmp_path / model.filename
    with path.open("wb") as handle:  # the pinned name and size, other bytes
        handle.truncate(model.size)
    marker = path.with_suffix(path.suffix + ".sha256")
    marker.write_text(model.sha256 + "\n")
    assert identity.demo_pin(path) == model.sha256
    os.utime(marker, ns=(0, 0))  # the file changed after the marker was written
    assert identity.demo_pin(path) is None
    assert identity.model_sha256(path, tmp_path / "cache") != model.sha256


def test_another_file_is_hashed_once_then_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert identity.model_sha256(path, tmp_path / "cache") == expected
    with monkeypatch.context() as patched:
        _no_hashing(patched)
        assert identity.model_sha256(path, tmp_path / "cache") == expected
    path.write_bytes(b"GGUF" + bytes(range(255)) * 64)  # a new file: hashed again
    assert identity.model_sha256(path, tmp_path / "cache") == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_unverified_model_is_hashed_at_load(
    gemma_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "renamed.gguf"  # not a demo name, no manifest: the load hashes it
    copy.write_bytes(gemma_gguf.read_bytes())
    engine = DecisionEngine.load(engine_settings(gguf_path=copy, numerics="fixed-split"))
    try:
        assert engine.model_info.sha256 == MODELS["gemma"].sha256
        assert engine.score([DECISION]).results[0].model.sha256 == MODELS["gemma"].sha256
    finally:
        engine.close()


# --- a calibration belongs to one scoring version --------------------------------------------------------
@pytest.fixture(scope="module")
def fixed_split_version(gemma_gguf: Path) -> str:
    engine = DecisionEngine.load(engine_settings(gguf_path=gemma_gguf, numerics="fixed-split"))
    try:
        return engine.scoring.version
    finally:
        engine.close()


def _load_with(gemma_gguf: Path, tmp_path: Path, stale: str = "refuse", **fields: object) -> DecisionEngine:
    path = write_calibration(CalibrationFile(temperatures={"choice": 2.0}, **fields), tmp_path / "cal.json")
    settings = engine_settings(
        gguf_path=gemma_gguf, numerics="fixed-split", calibration_path=path, stale_calibration=stale
    )
    return DecisionEngine.load(settings)


def test_a_calibration_fitted_under_this_scoring_applies(
    gemma_gguf: Path, tmp_path: Path, fixed_split_version: str
) -> None:
    engine = _load_with(
        gemma_gguf, tmp_path, scoring_version=fixed_split_version, model_sha256=MODELS["gemma"].sha256
    )
    try:
        result = engine.score([DECISION]).results[0]
        assert result.calibration is not None and result.calibration.temperature == 2.0
        assert result.calibration_stale is False
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"scoring_version": "sv1-000000000000"}, "was fitted under scoring sv1-000000000000"),
        ({"version": 1}, "records no scoring_version"),
        ({"scoring_version": "THIS", "model_sha256": "ab" * 32}, "was fitted on model abababab"),
    ],
)
def test_a_calibration_from_another_scoring_refuses_to_start(
    gemma_gguf: Path, tmp_path: Path, fixed_split_version: str, fields: dict, says: str
) -> None:
    fields = {k: fixed_split_version if v == "THIS" else v for k, v in fields.items()}
    with pytest.raises(ModelLoadError, match=says) as refused:
        _load_with(gemma_gguf, tmp_path, **fields)
    message = str(refused.value)
    assert "\n" not in message and "refit" in message and "SEMIF_STALE_CALIBRATION=mark" in message


def test_a_stale_calibration_served_on_request_marks_every_result(gemma_gguf: Path, tmp_path: Path) -> None:
    engine = _load_with(gemma_gguf, tmp_path, stale="mark", scoring_version="sv1-000000000000")
    try:
        results = engine.score([DECISION, {**DECISION, "id": "e", "type": "noul"}]).results
        assert [r.calibration_stale for r in results] == [True, True]
        assert results[0].calibration is not None  # still applied, as the operator asked
    finally:
        engine.close()
