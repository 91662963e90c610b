"""`make gpu-bundle`: small enough to carry, complete enough to build and install offline."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from scripts import gpu_bundle
from semif_ops.image import context as prepare_image_context


def test_the_bundle_fits_the_carry_limit_and_its_manifest_is_true(bundle: dict) -> None:
    root: Path = bundle["path"]
    manifest = json.loads((root / "manifest.json").read_text())
    assert gpu_bundle.bundle_bytes(root) <= gpu_bundle.MAX_MIB * 1024 * 1024
    for name, info in manifest["files"].items():
        assert (root / name).stat().st_size == info["bytes"], name
    assert {"llama.cpp.tar.xz", "tokenizer.gguf", "requirements.txt"} <= set(manifest["files"])
    assert main_fails_when_over_the_limit(root)


def main_fails_when_over_the_limit(root: Path) -> bool:
    """The size check is real: the same bundle against a 1 MiB limit is refused."""
    done = subprocess.run(
        [sys.executable, "scripts/gpu_bundle.py", "--out", str(root.parent / "tiny"), "--max-mib", "1",
         "--tokenizer-from", str(root / "tokenizer.gguf")],
        cwd=gpu_bundle.ROOT, capture_output=True, text=True,
    )  # fmt: skip
    return done.returncode == 1 and "over the 1 MiB limit" in done.stderr


def test_the_pruned_source_keeps_every_cuda_and_quantize_file(bundle: dict) -> None:
    """Every file of the CUDA backend, the CPU backend, libllama and llama-quantize is there, byte for byte;
    the two replaced CMake lists add only the targets the build needs."""
    with tarfile.open(gpu_bundle.sdist_archive()) as sdist:
        upstream = {
            m.name.split("/vendor/llama.cpp/", 1)[1]: sdist.extractfile(m).read()  # type: ignore[union-attr]
            for m in sdist.getmembers()
            if m.isfile() and "/vendor/llama.cpp/" in m.name
        }
    with tarfile.open(bundle["path"] / "llama.cpp.tar.xz") as pruned:
        kept = {m.name.removeprefix("llama.cpp/"): pruned.extractfile(m).read() for m in pruned.getmembers()}  # type: ignore[union-attr]
    needed = [
        n for n in upstream
        if n.startswith(("ggml/src/ggml-cuda/", "ggml/src/ggml-cpu/", "src/", "include/", "tools/quantize/"))
    ]  # fmt: skip
    assert len(needed) > 400
    differing = [n for n in needed if kept.get(n) != upstream[n]]
    assert not differing, differing[:5]
    assert b"add_subdirectory(quantize)" in kept["tools/CMakeLists.txt"]
    assert b"miniaudio" not in kept["vendor/CMakeLists.txt"]
    assert not any(n.startswith(("ggml/src/ggml-vulkan/", "tools/server/", "models/")) for n in kept)


def test_the_wheel_set_resolves_offline_for_python_312(bundle: dict, tmp_path: Path) -> None:
    """pip resolves every pinned requirement and each wheel's own dependencies from the bundle alone,
    for the GPU machine's CPython 3.12 on x86_64."""
    root: Path = bundle["path"]
    tags = [a for tag in prepare_image_context.platform_tags("x86_64") for a in ("--platform", tag)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
         "--find-links", str(root / "wheels"), "--only-binary", ":all:", "--python-version", "3.12",
         "--implementation", "cp", *tags, "--target", str(tmp_path / "t"),
         "-r", str(root / "requirements.txt")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Would install" in done.stdout and "llama_cpp_python_0.3.36" in done.stdout.replace("-", "_")
