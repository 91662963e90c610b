"""`make gpu-bundle`: everything the GPU machine lacks for `scripts/gpu_check.sh`, in one ignored folder.

The GPU machine (CUDA compiler, CMake, ninja, Python 3.12) reaches no network and receives at most 64 MiB
of the working tree, so this folder (``gpu-bundle/``, checked to stay under 60 MiB) carries:

- ``llama.cpp.tar.xz``: the llama.cpp that llama-cpp-python {BINDING} vendors, pruned to what libllama,
  the CPU and CUDA backends and ``llama-quantize`` need (the tools and vendor CMake lists are cut down to
  those targets);
- ``wheels/``: CPython 3.12 manylinux x86_64 wheels of every runtime and test dependency
  (docker/requirements.lock + scripts/gpu-check-requirements.txt), the bindings-only llama-cpp-python
  wheel (the one the images use; it loads the libllama that LLAMA_CPP_LIB_PATH names) and pip itself;
  ``requirements.txt`` pins each of them for an offline install;
- ``tokenizer.gguf``: the Qwen2.5 test model's tokenizer and chat template without its weights: the
  random-weight models are built from it there, since no model package can travel;
- ``manifest.json``: what was bundled from which commit, every file's size and sha256.

The project itself travels as the working tree. Carry the folder with the device tool (``carry:
["gpu-bundle"]``) and run ``bash scripts/gpu_check.sh`` there.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from semif_ops.cache import cache_home
from semif_ops.image import context as image_context

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "gpu-bundle"
MAX_MIB = 60
PYTHON = "3.12"
ARCH = "x86_64"
BINDING = image_context.BINDING_VERSION
__doc__ = (__doc__ or "").replace("{BINDING}", BINDING)

# Under the sdist's vendor/llama.cpp/: what a libllama + ggml-cpu + ggml-cuda + llama-quantize build reads.
KEEP_PREFIXES = (
    "CMakeLists.txt",
    "LICENSE",
    "cmake/",
    "include/",
    "src/",
    "common/",
    "ggml/CMakeLists.txt",
    "ggml/cmake/",
    "ggml/include/",
    "ggml/src/ggml-cpu/",
    "ggml/src/ggml-cuda/",
    "tools/quantize/",
    "vendor/cpp-httplib/",
    "vendor/nlohmann/",
    "vendor/sheredom/",
)
# Files directly in ggml/src/ (the ggml core); its other sub-folders are the backends we do not build.
GGML_SRC = "ggml/src/"
# The upstream lists add every tool and every vendored library; these add only what the build above needs.
REPLACED = {
    "tools/CMakeLists.txt": (
        "# gpu-bundle: only llama-quantize (the upstream list adds every tool)\n"
        "find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(quantize)\n"
    ),
    "vendor/CMakeLists.txt": (
        "# gpu-bundle: only what llama-common links (the upstream list adds the mtmd libraries too)\n"
        "add_subdirectory(nlohmann)\nadd_subdirectory(sheredom)\n"
        "if (LLAMA_BUILD_COMMON)\n    add_subdirectory(cpp-httplib)\nendif()\n"
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("SEMIF_GPU_BUNDLE_CACHE", cache_home() / "gpu-bundle"))


def sdist_archive(version: str = BINDING) -> Path:
    """llama-cpp-python's sdist (the vendored llama.cpp), downloaded once into the cache."""
    target = cache_dir() / f"llama_cpp_python-{version}.tar.gz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdist-") as tmp:
        image_context.pip(
            "download", "--quiet", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}",
            "-d", tmp,
        )  # fmt: skip
        shutil.move(str(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))), target)
    return target


def _kept(relative: str) -> bool:
    if relative in REPLACED:
        return False
    if relative.startswith(GGML_SRC):
        rest = relative[len(GGML_SRC) :]
        return "/" not in rest or relative.startswith(KEEP_PREFIXES)
    return relative.startswith(KEEP_PREFIXES)


def _entry(name: str, source: tarfile.TarInfo | None, mtime: int, size: int) -> tarfile.TarInfo:
    """A fresh member (no owner, no inherited PAX path) named ``llama.cpp/<name>``."""
    info = tarfile.TarInfo(f"llama.cpp/{name}")
    info.size = size
    info.mtime = int(source.mtime) if source is not None else mtime
    info.mode = 0o755 if source is not None and source.mode & 0o111 else 0o644
    return info


