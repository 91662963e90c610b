"""Build model.tar.gz for SageMaker: the pinned GGUF + model-manifest.json (+ calibration.json).

The GGUF comes from a local file (--gguf) or is downloaded at the manifest's pinned revision (--download,
needs the optional huggingface_hub: pip install 'semif-adapter[hub]'). Its size and sha256 must match the
manifest or nothing is written. An existing output is only replaced with --force. --upload copies the result
to S3.

    semif-ops model package --gguf ~/models/Qwen_Qwen3.5-4B-Q4_K_M.gguf --output build/model.tar.gz
    semif-ops model package --download --upload s3://my-bucket/semif/qwen3.5-4b/model.tar.gz
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import time
from collections.abc import Callable, Sequence
from hashlib import sha256
from pathlib import Path

from semif_adapter.errors import ModelLoadError
from semif_adapter.model.calibration import Calibration
from semif_adapter.model.manifest import MANIFEST_NAME, ModelManifest, load_manifest
from semif_ops import aws
from semif_ops.exits import command

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION_NAME = "calibration.json"


class _HashingReader(io.RawIOBase):
    """Wraps a binary file: hashes and reports every byte read, so the tar is written in one pass."""

    def __init__(self, handle: io.BufferedReader, progress: Callable[[int], object]) -> None:
        self._handle = handle
        self._progress = progress
        self.digest = sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.digest.update(data)
        self._progress(len(data))
        return data

    def readable(self) -> bool:
        return True


def download(manifest: ModelManifest, cache_dir: Path | None) -> Path:
    """Fetch the pinned file with huggingface_hub (optional dependency, imported only here)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise aws.UsageError(
            "--download needs huggingface_hub: pip install 'semif-adapter[hub]' (or pass --gguf PATH)"
        ) from None
    return Path(
        hf_hub_download(
            repo_id=manifest.source_repo,
            filename=manifest.file,
            revision=manifest.revision,
            cache_dir=str(cache_dir) if cache_dir else None,
        )
    )


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def build_archive(
    *,
    gguf: Path,
    manifest: ModelManifest,
    manifest_bytes: bytes,
    output: Path,
    calibration: Path | None,
    compress_level: int,
) -> str:
    """Write ``output`` atomically; returns the verified sha256. Raises ModelLoadError on any mismatch."""
    from tqdm import tqdm

    size = gguf.stat().st_size
    if size != manifest.bytes:
        raise ModelLoadError(
            f"{gguf} is {size} bytes but the manifest expects {manifest.bytes} (truncated or wrong file)"
        )
    calibration_bytes = None
    if calibration is not None:
        Calibration.load(calibration)  # the server's own check: a bad file must not reach an endpoint
        calibration_bytes = calibration.read_bytes()

    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    try:
        with (
            tarfile.open(partial, "w:gz", compresslevel=compress_level) as tar,
            open(gguf, "rb") as handle,
            tqdm(total=size, unit="B", unit_scale=True, desc=f"package {manifest.file}") as bar,
        ):
            reader = _HashingReader(handle, bar.update)
            info = tarfile.TarInfo(manifest.file)
            info.size = size
            info.mode = 0o644
            info.mtime = int(gguf.stat().st_mtime)
            tar.addfile(info, reader)
            actual = reader.digest.hexdigest()
            if actual != manifest.sha256:
                raise ModelLoadError(f"{gguf} has sha256 {actual} but the manifest expects {manifest.sha256}")
            _add_bytes(tar, MANIFEST_NAME, manifest_bytes)
            if calibration_bytes is not None:
                _add_bytes(tar, CALIBRATION_NAME, calibration_bytes)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return actual


def upload(output: Path, uri: str, *, region: str | None, profile: str | None) -> None:
    from tqdm import tqdm

    bucket, key = aws.parse_model_data(uri)
    s3 = aws.client("s3", region=region, profile=profile)
    with tqdm(total=output.stat().st_size, unit="B", unit_scale=True, desc=f"upload {uri}") as bar:
        s3.upload_file(str(output), bucket, key, Callback=bar.update)


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="local GGUF file to package")
    source.add_argument("--download", action="store_true", help="download the manifest's pinned revision")
    parser.add_argument("--manifest", type=Path, default=ROOT / MANIFEST_NAME, help="default: repo root's")
    parser.add_argument(
        "--calibration", type=Path, help="calibration.json to include (default: one next to the GGUF, if any)"
    )
    parser.add_argument("--output", type=Path, default=Path("model.tar.gz"))
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    parser.add_argument("--cache-dir", type=Path, help="huggingface_hub cache for --download")
    parser.add_argument(
        "--compress-level",
        type=int,
        default=1,
        choices=range(0, 10),
        metavar="0-9",
        help="gzip level; quantised weights barely compress, so 1 (fast) is the default",
    )
    parser.add_argument("--upload", metavar="S3_URI", help="s3://bucket/key.tar.gz to upload the result to")
    aws.add_session_args(parser)
    args = parser.parse_args(argv)

    if args.upload:
        aws.parse_model_data(args.upload)  # refuse a bad URI before hours of work
    manifest = load_manifest(args.manifest)
    manifest_bytes = args.manifest.read_bytes()
    if args.output.exists() and not args.force:
        raise aws.UsageError(f"{args.output} exists; pass --force to replace it")
    if args.gguf is not None:
        if not args.gguf.is_file():
            raise aws.UsageError(f"GGUF not found: {args.gguf}")
        gguf = args.gguf
    else:
        gguf = download(manifest, args.cache_dir)
    calibration = args.calibration
    if calibration is None and (gguf.parent / CALIBRATION_NAME).is_file():
        calibration = gguf.parent / CALIBRATION_NAME
    if calibration is not None and not calibration.is_file():
        raise aws.UsageError(f"calibration file not found: {calibration}")
    digest = build_archive(
        gguf=gguf,
        manifest=manifest,
        manifest_bytes=manifest_bytes,
        output=args.output,
        calibration=calibration,
        compress_level=args.compress_level,
    )
    print(
        f"wrote {args.output} ({manifest.file}, sha256 {digest}"
        f"{', with ' + CALIBRATION_NAME if calibration else ''})"
    )
    if args.upload:
        upload(args.output, args.upload, region=args.region, profile=args.profile)
        print(f"uploaded {args.upload}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
