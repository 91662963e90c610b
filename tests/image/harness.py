"""Build Dockerfile.cpu on local DLC stand-ins with podman and test its running container (make test-image).

1. Stand-in bases (tests/image/dlc_standin.py), as bare as Amazon Linux 2023: llama.cpp from the
   llama-cpp-python 0.3.36 sdist (the struct layouts of DLC v0.4.1) and from 0.3.35 (no ``lazy_mode`` in
   ``llama_model_params``, like DLC b10433). Cached between runs.
2. ``Dockerfile.cpu`` built unchanged on each; only ``BASE_IMAGE`` (its local digest) and the prepared headers
   in the build context differ. A third build, on the 0.3.36 base with a llama.h whose ``n_ubatch`` is
   renamed, must stop naming that field.
3. Each image run with gemma-3-270m packaged with its manifest (semif-ops model package) at /opt/ml/model.
4. pytest, once per layout: ``tests/contract/test_contract.py`` against the container through
   ``SEMIF_TEST_URL``, and ``tests/image`` (bare base, user, toolchain, libraries, answers equal to those of
   the binding written for that llama.cpp, SIGTERM); the refused build once.

Needs root and podman (``.ci/setup-podman.sh`` installs and configures it). Logs go to
``$SEMIF_CACHE_DIR/image-test/`` (default ``~/.cache/semif-adapter``).

    python -m tests.image.harness [--keep] [-- <extra pytest args>]
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

from tests.image import dlc_standin

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
IMAGE = "localhost/semif-adapter:image-test"
CONTAINER = "semif-image-test"
CURRENT_BINDING = "0.3.36"  # llama.cpp 0c1e57098: the structs of DLC v0.4.1 (b10964)
OLD_BINDING = "0.3.35"  # llama.cpp 4df29be4f: no lazy_mode, the llama_model_params of DLC b10433
LAYOUTS = (CURRENT_BINDING, OLD_BINDING)
# The broken-header case: a field the engine writes, renamed in an otherwise unchanged llama.h.
BROKEN_FIELD = ("uint32_t n_ubatch;", "uint32_t n_ubatch_renamed;")
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
    run = [*PODMAN, "run", "--rm", "--network", "none", "--entrypoint", "python3", base, "-c", probe]
    done = subprocess.run(run, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def build_context(target: Path, base: str, llama_tree: Path, commit: str) -> Path:
    """A throw-away copy of the build context, prepared for ``base`` (Python, arch, llama.cpp headers).

    The files git knows (tracked or not ignored), then ``semif-ops image context --out`` into it:
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
        [sys.executable, "-m", "semif_ops", "image", "context", "--python", base_python(base),
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
    """gemma-3-270m packaged with its manifest by semif-ops model package, extracted as SageMaker does."""
    from semif_adapter.model.demo_models import MODELS, ensure_model

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
    package = [sys.executable, "-m", "semif_ops", "model", "package", "--gguf", str(gguf),
               "--manifest", str(staging / "model-manifest.json"), "--output", str(archive)]  # fmt: skip
    done = subprocess.run(package, capture_output=True, text=True, check=False)  # quiet: no progress bar
    if done.returncode != 0:
        raise SystemExit(f"error: semif-ops model package failed: {done.stderr.strip()[-2000:]}")
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

    bases, contexts, libs = {}, {}, {}
    for binding in LAYOUTS:
        with timed(f"stand-in base from llama-cpp-python {binding}", timings):
            bases[binding] = dlc_standin.standin(binding, jobs=args.jobs)
            libs[binding] = dlc_standin.libraries(binding, jobs=args.jobs)
        log(f"stand-in for {binding}: {bases[binding]}")
    with timed("build contexts (wheelhouse + headers)", timings):
        for binding in LAYOUTS:
            contexts[binding] = build_context(
                work / f"context-{binding}", bases[binding], *dlc_standin.headers(binding)
            )
        tree, commit = dlc_standin.headers(CURRENT_BINDING)
        broken = build_context(
            work / "context-broken",
            bases[CURRENT_BINDING],
            broken_headers(tree, work / "broken-headers"),
            commit,
        )

    images = {binding: IMAGE if binding == CURRENT_BINDING else f"{IMAGE}-{binding}" for binding in LAYOUTS}
    for binding in LAYOUTS:
        build_log = work / f"build-{binding}.log"
        with timed(f"podman build Dockerfile.cpu on the {binding} stand-in", timings):
            built = podman_build(contexts[binding], bases[binding], images[binding], build_log)
        if built.returncode != 0:
            tail = build_log.read_text(errors="replace").splitlines()[-40:]
            log(f"error: podman build failed ({built.returncode}); end of {build_log}:\n" + "\n".join(tail))
            return 1

    models = model_dir(work)
    status = 0
    for binding in LAYOUTS:
        container = f"{CONTAINER}-{binding}"
        url = run_container(container, models, {"SEMIF_N_THREADS": "2"}, image=images[binding])
        env = {
            **os.environ,
            "SEMIF_TEST_URL": url,
            "SEMIF_TEST_IMAGE": images[binding],
            "SEMIF_TEST_CONTAINER": container,
            "SEMIF_TEST_MODEL_DIR": str(models),
            "SEMIF_TEST_BINDING": binding,
            "SEMIF_TEST_BASE": bases[binding],
            "SEMIF_TEST_BASE_LIBS": str(libs[binding]),
            "SEMIF_TEST_WORK_DIR": str(work),
        }
        suites = ["tests/contract/test_contract.py", "tests/image"]
        once = (
            "test_a_renamed_engine_field_stops_the_build",
            "test_another_llama_cpp_without_a_record_is_refused_naming_both",
        )
        if binding == CURRENT_BINDING:
            env.update(SEMIF_TEST_BROKEN_CONTEXT=str(broken), SEMIF_TEST_BROKEN_BASE=bases[CURRENT_BINDING],
                       SEMIF_TEST_UNPROVEN_LIBS=str(libs[OLD_BINDING]))  # fmt: skip
        else:
            suites += [f"--deselect=tests/image/test_layout_guard.py::{name}" for name in once]
        try:
            with timed(f"pytest against the container on the {binding} stand-in", timings):
                pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites,
                          *args.pytest_args]  # fmt: skip
                status = max(status, subprocess.run(pytest, cwd=ROOT, env=env, check=False).returncode)
        finally:
            logs = subprocess.run([*PODMAN, "logs", container], capture_output=True, text=True, check=False)
            (work / f"container-{binding}.log").write_text(logs.stdout + logs.stderr)
            if not args.keep:
                subprocess.run(
                    [*PODMAN, "rm", "--force", "--ignore", container], capture_output=True, check=False
                )
    timings["total"] = time.monotonic() - started
    log("timings: " + ", ".join(f"{label} {seconds:.0f} s" for label, seconds in timings.items()))
    return status


def broken_headers(tree: Path, target: Path) -> Path:
    """A copy of a header tree whose llama_context_params.n_ubatch is renamed (the refusal case)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(tree, target)
    llama_h = target / "include" / "llama.h"
    text = llama_h.read_text(encoding="utf-8")
    if BROKEN_FIELD[0] not in text:
        raise SystemExit(f"error: {llama_h} has no '{BROKEN_FIELD[0].strip()}' to rename")
    llama_h.write_text(text.replace(BROKEN_FIELD[0], BROKEN_FIELD[1], 1), encoding="utf-8")
    return target


if __name__ == "__main__":
    raise SystemExit(main())
