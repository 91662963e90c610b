"""Build Dockerfile.cpu on local DLC stand-ins with podman and test its running container (make test-image).

1. Stand-in bases (scripts/dlc_standin.py): llama.cpp from the llama-cpp-python 0.3.36 sdist (the working
   image) and from 0.3.35 (older ``llama_model_params``: the build must refuse it). Cached between runs.
2. ``Dockerfile.cpu`` built unchanged on the 0.3.36 stand-in; only ``BASE_IMAGE`` (its local digest) differs.
3. The image run with gemma-3-270m packaged with its manifest (scripts/package_model.py) at /opt/ml/model.
4. pytest: ``tests/contract/test_contract.py`` against the container through ``SEMIF_TEST_URL``, and
   ``tests/image`` (user, toolchain, libraries, SIGTERM, and the refused build on the 0.3.35 stand-in).

Needs root and podman (``.ci/setup-podman.sh`` installs and configures it). Logs go to
``$SEMIF_CACHE_DIR/image-test/`` (default ``~/.cache/semif-adapter``).

    python scripts/test_image.py [--keep] [-- <extra pytest args>]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

try:
    from scripts import dlc_standin
except ModuleNotFoundError:  # run as a file: python scripts/test_image.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from scripts import dlc_standin

ROOT = Path(__file__).resolve().parents[1]
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
IMAGE = "localhost/semif-adapter:image-test"
CONTAINER = "semif-image-test"
CURRENT_BINDING = "0.3.36"
OLD_BINDING = "0.3.35"
# The GGUF comes from a PyPI package, not the hub, so no hub revision is known: a placeholder commit.
GEMMA_SOURCE = {"source_repo": "ggml-org/gemma-3-270m-GGUF", "revision": "0" * 40, "license": "gemma"}


def log(message: str) -> None:
    print(f"[test-image] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def timed(label: str, timings: dict[str, float]) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        timings[label] = time.monotonic() - start
        log(f"{label}: {timings[label]:.0f} s")


def base_python(base: str) -> str:
    """major.minor of the base image's python3 (the wheelhouse must be prepared for it)."""
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    done = subprocess.run([*PODMAN, "run", "--rm", "--network", "none", base, "python3", "-c", probe],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def build_context(target: Path, base: str, llama_tree: Path, commit: str) -> Path:
    """A throw-away copy of the build context, prepared for ``base`` (Python, arch, llama.cpp headers).

    The files git knows (tracked or not ignored), then ``scripts/prepare_image_context.py --out`` into it:
    the repository's docker/wheelhouse stays untouched and each base gets the headers of its llama.cpp."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout  # fmt: skip
    shutil.rmtree(target, ignore_errors=True)
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prepare_image_context.py"), "--python", base_python(base),
         "--arch", platform.machine(), "--llama-source", str(llama_tree), "--llama-commit", commit,
         "--out", str(target / "docker")],
        check=True, cwd=ROOT,
    )  # fmt: skip
    return target


def podman_build(context: Path, base: str, tag: str, logfile: Path) -> subprocess.CompletedProcess[bytes]:
    """``podman build`` of the context's Dockerfile.cpu with BASE_IMAGE and the prepared build args.

    ``--format docker`` because podman's default OCI format ignores ``SHELL`` (Docker honours it)."""
    build_args = (context / "docker" / "wheelhouse" / "build-args").read_text().split()
    cmd = [*PODMAN, "build", "--format", "docker", "--layers", "-f", str(context / "Dockerfile.cpu"),
           *build_args, "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(context)]  # fmt: skip
    with logfile.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)


def model_dir(work: Path) -> Path:
    """gemma-3-270m packaged with its manifest by scripts/package_model.py, extracted as SageMaker does."""
    from semif_adapter.demo_models import MODELS, ensure_model

    gguf = ensure_model("gemma")
    target = work / "opt-ml-model"
    if (target / gguf.name).is_file():
        return target
    spec = MODELS["gemma"]
    manifest = {
        "schema_version": 1,
        "name": "gemma-3-270m-q4_k_m",
        **GEMMA_SOURCE,
        "file": gguf.name,
        "bytes": spec.size,
        "sha256": spec.sha256,
        "prompt_version": "semif-decision-v1",
    }
    staging = work / "package"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "model-manifest.json").write_text(json.dumps(manifest, indent=2))
    archive = staging / "model.tar.gz"
    package = [sys.executable, str(ROOT / "scripts" / "package_model.py"), "--gguf", str(gguf),
               "--manifest", str(staging / "model-manifest.json"), "--output", str(archive)]  # fmt: skip
    done = subprocess.run(package, capture_output=True, text=True, check=False)  # quiet: no progress bar
    if done.returncode != 0:
        raise SystemExit(f"error: package_model.py failed: {done.stderr.strip()[-2000:]}")
    log(done.stdout.strip())
    partial = work / "opt-ml-model.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(partial, filter="data")
    partial.chmod(0o755)
    for path in partial.iterdir():
        path.chmod(0o644)  # the server runs as an unprivileged user
    shutil.rmtree(staging)
    partial.rename(target)
    return target


