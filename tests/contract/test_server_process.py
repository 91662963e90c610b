"""The server as a process: start-up failures exit non-zero with one clear line; SIGTERM is graceful."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from semif_adapter.model.demo_models import MODELS
from semif_adapter.settings import available_cores
from tests.helpers.support import LiveServer, make_model_dir, start_request_in_engine, thread_nice

GEMMA = MODELS["gemma"]


def _exit_code(server: LiveServer, timeout: float = 120) -> int:
    assert server.process is not None
    try:
        return server.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise AssertionError(f"server did not exit:\n{server.log_text()}") from None


def _error_lines(server: LiveServer) -> list[dict]:
    lines = []
    for line in server.log_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("level") == "error":
            lines.append(entry)
    return lines


def _manifest(**overrides: object) -> bytes:
    manifest = {
        "schema_version": 1,
        "name": "gemma-test",
        "source_repo": "example/gemma-3-270m",
        "revision": "0" * 40,
        "file": GEMMA.filename,
        "bytes": GEMMA.size,
        "sha256": GEMMA.sha256,
        "license": "gemma",
        "prompt_version": "semif-decision-v1",
    }
    manifest.update(overrides)
    return json.dumps(manifest).encode()


def test_empty_model_dir_stops_start_up(tmp_path: Path, server_factory) -> None:
    (tmp_path / "model").mkdir()
    server = server_factory(tmp_path / "model", wait_ready=False)
    assert _exit_code(server) != 0
    errors = _error_lines(server)
    assert len(errors) == 1 and "no *.gguf file under" in errors[0]["msg"]


def test_several_ggufs_are_named(tmp_path: Path, server_factory, gemma_gguf: Path) -> None:
    model_dir = tmp_path / "model"
    (model_dir / "sub").mkdir(parents=True)
    (model_dir / "a.gguf").symlink_to(gemma_gguf)
    (model_dir / "sub" / "b.gguf").symlink_to(gemma_gguf)
    server = server_factory(model_dir, wait_ready=False)
    assert _exit_code(server) != 0
    (error,) = _error_lines(server)
    assert "found 2 GGUF files" in error["msg"] and "a.gguf" in error["msg"] and "sub/b.gguf" in error["msg"]


def test_invalid_setting_stops_start_up_naming_the_variable(tmp_path: Path, server_factory) -> None:
    server = server_factory(tmp_path, {"SEMIF_N_CTX": "lots"}, wait_ready=False)
    assert _exit_code(server) == 2
    assert "SEMIF_N_CTX" in server.log_text()


@pytest.mark.parametrize(
    ("job", "needle"),
    [
        ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "20", "SEMIF_MAX_BODY_BYTES": "6291456"}, "BYTES=6291456"),
        ({"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4", "SEMIF_MAX_QUEUE": "0"}, "SEMIF_MAX_QUEUE=0"),
    ],
)
def test_a_transform_job_the_settings_cannot_serve_stops_start_up(
    tmp_path: Path, server_factory, job: dict, needle: str
) -> None:
    server = server_factory(tmp_path, {"SAGEMAKER_BATCH": "true", **job}, wait_ready=False)
    assert _exit_code(server) == 2
    (line,) = server.log_text().strip().splitlines()  # one line, naming both sides of the mismatch
    assert line.startswith("semif-adapter: batch transform: SAGEMAKER_") and needle in line


def test_a_transform_job_with_larger_payloads_raises_the_body_limit(
    tmp_path: Path, server_factory, gemma_gguf: Path
) -> None:
    job = {"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "8", "SEMIF_GGUF_PATH": str(gemma_gguf)}
    server = server_factory(None, job)
    body = b'{"decision": ' + b" " * (7 * 1024 * 1024) + b"}"  # above the default 6 MiB, within 8 MiB
    response = httpx.post(server.url + "/invocations", content=body, timeout=60)
    assert response.status_code == 400 and response.json()["type"] == "invalid_request"  # read, not 413
    assert "SEMIF_MAX_BODY_BYTES raised to 8388608" in server.log_text()


def test_gpu_offload_on_a_cpu_build_is_refused(tmp_path: Path, server_factory, gemma_gguf: Path) -> None:
    server = server_factory(
        None, {"SEMIF_GGUF_PATH": str(gemma_gguf), "SEMIF_N_GPU_LAYERS": "-1"}, wait_ready=False
    )
    assert _exit_code(server) != 0
    (error,) = _error_lines(server)
    assert "GPU offload requested" in error["msg"]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [({"sha256": "f" * 64}, "sha256"), ({"bytes": GEMMA.size + 1}, "bytes")],
    ids=["sha-mismatch", "size-mismatch"],
)
def test_manifest_mismatch_refuses_to_start(
    tmp_path: Path, server_factory, gemma_gguf: Path, overrides: dict, needle: str
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / GEMMA.filename).symlink_to(gemma_gguf)
    (model_dir / "model-manifest.json").write_bytes(_manifest(**overrides))
    server = server_factory(model_dir, wait_ready=False)
    assert _exit_code(server) != 0
    (error,) = _error_lines(server)
    assert needle in error["msg"] and "model load failed" in error["msg"]


def test_matching_manifest_is_verified_and_reported(tmp_path: Path, server_factory, gemma_gguf: Path) -> None:
    model_dir = make_model_dir(tmp_path, gemma_gguf, {"model-manifest.json": _manifest()})
    server = server_factory(model_dir)
    decision = {
        "id": "d",
        "state": "s",
        "question": "q?",
        "options": [{"id": "a"}, {"id": "b"}],
    }
    body = httpx.post(server.url + "/invocations", json={"decision": decision}, timeout=60).json()
    assert body["result"]["model"]["sha256"] == GEMMA.sha256
    assert body["result"]["model"]["name"] == "gemma-test"
    server.stop()


def test_sigterm_finishes_the_running_request_then_exits_cleanly(
    tmp_path: Path, server_factory, gemma_gguf: Path
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / GEMMA.filename).symlink_to(gemma_gguf)
    # No deadline, and a grace longer than the join below: on a loaded machine this request may outlast the
    # default 55 s deadline or 20 s grace, and the test is about finishing it (test_front_door_live covers
    # the grace running out).
    server = server_factory(model_dir, {"SEMIF_REQUEST_TIMEOUT_S": "0", "SEMIF_SHUTDOWN_GRACE_S": "110"})
    in_flight = start_request_in_engine(server, events=100)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    in_flight.thread.join(120)
    assert in_flight.status == 200
    assert server.process.wait(60) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/ping", timeout=2)


def _nice_by_thread(pid: int) -> dict[int, int]:
    return dict(thread_nice((task / "stat").read_text()) for task in Path(f"/proc/{pid}/task").iterdir())


def test_decoding_threads_run_below_the_http_layer(live_server) -> None:
    """SEMIF_ENGINE_NICE (default 10): the engine thread and the llama.cpp threads it starts."""
    assert live_server.process is not None
    decision = {"id": "d", "state": "s", "question": "q?", "options": [{"id": "a"}, {"id": "b"}]}
    response = httpx.post(live_server.url + "/invocations", json={"decision": decision}, timeout=60)
    assert response.status_code == 200
    pid = live_server.process.pid
    nice = _nice_by_thread(pid)
    base = nice[pid]  # the main thread runs the event loop
    lowered = [tid for tid, value in nice.items() if value == min(19, base + 10)]
    assert base == os.getpriority(os.PRIO_PROCESS, 0) and base < 19
    assert len(lowered) >= min(2, available_cores())  # the engine thread plus a compute thread