def prune_llama_source(archive: Path, out: Path) -> dict[str, int]:
    """Write the pruned tree as ``out`` (tar.xz, members sorted, owners dropped: the same input gives the
    same bytes). Returns file counts and sizes."""
    vendor = "vendor/llama.cpp/"
    kept: list[tuple[str, tarfile.TarInfo | None, bytes]] = []
    total = dropped = 0
    mtime = 0
    with tarfile.open(archive) as src:
        for member in src.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1].startswith(vendor) or not member.isfile():
                continue
            relative = parts[1][len(vendor) :]
            total += 1
            mtime = max(mtime, int(member.mtime))
            if not _kept(relative):
                dropped += 1
                continue
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            kept.append((relative, member, data))
    if not any(name == "CMakeLists.txt" for name, _, _ in kept):
        raise SystemExit(f"error: {archive} holds no vendor/llama.cpp/CMakeLists.txt")
    kept.extend((name, None, text.encode()) for name, text in REPLACED.items())
    kept.sort(key=lambda item: item[0])
    tmp = out.with_suffix(".tmp")
    unpacked = 0
    with tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT) as dst:
        for name, member, data in kept:
            unpacked += len(data)
            dst.addfile(_entry(name, member, mtime, len(data)), io.BytesIO(data))
    tmp.replace(out)
    return {"files": len(kept), "bytes_unpacked": unpacked, "files_in_sdist": total, "dropped": dropped}


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def download_wheels(wheels: Path) -> list[str]:
    """Every pinned wheel for CPython 3.12 manylinux x86_64, the bindings-only binding and pip."""
    requirements = [
        *requirement_lines(ROOT / "docker" / "requirements.lock"),
        *requirement_lines(ROOT / "scripts" / "gpu-check-requirements.txt"),
    ]
    tags = [arg for tag in image_context.platform_tags(ARCH) for arg in ("--platform", tag)]
    image_context.pip(
        "download", "--quiet", "--no-deps", "--only-binary", ":all:", "--python-version", PYTHON,
        "--implementation", "cp", *tags, "-d", str(wheels), *requirements,
        f"pip=={image_context.PIP_VERSION}",
    )  # fmt: skip
    shutil.copy(image_context.bindings_only_wheel(BINDING), wheels)
    return requirements


def wheel_pins(wheels: Path) -> list[str]:
    """``name==version`` of every wheel but pip (pip runs from its wheel and installs the rest)."""
    pins = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            fields = dict(
                line.split(": ", 1) for line in zf.read(meta).decode().splitlines()[:10] if ": " in line
            )
        if fields["Name"].lower() != "pip":
            pins.append(f"{fields['Name']}=={fields['Version']}")
    return pins


def write_tokenizer(source: Path, out: Path) -> int:
    """A GGUF holding only ``source``'s tokenizer keys (vocabulary, merges, specials, chat template)."""
    import gguf

    reader = gguf.GGUFReader(source)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, "qwen2")
    writer.add_name(f"tokenizer of {source.name} (no weights)")
    n = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), value_type)
        n += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    tmp.replace(out)
    return n


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def bundle_files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file())


def bundle_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in bundle_files(out))


def build(out: Path, tokenizer_source: Path, max_mib: float = MAX_MIB) -> dict:
    """Write the whole bundle into ``out`` (replacing it) and return its manifest."""
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    requirements = download_wheels(wheels)
    (out / "requirements.txt").write_text("\n".join(wheel_pins(wheels)) + "\n")
    archive = sdist_archive()
    source = prune_llama_source(archive, out / "llama.cpp.tar.xz")
    n_keys = write_tokenizer(tokenizer_source, out / "tokenizer.gguf")
    files = {
        str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in bundle_files(out)
    }
    manifest = {
        "python": PYTHON,
        "platform": f"manylinux {ARCH}",
        "binding": BINDING,
        "llama_source": {"sdist": archive.name, **source},
        "requirements": requirements,
        "tokenizer": {"from": tokenizer_source.name, "keys": n_keys},
        "project_commit": _git("rev-parse", "HEAD"),
        "project_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files.values()),
        "max_bytes": int(max_mib * 1024 * 1024),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    manifest["total_bytes"] = bundle_bytes(out)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="bundle folder (replaced)")
    parser.add_argument("--max-mib", type=float, default=MAX_MIB, help="fail when the bundle is larger")
    parser.add_argument(
        "--tokenizer-from", type=Path, help="GGUF whose tokenizer to bundle (default: the Qwen2.5 test model)"
    )
    args = parser.parse_args(argv)
    if args.tokenizer_from is None:
        from semif_adapter.model.demo_models import ensure_model

        args.tokenizer_from = ensure_model("qwen")
    manifest = build(args.out, args.tokenizer_from, args.max_mib)
    total, limit = manifest["total_bytes"], manifest["max_bytes"]
    mib = total / 2**20
    print(f"gpu bundle: {args.out} ({len(manifest['files'])} files, {mib:.1f} MiB of {args.max_mib:g})")
    for name, info in sorted(manifest["files"].items(), key=lambda kv: -kv[1]["bytes"])[:5]:
        print(f"  {info['bytes'] / 2**20:6.1f} MiB  {name}")
    if total > limit:
        print(f"error: the bundle is {mib:.1f} MiB, over the {args.max_mib:g} MiB limit", file=sys.stderr)
        return 1
    print('carry it with the device tool: run(command="bash scripts/gpu_check.sh", carry=["gpu-bundle"])')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
