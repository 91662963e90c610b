"""The front door of a live server process: slow headers and bodies are cut off, the connection cap answers
503 at once, and SIGTERM ends a request that outlives the grace period with a JSON 503, then exits 0."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import httpx

from semif_adapter.model.demo_models import MODELS
from tests.helpers.support import LiveServer, start_request_in_engine

GEMMA = MODELS["gemma"]


def _model_dir(tmp_path: Path, gemma_gguf: Path) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / GEMMA.filename).symlink_to(gemma_gguf)
    return model_dir


def _connect(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Read until the server closes (True) or ``seconds`` pass (False); returns what was received."""
    received = b""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionError:
            return True, received
        if not data:
            return True, received
        received += data
    return False, received


def test_slow_headers_slow_bodies_and_too_many_connections(
    tmp_path: Path, server_factory, gemma_gguf: Path
) -> None:
    env = {"SEMIF_HEADER_TIMEOUT_S": "1", "SEMIF_BODY_TIMEOUT_S": "1", "SEMIF_MAX_CONNECTIONS": "6"}
    server = server_factory(_model_dir(tmp_path, gemma_gguf), env)

    # The cap: six idle connections are accepted, the seventh is answered at once and closed.
    idle = [_connect(server) for _ in range(6)]
    time.sleep(0.2)
    extra = _connect(server)
    closed, answer = _closed_within(extra, 5)
    assert closed and answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["type"] == "too_many_connections"
    # The idle ones never sent a byte: closed by the header timeout.
    assert all(_closed_within(sock, 5)[0] for sock in idle)

    # Slow headers: one byte a while, never a blank line; closed after the header timeout.
    slow = _connect(server)
    slow.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    started = time.monotonic()
    closed, answer = _closed_within(slow, 5)
    assert closed and answer == b"" and time.monotonic() - started < 5

    # Slow body: a 408, then the connection is closed (the rest is never read as another request).
    trickle = _connect(server)
    trickle.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{")  # fmt: skip
    closed, answer = _closed_within(trickle, 10)
    assert closed and answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in answer.lower()

    # The server is healthy throughout, and a normal request still works.
    assert httpx.get(server.url + "/ping", timeout=5).status_code == 200
    decision = {"id": "d", "state": "s", "question": "q?", "options": [{"id": "a"}, {"id": "b"}]}
    assert httpx.post(server.url + "/invocations", json={"decision": decision}, timeout=60).status_code == 200


def test_sigterm_answers_a_request_that_outlives_the_grace_period(
    tmp_path: Path, server_factory, gemma_gguf: Path
) -> None:
    """No deadline (asynchronous inference), a one-second grace: the caller gets a retryable JSON 503."""
    env = {"SEMIF_REQUEST_TIMEOUT_S": "0", "SEMIF_SHUTDOWN_GRACE_S": "1", "SEMIF_N_CTX": "16384"}
    server = server_factory(_model_dir(tmp_path, gemma_gguf), env)
    in_flight = start_request_in_engine(server, events=1200)
    assert server.process is not None
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    in_flight.thread.join(60)
    assert in_flight.status == 503
    assert in_flight.body["type"] == "shutting_down" and in_flight.body["retryable"] is True
    assert server.process.wait(60) == 0
    assert time.monotonic() - started < 1 + 5  # the grace, then the abort within one decode call
    log = server.log_text()
    assert "grace period over: aborting 1 request(s)" in log
    assert "Cancel" not in log  # uvicorn never had to cancel the task (that would be a plain-text 500)