def run_container(name: str, models: Path, env: dict[str, str] | None = None, image: str = IMAGE) -> str:
    """Start the image as SageMaker does (``serve``, model at /opt/ml/model); returns its URL on this host."""
    subprocess.run([*PODMAN, "rm", "--force", "--ignore", name], check=True, capture_output=True)
    cmd = [*PODMAN, "run", "--detach", "--name", name, "--publish", "127.0.0.1::8080",
           "--volume", f"{models}:/opt/ml/model:ro"]  # fmt: skip
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    subprocess.run([*cmd, image, "serve"], check=True, stdout=subprocess.DEVNULL)
    port = subprocess.run([*PODMAN, "port", name, "8080"], check=True, capture_output=True, text=True)
    return "http://" + port.stdout.strip().splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", action="store_true", help="leave the container running afterwards")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("SEMIF_BUILD_JOBS", "2")))
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = parser.parse_args(argv)
    if shutil.which("podman") is None:
        log("error: podman is not installed; run .ci/setup-podman.sh first")
        return 2
    work = dlc_standin.cache_root() / "image-test"
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.monotonic()

    bases = {}
    for binding in (CURRENT_BINDING, OLD_BINDING):
        with timed(f"stand-in base from llama-cpp-python {binding}", timings):
            bases[binding] = dlc_standin.standin(binding, jobs=args.jobs)
        log(f"stand-in for {binding}: {bases[binding]}")
    with timed("build contexts (wheelhouse + headers)", timings):
        contexts = {
            binding: build_context(work / f"context-{binding}", bases[binding], *dlc_standin.headers(binding))
            for binding in bases
        }

    build_log = work / "build-current.log"
    with timed("podman build Dockerfile.cpu", timings):
        built = podman_build(contexts[CURRENT_BINDING], bases[CURRENT_BINDING], IMAGE, build_log)
    if built.returncode != 0:
        tail = build_log.read_text(errors="replace").splitlines()[-40:]
        log(f"error: podman build failed ({built.returncode}); end of {build_log}:\n" + "\n".join(tail))
        return 1

    models = model_dir(work)
    url = run_container(CONTAINER, models, {"SEMIF_N_THREADS": "2"})
    env = {
        **os.environ,
        "SEMIF_TEST_URL": url,
        "SEMIF_TEST_IMAGE": IMAGE,
        "SEMIF_TEST_CONTAINER": CONTAINER,
        "SEMIF_TEST_MODEL_DIR": str(models),
        "SEMIF_TEST_OLD_BASE": bases[OLD_BINDING],
        "SEMIF_TEST_OLD_CONTEXT": str(contexts[OLD_BINDING]),
        "SEMIF_TEST_WORK_DIR": str(work),
    }
    try:
        with timed("pytest against the container", timings):
            pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/contract/test_contract.py", "tests/image", *args.pytest_args]  # fmt: skip
            tests = subprocess.run(pytest, cwd=ROOT, env=env, check=False)
    finally:
        logs = subprocess.run([*PODMAN, "logs", CONTAINER], capture_output=True, text=True, check=False)
        (work / "container.log").write_text(logs.stdout + logs.stderr)
        if not args.keep:
            subprocess.run(
                [*PODMAN, "rm", "--force", "--ignore", CONTAINER], capture_output=True, check=False
            )
    timings["total"] = time.monotonic() - started
    log("timings: " + ", ".join(f"{label} {seconds:.0f} s" for label, seconds in timings.items()))
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
