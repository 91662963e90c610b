"""semif-ops model package with the real small GGUF: archive content, checksum refusal, S3 upload (moto)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import boto3
import pytest

from semif_ops.model import package as package_model
from tests.helpers.deploy import GEMMA_BYTES, write_manifest

CALIBRATION = {"version": 1, "method": "temperature", "temperatures": {"choice": 1.3}}


@pytest.fixture
def staged(tmp_path: Path, gemma_gguf: Path) -> tuple[Path, Path]:
    """(gguf symlink, manifest) in a private directory."""
    src = tmp_path / "src"
    src.mkdir()
    gguf = src / gemma_gguf.name
    gguf.symlink_to(gemma_gguf)
    return gguf, write_manifest(tmp_path, gguf)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def test_packages_gguf_manifest_and_calibration_then_uploads(
    staged: tuple[Path, Path], tmp_path: Path, moto_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, manifest = staged
    (gguf.parent / "calibration.json").write_text(json.dumps(CALIBRATION))
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="models")
    output = tmp_path / "out" / "model.tar.gz"
    rc = package_model.main(
        [
            "--gguf",
            str(gguf),
            "--manifest",
            str(manifest),
            "--output",
            str(output),
            "--compress-level",
            "0",  # stored gzip: same code path, less CPU in tests
            "--upload",
            "s3://models/semif/gemma/model.tar.gz",
        ]
    )
    assert rc == 0
    with tarfile.open(output, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {gguf.name, "model-manifest.json", "calibration.json"}
        assert members[gguf.name].size == GEMMA_BYTES
        assert tar.extractfile("model-manifest.json").read() == manifest.read_bytes()  # type: ignore[union-attr]
        assert json.loads(tar.extractfile("calibration.json").read()) == CALIBRATION  # type: ignore[union-attr]
    head = s3.head_object(Bucket="models", Key="semif/gemma/model.tar.gz")
    assert head["ContentLength"] == output.stat().st_size
    assert "uploaded s3://models/semif/gemma/model.tar.gz" in capsys.readouterr().out


def test_sha256_mismatch_writes_nothing(
    staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, _ = staged
    manifest = write_manifest(tmp_path, gguf, sha256="f" * 64)
    output = tmp_path / "model.tar.gz"
    rc = package_model.main(
        ["--gguf", str(gguf), "--manifest", str(manifest), "--output", str(output), "--compress-level", "0"]
    )
    assert rc != 0
    line = one_error_line(capsys)
    assert "sha256" in line and "expects " + "f" * 64 in line
    assert not output.exists()
    assert list(tmp_path.glob("*.partial")) == []


def test_size_mismatch_is_refused_before_reading(
    staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, _ = staged
    manifest = write_manifest(tmp_path, gguf, bytes=GEMMA_BYTES - 1)
    output = tmp_path / "model.tar.gz"
    assert (
        package_model.main(["--gguf", str(gguf), "--manifest", str(manifest), "--output", str(output)]) != 0
    )
    assert "253113024 bytes but the manifest expects 253113023" in one_error_line(capsys)
    assert not output.exists()


def test_existing_output_needs_force(
    staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, manifest = staged
    output = tmp_path / "model.tar.gz"
    output.write_bytes(b"keep me")
    assert (
        package_model.main(["--gguf", str(gguf), "--manifest", str(manifest), "--output", str(output)]) != 0
    )
    assert "--force" in one_error_line(capsys)
    assert output.read_bytes() == b"keep me"


def test_missing_gguf(staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, manifest = staged
    rc = package_model.main(
        [
            "--gguf",
            str(tmp_path / "nope.gguf"),
            "--manifest",
            str(manifest),
            "--output",
            str(tmp_path / "m.tar.gz"),
        ]
    )
    assert rc != 0
    assert "GGUF not found" in one_error_line(capsys)


def test_download_without_hub_library_says_how_to_fix(
    staged: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, manifest = staged
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import now raises ImportError
    rc = package_model.main(
        ["--download", "--manifest", str(manifest), "--output", str(tmp_path / "m.tar.gz")]
    )
    assert rc != 0
    assert "semif-adapter[hub]" in one_error_line(capsys)


def test_bad_upload_uri_is_refused_first(
    staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, manifest = staged
    rc = package_model.main(
        [
            "--gguf",
            str(gguf),
            "--manifest",
            str(manifest),
            "--output",
            str(tmp_path / "m.tar.gz"),
            "--upload",
            "s3://bucket/model.zip",
        ]
    )
    assert rc != 0
    assert "model.tar.gz" in one_error_line(capsys)
    assert not (tmp_path / "m.tar.gz").exists()


def test_invalid_calibration_is_refused_before_packaging(
    staged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf, manifest = staged
    bad = tmp_path / "calibration.json"
    bad.write_text(json.dumps({"temperature": 1.3}))  # not the calibration.json schema
    output = tmp_path / "out" / "model.tar.gz"
    args = [
        "--gguf",
        str(gguf),
        "--manifest",
        str(manifest),
        "--output",
        str(output),
        "--calibration",
        str(bad),
    ]
    assert package_model.main(args) != 0
    assert "calibration.json" in one_error_line(capsys)
    assert not output.exists()
