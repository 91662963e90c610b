"""Prepare what `docker build -f Dockerfile.cpu|gpu .` installs from, so the build needs no network.

Writes, beside the Dockerfiles (gitignored):

- ``docker/wheelhouse/``: every runtime wheel for the base's Python and machine (docker/requirements.lock),
  pip (run from its wheel; the base needs no pip), the bindings-only llama-cpp-python wheel (built here with
  ``-DLLAMA_BUILD=OFF``: no libllama inside, so it is pure Python and retagged ``py3-none-any``), the build
  backend for this project's source (setuptools, wheel), and ``ziglang`` (the layout probe's C compiler
  when the base has none; builder stage only); ``context.json`` says what it was prepared for,
  ``build-args`` the ``--build-arg`` lines to pass;
- ``docker/llama-headers/<version>-<commit>/``: llama.h and the ggml headers (+ VERSION.json) of
  ``--llama-source``, a llama.cpp source tree or release tarball, for bases that ship no headers (the DLC
  ships none); one set per llama.cpp, the build picks the one its library reports.

    semif-ops image context --python 3.12 --arch x86_64 \
        --llama-source llama.cpp-b10964.tar.gz --llama-version 0.4.1 --llama-commit <ggml_commit()>
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from semif_ops.cache import cache_home
from semif_ops.errors import OperationFailed
from semif_ops.exits import command
from semif_ops.image import abi

ROOT = Path(__file__).resolve().parents[2]
BINDING_VERSION = "0.3.36"
PIP_VERSION = "25.3"
ZIGLANG_VERSION = "0.17.1"
BINDINGS_ONLY_CMAKE_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
NATIVE_SUFFIXES = (".so", ".dylib", ".dll", ".pyd")


def cache_dir() -> Path:
    return Path(os.environ.get("SEMIF_WHEEL_CACHE", cache_home() / "wheels"))


def platform_tags(arch: str) -> list[str]:
    """manylinux tags a glibc 2.34 base (AL2023) and newer can install; the DLC and stand-ins are glibc."""
    return [f"manylinux_2_{minor}_{arch}" for minor in (17, 24, 27, 28, 31, 34)] + [f"manylinux2014_{arch}"]


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def download_runtime(wheelhouse: Path, python: str, arch: str) -> None:
    tags = [arg for tag in platform_tags(arch) for arg in ("--platform", tag)]
    target = ["--python-version", python, "--implementation", "cp", "--only-binary", ":all:", *tags]
    lock = ROOT / "docker" / "requirements.lock"
    pip("download", "--quiet", "--no-deps", *target, "-r", str(lock), "-d", str(wheelhouse))
    pip("download", "--quiet", "--no-deps", *target, f"pip=={PIP_VERSION}", f"ziglang=={ZIGLANG_VERSION}",
        "-d", str(wheelhouse))  # fmt: skip


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag_pure(wheel: Path, out_dir: Path) -> Path:
    """Rewrite a wheel that carries no native code as ``py3-none-any`` (WHEEL tags and its RECORD line)."""
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        native = [n for n in names if n.endswith(NATIVE_SUFFIXES) or src.read(n)[:4] == b"\x7fELF"]
        if native:
            raise OperationFailed(f"{wheel.name} is not pure Python (contains {', '.join(native[:5])})")
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        name, version = dist_info[: -len(".dist-info")].rsplit("-", 1)
        target = out_dir / f"{name}-{version}-py3-none-any.whl"
        wheel_meta = src.read(f"{dist_info}/WHEEL").decode()
        replaced = ("Tag:", "Root-Is-Purelib:")
        lines = [ln for ln in wheel_meta.splitlines() if ln and not ln.startswith(replaced)]
        new_meta = ("\n".join(lines) + "\nRoot-Is-Purelib: true\nTag: py3-none-any\n").encode()
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
            record_name = f"{dist_info}/RECORD"
            record = []
            for item in src.infolist():
                if item.filename == record_name:
                    continue
                data = new_meta if item.filename == f"{dist_info}/WHEEL" else src.read(item)
                dst.writestr(item, data)
                record.append(_record_line(item.filename, data))
            record.append(f"{record_name},,")
            dst.writestr(record_name, "\n".join(record) + "\n")
    return target


def bindings_only_wheel(version: str = BINDING_VERSION) -> Path:
    """llama-cpp-python built with LLAMA_BUILD=OFF (cached by version): the ctypes binding, no library."""
    cached = cache_dir() / f"llama_cpp_python-{version}-py3-none-any.whl"
    if cached.is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bindings-") as tmp:
        env = {**os.environ, "CMAKE_ARGS": BINDINGS_ONLY_CMAKE_ARGS}
        pip("wheel", "--quiet", "--no-cache-dir", "--no-deps", "--no-binary", "llama-cpp-python",
            f"llama-cpp-python=={version}", "-w", tmp, env=env)  # fmt: skip
        built = next(Path(tmp).glob("llama_cpp_python-*.whl"))
        out = Path(tmp) / "retagged"
        out.mkdir()
        shutil.copy(retag_pure(built, out), cached)
    return cached


def build_backend(wheelhouse: Path, python: str, arch: str) -> None:
    """setuptools and wheel (pyproject's build-system): the image builds this project from its source, so
    the code in the image is the code in the build context, never a wheel prepared earlier."""
    tags = [arg for tag in platform_tags(arch) for arg in ("--platform", tag)]
    pip("download", "--quiet", "--python-version", python, "--implementation", "cp", "--only-binary", ":all:",
        *tags, "setuptools>=77", "wheel", "-d", str(wheelhouse))  # fmt: skip


def write_headers(source: Path, root: Path, version: str | None, commit: str | None) -> dict[str, str | None]:
    """Copy llama.h and the ggml headers of ``source`` into ``root/<version>-<commit>/`` with VERSION.json.

    Sets for other llama.cpp builds stay: the image build picks the one matching what the base's library
    reports, so one context serves several DLC digests.
    """
    with tempfile.TemporaryDirectory(prefix="llama-src-") as scratch:
        headers = abi.resolve_headers(source, Path(scratch))
        meta = {
            "version": version or headers.version,
            "commit": commit or headers.commit,
            "source": str(source),
        }
        label = re.sub(
            r"[^A-Za-z0-9._-]", "_", "-".join(str(v) for v in (meta["version"], meta["commit"]) if v)
        )
        target = root / (label or "unversioned")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for directory in headers.include_dirs:
            for header in directory.glob("*.h"):
                shutil.copy(header, target / header.name)
    (target / "VERSION.json").write_text(json.dumps(meta, indent=2) + "\n")
    return {**meta, "path": str(target)}


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default="3.12", help="the base image's Python major.minor (DLC: 3.12)")
    parser.add_argument("--arch", default=platform.machine(), choices=("x86_64", "aarch64"))
    parser.add_argument(
        "--llama-source", type=Path, help="llama.cpp source tree or release .tar.gz (headers)"
    )
    parser.add_argument("--llama-version", help="llama_version() of the base (default: from the source)")
    parser.add_argument("--llama-commit", help="ggml_commit() of the base (default: unchecked)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docker", help="where wheelhouse/ and llama-headers/ go"
    )
    parser.add_argument("--clean-headers", action="store_true", help="drop header sets prepared before")
    args = parser.parse_args(argv)

    # Headers first: a wrong --llama-source is refused before minutes of wheel downloads.
    version, commit = args.llama_version, args.llama_commit
    headers_dir = args.out / "llama-headers"
    if args.clean_headers and headers_dir.exists():
        shutil.rmtree(headers_dir)
    if args.llama_source:
        meta = write_headers(args.llama_source, headers_dir, version, commit)
        version, commit = meta["version"], meta["commit"]
        print(f"headers: {meta['path']} (llama.cpp {version}, commit {commit or 'unknown'})")

    wheelhouse = args.out / "wheelhouse"
    if wheelhouse.exists():
        shutil.rmtree(wheelhouse)
    wheelhouse.mkdir(parents=True)
    if args.arch != platform.machine():
        print(f"note: preparing {args.arch} wheels on {platform.machine()} (pure-Python pieces are the same)")
    download_runtime(wheelhouse, args.python, args.arch)
    shutil.copy(bindings_only_wheel(), wheelhouse)
    build_backend(wheelhouse, args.python, args.arch)
    context = {
        "python": args.python,
        "arch": args.arch,
        "binding": BINDING_VERSION,
        "wheels": sorted(p.name for p in wheelhouse.glob("*.whl")),
    }
    (wheelhouse / "context.json").write_text(json.dumps(context, indent=2) + "\n")
    build_args = [
        f"--build-arg LLAMA_CPP_VERSION={version or ''}",
        f"--build-arg LLAMA_CPP_COMMIT={commit or ''}",
    ]
    (wheelhouse / "build-args").write_text("\n".join(build_args) + "\n")
    print(f"wheelhouse: {wheelhouse} ({len(context['wheels'])} wheels, Python {args.python}, {args.arch})")
    print("build with: " + " ".join(build_args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
