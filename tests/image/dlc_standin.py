"""Build a local stand-in for the llama.cpp DLC base image, for container tests on machines with no registry.

The real base cannot be pulled here, so this makes an image that is no kinder than it: a Linux root
filesystem whose ``PATH`` holds exactly the commands of the Amazon Linux 2023 container image plus the DLC's
additions (``semif_ops/image/dlc_base.py``: no ``find``, ``xargs``, ``which``, ``tar``, ``gzip``, ``ps``,
``perl``),
one Python 3 (``python3``, ``python``), and llama.cpp built as shared libraries with ``GGML_BACKEND_DL=ON``
(CPU backends as runtime-loaded ``libggml-cpu-<variant>.so`` plugins) in ``/opt/llama.cpp/bin``; it runs as
root with the DLC's environment and ``ENTRYPOINT ["/usr/bin/serve"]``. Like the DLC it ships no llama.cpp
headers and no compiler. (Known differences it cannot remove: Debian's glibc and Python minor version.)

The llama.cpp source is the tree vendored in a llama-cpp-python sdist, so a stand-in can be made for any
binding release (0.3.36 for the working image, 0.3.35 for the layout-guard test). The root filesystem
comes from ``debootstrap`` against the Debian archive that this machine's apt sources already name.

Everything slow is cached under ``$SEMIF_CACHE_DIR`` (default ``~/.cache/semif-adapter``): the sdist, the
root filesystem (keyed by archive, suite and package list) and the compiled libraries (keyed by the
sdist's sha256 and the build flags). The image is imported with ``podman import`` and printed as
``<name>@sha256:<digest>``, the form ``Dockerfile.cpu`` requires for ``BASE_IMAGE``.

    python -m tests.image.dlc_standin --binding-version 0.3.36
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from semif_ops.cache import cache_home
from semif_ops.image import dlc_base

IMAGE_NAME = "localhost/semif-dlc-standin"
LIB_DIR = dlc_base.LIB_DIR  # where the DLC copies llama.cpp's build/bin (binaries and .so files)
# Debian's counterparts of what the DLC's runtime stage has (AL2023 container image + its dnf additions).
ROOTFS_PACKAGES = (
    "python3", "python3-pip", "python3-venv", "libgomp1", "ca-certificates", "gawk", "curl", "libopenblas0",
)  # fmt: skip
PATH_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "bin", "sbin")
# The DLC's /usr/bin/serve starts llama-server; the stand-in has none, so its serve says so.
SERVE_SCRIPT = """#!/bin/bash
# semif-adapter DLC stand-in: the real DLC's /usr/bin/serve starts llama-server, which this stand-in lacks.
echo "DLC stand-in: no llama-server here; child images set their own ENTRYPOINT" >&2
exit 1
"""
# One baseline and one AVX2 plugin: the DLC builds all x86 variants (GGML_CPU_ALL_VARIANTS); two keep
# the same file layout and the runtime selection without compiling fourteen copies of the CPU backend.
CPU_VARIANTS = {"x86_64": ("x64", "haswell"), "aarch64": ("armv8.0_1", "armv8.2_2")}
CMAKE_FLAGS = (
    "-G",
    "Unix Makefiles",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    "-DGGML_OPENMP=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # The sdist carries the submodule's git link, so ggml would report "<hash>-dirty" (the sdist leaves files
    # out). The DLC builds from a clean clone; without git lookups ggml reports LLAMA_BUILD_COMMIT instead.
    "-DGIT_EXE=OFF",
)
# The DLC's runtime environment (its Dockerfile sets these; the child image must not depend on more).
IMAGE_ENV = dict(dlc_base.ENV)


def cache_root() -> Path:
    return Path(os.environ.get("SEMIF_CACHE_DIR") or cache_home())


def log(message: str) -> None:
    print(f"[standin] {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | os.PathLike[str]], logfile: Path | None = None, **kwargs: object) -> None:
    """Run a command; with a log file, its output goes there and the tail is shown when it fails."""
    if logfile is None:
        subprocess.run([str(c) for c in cmd], check=True, **kwargs)  # type: ignore[call-overload]
        return
    with logfile.open("ab") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit(
            f"error: {cmd[0]} failed ({done.returncode}); last lines of {logfile}:\n" + "\n".join(tail)
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def short_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# --- the Debian archive this machine already uses ----------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    uri: str
    suite: str
    keyring: str | None


def _deb822_entries(text: str) -> list[dict[str, str]]:
    entries: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                entries.append(current)
            current = {}
        elif not line.startswith("#") and ":" in line and not line[0].isspace():
            key, value = line.split(":", 1)
            current[key.strip().lower()] = value.strip()
    return entries


def apt_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    """Every (URI, suite) pair in the machine's apt configuration, one-line and deb822 formats."""
    found: list[AptSource] = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in files:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            match = re.match(r"^\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)", line)
            if match:
                keyring = re.search(r"signed-by=(\S+)", match["opts"] or "")
                found.append(AptSource(match["uri"], match["suite"], keyring[1] if keyring else None))
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        for entry in _deb822_entries(path.read_text()):
            if "deb" not in entry.get("types", "").split() or entry.get("enabled", "yes") == "no":
                continue
            for uri in entry.get("uris", "").split():
                for suite in entry.get("suites", "").split():
                    found.append(AptSource(uri, suite, entry.get("signed-by")))
    return found


