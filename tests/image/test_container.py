"""The image as it runs: what only a container shows. The HTTP contract itself (ping, decisions, shared
requests, JSON Lines, errors, 503s under a burst) is tests/contract/test_contract.py, run against the same
container through SEMIF_TEST_URL."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.helpers.image import ImageUnderTest, exec_in, podman
from tests.helpers.support import LiveServer, start_request_in_engine, thread_nice, wait_for_ping
from tests.image.harness import run_container

BASE_LIB_DIR = "/opt/llama.cpp/bin"  # where the DLC (and the stand-in) keep libllama, libggml and the plugins
TOOLCHAIN = ("gcc", "cc", "g++", "c++", "clang", "cpp", "ld", "as", "make", "cmake", "ninja", "zig", "nvcc")
# Grace between SIGTERM and SIGKILL given to `podman stop` here. The request in flight is kept short (~250
# tokens): on this shared 2-core machine a 3,000-token one alone takes over a minute.
GRACE_S = 30


def test_the_server_runs_as_the_unprivileged_user(under_test: ImageUnderTest) -> None:
    config_user = podman("image", "inspect", "--format", "{{.Config.User}}", under_test.image).stdout.strip()
    assert config_user == "10001:10001"
    status = exec_in(under_test.container, "cat /proc/1/status")
    ids = {
        line.split(":")[0]: line.split()[1:]
        for line in status.splitlines()
        if line.startswith(("Uid", "Gid"))
    }
    assert ids["Uid"] == ["10001"] * 4 and ids["Gid"] == ["10001"] * 4
    cmdline = exec_in(under_test.container, "tr '\\0' ' ' < /proc/1/cmdline")
    assert "semif_adapter" in cmdline and "serve" in cmdline


def test_no_compiler_or_build_tool_on_path(under_test: ImageUnderTest) -> None:
    found = exec_in(under_test.container, f"for t in {' '.join(TOOLCHAIN)}; do command -v $t; done; true")
    assert found.strip() == ""
    probe = "import importlib.util as u; print([m for m in ('ziglang', 'cmake', 'ninja') if u.find_spec(m)])"
    assert exec_in(under_test.container, f'python -c "{probe}"').strip() == "[]"


def test_every_semif_command_in_the_image_starts(under_test: ImageUnderTest) -> None:
    """The image installs the server's command only; the operator CLI needs a checkout of the repository."""
    commands = exec_in(under_test.container, "ls /opt/semif/venv/bin").split()
    assert [c for c in commands if c.startswith("semif")] == ["semif-adapter"]
    assert "usage: semif-adapter" in exec_in(under_test.container, "/opt/semif/venv/bin/semif-adapter --help")


def test_the_engine_runs_on_the_base_images_llama_cpp(under_test: ImageUnderTest) -> None:
    """libllama, libggml and a CPU plugin are mapped from the base's directory; none comes from the venv."""
    maps = exec_in(under_test.container, "cat /proc/1/maps")
    paths = {line.split()[-1] for line in maps.splitlines() if ".so" in line.split()[-1]}
    llama = {p for p in paths if Path(p).name.startswith(("libllama", "libggml"))}
    assert llama, "no llama.cpp library mapped"
    assert all(p.startswith(BASE_LIB_DIR + "/") for p in llama), sorted(llama)
    plugins = {Path(p).name for p in llama if Path(p).name.startswith("libggml-cpu-")}
    assert len(plugins) == 1, f"expected exactly one CPU plugin loaded, got {plugins}"
    flags = set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split())
    expected = "haswell" if {"avx2", "fma", "f16c", "bmi2"} <= flags else "x64"
    assert plugins == {f"libggml-cpu-{expected}.so"}, "the best plugin the base ships should be selected"


def _nice_by_thread(container: str) -> dict[int, int]:
    """Thread id -> nice for the server (pid 1 in the container)."""
    stats = exec_in(container, "for f in /proc/1/task/*/stat; do cat $f; echo; done")
    return dict(thread_nice(line) for line in stats.splitlines() if line.strip())


def test_decoding_threads_run_below_the_http_layer(under_test: ImageUnderTest) -> None:
    """SEMIF_ENGINE_NICE (default 10) on the base's libllama: while a request decodes, the engine thread
    and the compute threads it started are niced; the event loop (the main thread) is not."""
    cores = int(exec_in(under_test.container, "nproc").strip())
    server = LiveServer(under_test.url)
    wait_for_ping(server, timeout=300)  # this test may run first, while the model still loads
    in_flight = start_request_in_engine(server, events=150)
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 20
    while in_flight.thread.is_alive() and time.monotonic() < deadline:
        seen.update(_nice_by_thread(under_test.container))
        if len([v for v in seen.values() if v == min(19, seen[1] + 10)]) >= min(2, cores):
            break
    in_flight.thread.join(120)
    assert in_flight.status == 200
    assert seen[1] < 19
    lowered = [tid for tid, value in seen.items() if value == min(19, seen[1] + 10)]
    assert len(lowered) >= min(2, cores), seen  # the engine thread plus at least one compute thread
    logs = podman("logs", under_test.container)
    assert "could not lower" not in logs.stdout + logs.stderr


def test_stdout_is_one_json_object_per_line(under_test: ImageUnderTest) -> None:
    """CloudWatch gets what the container prints: every stdout line parses, requests are logged."""
    logs = podman("logs", under_test.container)
    lines = [line for line in logs.stdout.splitlines() if line.strip()]
    assert lines, "the container printed nothing on stdout"
    records = [json.loads(line) for line in lines]
    assert all(isinstance(record, dict) for record in records)
    assert any(record.get("route") == "/invocations" for record in records)


def test_sigterm_finishes_the_request_in_flight_and_exits_zero(under_test: ImageUnderTest) -> None:
    name = under_test.container + "-sigterm"
    url = run_container(name, under_test.model_dir, {"SEMIF_N_THREADS": "2"}, image=under_test.image)
    try:
        server = LiveServer(url)
        wait_for_ping(server, timeout=300)
        in_flight = start_request_in_engine(server, events=20)
        started = time.monotonic()
        podman("stop", "--time", str(GRACE_S), name)
        stopped_after = time.monotonic() - started
        in_flight.thread.join(120)
        state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
        assert in_flight.status == 200
        assert state["ExitCode"] == 0, podman("logs", name).stderr[-2000:]
        assert stopped_after < GRACE_S, f"took {stopped_after:.1f} s: the runtime had to SIGKILL it"
    finally:
        podman("rm", "--force", "--ignore", name, check=False)
