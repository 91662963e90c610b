"""The image on each DLC layout: a base as bare as Amazon Linux 2023, struct layouts probed from the base's
own llama.h, answers equal to those of the binding written for that llama.cpp, and the one refusal left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from semif_ops.image import dlc_base as _dlc_base
from tests.helpers.image import ImageUnderTest, podman
from tests.helpers.sdists import sdist
from tests.helpers.support import LiveServer, wait_for_ping
from tests.image.harness import BROKEN_FIELD, CURRENT_BINDING, podman_build

ROOT = Path(__file__).resolve().parents[2]
# Fixed decisions, scored in the container and on the host; the options cover 2, 3 and 5 labels.
DECISIONS = [
    {"id": "queue", "state": "Charged twice for one seat this month; both charges settled.",
     "question": "Which queue should own this ticket?",
     "options": [{"id": "billing"}, {"id": "technical"}, {"id": "account"}]},
    {"id": "refund", "state": "Charged twice for one seat this month; both charges settled.",
     "question": "Is a refund due?", "options": [{"id": "yes"}, {"id": "no"}]},
    {"id": "vpn", "state": {"events": ["vpn dropped", "reconnected", "vpn dropped again"], "plan": "pro"},
     "question": "What should the agent do next?",
     "options": [{"id": "a", "description": "restart the client"}, {"id": "b", "description": "escalate"},
                 {"id": "c", "description": "ask for logs"}, {"id": "d", "description": "close"},
                 {"id": "e", "description": "wait"}]},
]  # fmt: skip


def run_in_base(base: str, script: str) -> subprocess.CompletedProcess[str]:
    return podman(
        "run", "--rm", "--network", "none", "--entrypoint", "/bin/bash", base, "-c", script, check=False
    )


def test_the_base_is_as_bare_as_amazon_linux_2023(under_test: ImageUnderTest) -> None:
    for tool in ("find", "xargs", "which", "tar", "gzip", "ps", "perl"):
        done = run_in_base(under_test.base, f"{tool} --version")
        assert done.returncode == 127, f"{tool} ran in the stand-in: {done.stdout[:200]}"
    have = run_in_base(under_test.base, "ls /usr/bin /usr/sbin").stdout.split()
    extra = sorted({n for n in have if not n.endswith(":") and n and not _dlc_base.allowed(n)} - {"serve"})
    assert extra == [], f"the stand-in has commands the DLC's base lacks: {extra}"
    script = (
        "bash --version >/dev/null && grep --version >/dev/null && sed --version >/dev/null && "
        "awk --version >/dev/null && python --version && python3 --version && readlink -f /bin/sh"
    )
    done = run_in_base(under_test.base, script)
    assert done.returncode == 0, done.stderr
    versions = done.stdout.split()
    assert versions[1] == versions[3], "python and python3 must be the one Python"
    assert versions[-1].endswith("/bash")


def test_the_base_runs_the_dlc_way(under_test: ImageUnderTest) -> None:
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", under_test.base).stdout)
    assert config["Entrypoint"] == [_dlc_base.ENTRYPOINT]
    assert config.get("User", "") in {"", "root", "0"}
    env = dict(item.split("=", 1) for item in config["Env"])
    assert {k: env.get(k) for k in _dlc_base.ENV} == _dlc_base.ENV


def _container_answers(url: str) -> dict[str, list[float]]:
    server = LiveServer(url)
    wait_for_ping(server, timeout=300)
    response = httpx.post(
        f"{url}/invocations", content="\n".join(json.dumps(d) for d in DECISIONS),
        headers={"Content-Type": "application/jsonlines"}, timeout=300,
    )  # fmt: skip
    response.raise_for_status()
    results = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    return {r["id"]: r["probabilities"] for r in results}


def _host_answers(under_test: ImageUnderTest, tmp_path: Path) -> dict[str, list[float]]:
    """The same decisions on this host, on the stand-in's own libraries, through the binding written for
    that llama.cpp (0.3.35's binding for the 0.3.35 base, proven by hand the way docs/deployment.md says)."""
    libs = str(under_test.base_libs)
    env = {**os.environ, "LD_LIBRARY_PATH": libs, "LLAMA_CPP_LIB_PATH": libs, "GGML_BACKEND_DIR": libs,
           "SEMIF_MODEL_DIR": str(under_test.model_dir), "SEMIF_N_THREADS": "2"}  # fmt: skip
    env.pop("SEMIF_LLAMA_ABI_RECORD", None)
    if under_test.binding != CURRENT_BINDING:
        env["PYTHONPATH"] = str(sdist(under_test.binding))  # its llama_cpp package, pure Python
        record = tmp_path / "llama-abi.json"
        headers = sdist(under_test.binding) / "vendor" / "llama.cpp"
        verify = [
            sys.executable,
            str(ROOT / "semif_ops" / "image" / "abi.py"),
            "verify",
            "--lib-dir",
            libs,
            "--headers",
            str(headers),
            "--record",
            str(record),
        ]
        subprocess.run(verify, env=env, check=True, capture_output=True, text=True)  # fmt: skip
        env["SEMIF_LLAMA_ABI_RECORD"] = str(record)
    answers = {}
    for decision in DECISIONS:
        request = tmp_path / f"{decision['id']}.json"
        request.write_text(json.dumps({"decision": decision}))
        done = subprocess.run([sys.executable, "-m", "semif_adapter", "score", str(request)], env=env,
                              capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        answers[decision["id"]] = json.loads(done.stdout)["result"]["probabilities"]
    return answers


def test_answers_equal_those_of_the_binding_written_for_the_bases_llama_cpp(
    under_test: ImageUnderTest, tmp_path: Path
) -> None:
    """Bit-identical: the probed layout drives the base's libllama exactly as its own binding would."""
    container = _container_answers(under_test.url)
    host = _host_answers(under_test, tmp_path)
    assert container == host
    (under_test.work_dir / f"answers-{under_test.binding}.json").write_text(json.dumps(container, indent=1))


def test_another_llama_cpp_without_a_record_is_refused_naming_both(tmp_path: Path) -> None:
    """Outside an image: the installed binding (0.3.36) pointed at 0.3.35's libllama, no proven record."""
    libs = os.environ.get("SEMIF_TEST_UNPROVEN_LIBS", "")
    if not Path(libs).is_dir():
        pytest.fail("SEMIF_TEST_UNPROVEN_LIBS not set: run through tests/image/harness.py")
    request = tmp_path / "one.json"
    request.write_text(json.dumps({"decision": DECISIONS[1]}))
    env = {**os.environ, "LD_LIBRARY_PATH": libs, "LLAMA_CPP_LIB_PATH": libs, "GGML_BACKEND_DIR": libs,
           "SEMIF_MODEL_DIR": os.environ["SEMIF_TEST_MODEL_DIR"]}  # fmt: skip
    env.pop("SEMIF_LLAMA_ABI_RECORD", None)
    done = subprocess.run([sys.executable, "-m", "semif_adapter", "score", str(request)], env=env,
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert "reports llama.cpp" in message and "commit 4df29be4f" in message
    assert "llama-cpp-python 0.3.36 was written for llama.cpp commit 0c1e57098" in message
    assert "semif-ops image abi verify" in message and "SEMIF_LLAMA_ABI_RECORD" in message


def test_a_renamed_engine_field_stops_the_build(under_test: ImageUnderTest) -> None:
    """llama.h with llama_context_params.n_ubatch renamed: the build stops at the probe, naming the field."""
    context = Path(os.environ.get("SEMIF_TEST_BROKEN_CONTEXT", ""))
    base = os.environ.get("SEMIF_TEST_BROKEN_BASE", "")
    if not context.is_dir() or not base:
        pytest.fail("SEMIF_TEST_BROKEN_CONTEXT or _BASE not set: run through tests/image/harness.py")
    headers = list((context / "docker" / "llama-headers").rglob("llama.h"))
    assert len(headers) == 1 and BROKEN_FIELD[1] in headers[0].read_text()
    log_path = under_test.work_dir / "build-broken-header.log"
    tag = "localhost/semif-adapter:image-test-broken-header"
    podman("rmi", "--force", "--ignore", tag)
    build = podman_build(context, base, tag, log_path)
    text = log_path.read_text(errors="replace")
    assert build.returncode != 0, f"the build with a renamed n_ubatch succeeded; log: {log_path}"
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert errors, f"the build failed without a one-line error; log: {log_path}"
    assert "llama_context_params.n_ubatch: the engine sets this field; this llama.h lacks it" in errors[-1]
    assert podman("image", "exists", tag, check=False).returncode != 0, "a refused build left an image"