def host_codename(os_release: Path = Path("/etc/os-release")) -> str:
    fields = dict(
        line.split("=", 1) for line in os_release.read_text().splitlines() if "=" in line and line[0] != "#"
    )
    codename = fields.get("VERSION_CODENAME", "").strip('"')
    if not codename:
        raise SystemExit(f"error: no VERSION_CODENAME in {os_release}; pass --suite and --mirror")
    return codename


def debian_archive(sources: list[AptSource], suite: str) -> AptSource:
    """The source that serves the release suite itself (not -security/-updates) for ``suite``."""
    for source in sources:
        if source.suite == suite and source.uri.startswith(("http://", "https://")):
            return source
    raise SystemExit(
        f"error: no apt source serves suite '{suite}' (found: {[(s.uri, s.suite) for s in sources]}); "
        "pass --mirror"
    )


# --- the three cached ingredients -------------------------------------------------------------------------


def fetch_sdist(version: str, cache: Path) -> Path:
    """The llama-cpp-python sdist through pip (the index this machine's pip is configured for)."""
    target = cache / "sdists"
    existing = sorted(target.glob(f"llama_cpp_python-{version}.tar.gz"))
    if existing:
        return existing[0]
    target.mkdir(parents=True, exist_ok=True)
    log(f"downloading the llama-cpp-python {version} sdist")
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
         "-d", target, f"llama-cpp-python=={version}"])  # fmt: skip
    existing = sorted(target.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not existing:
        raise SystemExit(f"error: pip did not produce llama_cpp_python-{version}.tar.gz in {target}")
    return existing[0]


def strip_to_base(root: Path) -> list[str]:
    """Leave on PATH only what the DLC's base has (``dlc_base.allowed``); returns what was removed.

    Debian's /bin and /sbin are links into /usr (merged /usr), so each real directory is visited once.
    ``sh`` becomes bash and ``awk`` gawk, as on Amazon Linux; ``python`` and ``pip`` point at the one Python.
    """
    removed: list[str] = []
    seen: set[Path] = set()
    for name in PATH_DIRS:
        directory = root / name
        if directory.is_symlink() or not directory.is_dir() or directory.resolve() in seen:
            continue
        seen.add(directory.resolve())
        for entry in sorted(directory.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                continue
            if not dlc_base.allowed(entry.name):
                entry.unlink()
                removed.append(f"/{name}/{entry.name}")
    usr_bin = root / "usr" / "bin"
    links = {"sh": "bash", "awk": "gawk", "python": "python3", "pip": "pip3"}
    for link, target in links.items():
        if (usr_bin / target).exists() or (usr_bin / target).is_symlink():
            (usr_bin / link).unlink(missing_ok=True)
            (usr_bin / link).symlink_to(target)
    serve = usr_bin / "serve"
    serve.write_text(SERVE_SCRIPT)
    serve.chmod(0o755)
    dangling = [p.name for p in usr_bin.iterdir() if p.is_symlink() and not _resolves_in(root, p)]
    if dangling:
        raise SystemExit(f"error: stripping the stand-in left dangling commands: {dangling}")
    return removed


def _resolves_in(root: Path, link: Path) -> bool:
    """Whether a symlink inside the root filesystem resolves to an existing file there (absolute or not)."""
    for _ in range(16):
        target = Path(os.readlink(link))
        target = root / target.relative_to("/") if target.is_absolute() else link.parent / target
        if not target.is_symlink():
            return target.exists()
        link = target
    return False


def build_rootfs(source: AptSource, suite: str, cache: Path) -> Path:
    """A minimal Debian root filesystem stripped to the DLC base's commands, as a plain tar (cached)."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    key = short_key(source.uri, suite, arch.strip(), ROOTFS_PACKAGES, sorted(dlc_base.COMMANDS), SERVE_SCRIPT)
    tar_path = cache / "rootfs" / f"{suite}-{key}.tar"
    if tar_path.is_file():
        return tar_path
    if shutil.which("debootstrap") is None:
        raise SystemExit("error: debootstrap is not installed (run .ci/setup-podman.sh)")
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    logfile = tar_path.with_suffix(".log")
    logfile.unlink(missing_ok=True)
    log(f"debootstrap {suite} from {source.uri} (log: {logfile})")
    with tempfile.TemporaryDirectory(dir=tar_path.parent) as work:
        root = Path(work) / "root"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}"]
        if source.keyring and Path(source.keyring).is_file():
            cmd.append(f"--keyring={source.keyring}")
        run([*cmd, suite, root, source.uri], logfile)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for leftover in (root / "var/lib/apt/lists").glob("*_dists_*"):
            leftover.unlink()
        removed = strip_to_base(root)
        log(f"removed {len(removed)} commands the DLC's base does not have (e.g. find, xargs, tar)")
        partial = tar_path.with_suffix(".partial")
        run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial, "."], logfile)
        partial.rename(tar_path)
    return tar_path


def vendored_commit(changelog: str) -> str:
    """The llama.cpp commit an sdist vendors, from its CHANGELOG (the sdist carries no git metadata)."""
    match = re.search(r"update llama\.cpp to ggml-org/llama\.cpp@([0-9a-f]{7,40})", changelog)
    return match[1] if match else "unknown"


def build_libraries(sdist: Path, cache: Path, jobs: int) -> tuple[Path, str]:
    """Compile libllama/libggml and the CPU plugins from the sdist's vendored llama.cpp (cached)."""
    machine = platform.machine()
    variants = CPU_VARIANTS.get(machine)
    if variants is None:
        raise SystemExit(f"error: no CPU plugin variants known for {machine}")
    key = short_key(sha256_file(sdist), CMAKE_FLAGS, variants, machine)
    out = cache / "llama-libs" / key
    done = out / "commit.txt"
    if done.is_file():
        return out / "bin", done.read_text().strip()
    out.mkdir(parents=True, exist_ok=True)
    logfile = out / "build.log"
    logfile.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as work:
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = next(Path(work).glob("llama_cpp_python-*"))
        commit = vendored_commit((source / "CHANGELOG.md").read_text())
        llama = source / "vendor" / "llama.cpp"
        build = Path(work) / "build"
        log(f"compiling llama.cpp {commit} from {sdist.name} with {jobs} jobs (log: {logfile})")
        configure: list[str | os.PathLike[str]] = ["cmake", "-S", llama, "-B", build, *CMAKE_FLAGS]
        run([*configure, f"-DLLAMA_BUILD_COMMIT={commit}", "-DLLAMA_BUILD_NUMBER=0"], logfile)
        # ggml depends on every CPU variant target; build the chosen plugins first, then ggml and llama
        # without their dependency checks ("<target>/fast", Makefile generator) so no other variant compiles.
        plugins = [f"ggml-cpu-{v}" for v in variants]
        run(["cmake", "--build", build, "--parallel", str(jobs), "--target", "ggml-base", *plugins], logfile)
        run(["make", "-C", build, f"-j{jobs}", "ggml/fast"], logfile)
        run(["make", "-C", build, f"-j{jobs}", "llama/fast"], logfile)
        staged = out / "bin.partial"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        for lib in sorted((build / "bin").glob("*.so*")):
            if lib.is_symlink():
                (staged / lib.name).symlink_to(os.readlink(lib))
            else:
                shutil.copy2(lib, staged / lib.name)
        if not any(staged.glob("libllama.so*")) or not any(staged.glob("libggml-cpu-*.so")):
            raise SystemExit(
                f"error: the build produced no libllama or CPU plugin: {sorted(staged.iterdir())}"
            )
        shutil.rmtree(out / "bin", ignore_errors=True)
        staged.rename(out / "bin")
    done.write_text(commit + "\n")
    return out / "bin", commit


def header_tree(sdist: Path, cache: Path) -> Path:
    """The headers (and CMake version files) of the sdist's vendored llama.cpp, as a trimmed source tree.

    The DLC ships no llama.h, so the image build takes headers from its context; this is what the stand-in
    was compiled from, laid out like a llama.cpp checkout (include/, ggml/include/, CMakeLists.txt)."""
    out = cache / "llama-src" / short_key(sha256_file(sdist))
    marker = out / "llama.cpp" / "include" / "llama.h"
    if marker.is_file():
        return out / "llama.cpp"
    wanted = re.compile(
        r"^[^/]+/vendor/llama\.cpp/((ggml/)?include/[^/]+\.h|(ggml/)?CMakeLists\.txt|cmake/[^/]+)$"
    )
    staged = out.with_name(out.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.isfile() and wanted.match(m.name)]
        changelog = next(m for m in archive.getmembers() if re.fullmatch(r"[^/]+/CHANGELOG\.md", m.name))
        commit = vendored_commit(archive.extractfile(changelog).read().decode())  # type: ignore[union-attr]
        for member in members:
            member.name = "llama.cpp/" + member.name.split("/vendor/llama.cpp/", 1)[1]
        archive.extractall(staged, members=members, filter="data")
    (staged / "llama.cpp" / "COMMIT").write_text(commit + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    return out / "llama.cpp"


# --- the image ---------------------------------------------------------------------------------------------


def podman(*args: str) -> str:
    done = subprocess.run(["podman", *args], text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: podman {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def existing_image(tag: str) -> str | None:
    found = subprocess.run(["podman", "image", "exists", tag], check=False)
    if found.returncode != 0:
        return None
    return podman("image", "inspect", "--format", "{{.Digest}}", tag) or None


def import_image(rootfs: Path, libs: Path, tag: str, labels: dict[str, str], cache: Path) -> str:
    """Root filesystem + libraries as one tar, imported with the DLC's environment; returns the digest."""
    with tempfile.TemporaryDirectory(dir=cache) as work:
        combined = Path(work) / "image.tar"
        shutil.copyfile(rootfs, combined)
        with tarfile.open(combined, "a") as archive:
            present = {name.lstrip("./").rstrip("/") for name in archive.getnames()}
            parts = [str(Path(*Path(LIB_DIR).parts[:i])) for i in range(1, len(Path(LIB_DIR).parts) + 1)]
            for part in (p for p in parts if p not in present):  # the layer format refuses duplicates
                info = tarfile.TarInfo(f"./{part}")
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            for lib in sorted(libs.iterdir()):
                info = archive.gettarinfo(str(lib), f"./{LIB_DIR}/{lib.name}")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if lib.is_symlink():
                    archive.addfile(info)
                else:
                    info.mode = 0o755
                    with lib.open("rb") as handle:
                        archive.addfile(info, handle)
        changes = [f"ENV {name}={value}" for name, value in IMAGE_ENV.items()]
        changes += [f"LABEL {name}={value}" for name, value in labels.items()]
        changes += ["USER root", f'ENTRYPOINT ["{dlc_base.ENTRYPOINT}"]']
        args = ["import", "--quiet"]
        for change in changes:
            args += ["--change", change]
        podman(*args, str(combined), tag)
    digest = existing_image(tag)
    if not digest:
        raise SystemExit(f"error: podman import of {tag} left no image digest")
    return digest


def headers(binding_version: str) -> tuple[Path, str]:
    """(header tree, vendored commit) of a stand-in's llama.cpp: the offline source of llama.h for builds."""
    cache = cache_root() / "standin"
    tree = header_tree(fetch_sdist(binding_version, cache), cache)
    return tree, (tree / "COMMIT").read_text().strip()


def libraries(binding_version: str, jobs: int = 2) -> Path:
    """The directory of the stand-in's compiled libllama/libggml (what it carries in /opt/llama.cpp/bin)."""
    cache = cache_root() / "standin"
    cache.mkdir(parents=True, exist_ok=True)  # a fresh machine has no cache folder yet
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_libraries(fetch_sdist(binding_version, cache), cache, jobs)[0]


def standin(
    binding_version: str, *, jobs: int = 2, suite: str | None = None, mirror: str | None = None
) -> str:
    """Build (or reuse) the stand-in for a llama-cpp-python release; returns ``name@sha256:<digest>``."""
    cache = cache_root() / "standin"
    cache.mkdir(parents=True, exist_ok=True)
    suite = suite or host_codename()
    source = AptSource(mirror, suite, None) if mirror else debian_archive(apt_sources(), suite)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run on this machine waits instead of compiling twice
        sdist = fetch_sdist(binding_version, cache)
        libs, commit = build_libraries(sdist, cache, jobs)
        rootfs = build_rootfs(source, suite, cache)
    tag = f"{IMAGE_NAME}:{binding_version}-{short_key(rootfs.name, str(libs))}"
    digest = existing_image(tag)
    if digest is None:
        labels = {
            "org.semif.standin.llama-cpp-python": binding_version,
            "org.semif.standin.llama-cpp-commit": commit,
            "org.semif.standin.suite": suite,
        }
        log(f"importing {tag}")
        digest = import_image(rootfs, libs, tag, labels, cache)
    return f"{IMAGE_NAME}@{digest}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--binding-version", default="0.3.36", help="llama-cpp-python sdist to take llama.cpp from"
    )
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("SEMIF_BUILD_JOBS", "2")))
    parser.add_argument("--suite", help="Debian suite for the root filesystem (default: this machine's)")
    parser.add_argument("--mirror", help="Debian archive URI (default: the one this machine's apt uses)")
    args = parser.parse_args(argv)
    print(standin(args.binding_version, jobs=args.jobs, suite=args.suite, mirror=args.mirror))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
