"""Test helpers shared across suites: engine settings and live servers in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from semif_adapter.protocol import (
    BatchResult,
    BatchTiming,
    Decision,
    DecisionResult,
    DecisionTiming,
    ModelInfo,
)
from semif_adapter.settings import Settings

if TYPE_CHECKING:
    from semif_adapter.engine import DecisionEngine

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_N_CTX = 4096
ENGINES = ("gemma", "qwen", "hybrid", "mamba")
#: The real models with flash attention on (invariant numerics with pieces padded to its tiled rows):
#: the numerics tests run on these too.
FLASH_ENGINES = ("gemma_flash", "qwen_flash")
#: The real models in the tiled layout (one unified KV stream with flash attention, decisions from tile
#: lines): the numerics tests run on Qwen's (gemma's is proven by tests/engine/test_tile_layout.py and its
#: golden answers; both would add ~10 minutes to the suite); ``SEMIF_TEST_ENGINES=gemma_tiled`` runs it.
TILED_ENGINES = ("qwen_tiled",)


def engines_under_test(default: Sequence[str] = ENGINES) -> list[str]:
    """The models the model-parametrised engine tests run on: ``default``, or the comma-separated
    ``SEMIF_TEST_ENGINES`` (the GPU check runs them on the random ones: hybrid, mamba, dense)."""
    chosen = os.environ.get("SEMIF_TEST_ENGINES", "").strip()
    return [name.strip() for name in chosen.split(",") if name.strip()] if chosen else list(default)


def numerics_engines() -> list[str]:
    """The engines the bit-identity tests run on: :func:`engines_under_test` and, by default, the real
    models with flash attention on, padded and tiled."""
    return engines_under_test((*ENGINES, *FLASH_ENGINES, *TILED_ENGINES))


#: An agent loop's answers: (agent, turn, decision id) -> (probabilities, option logits).
Answers = dict[tuple[str, int, str], tuple[list[float], list[float]]]


def play_turns(
    engine: DecisionEngine,
    schedule: Sequence[tuple[str, int]],
    decisions_for: Callable[[str, int], list[dict]],
    *,
    cold: bool,
) -> tuple[Answers, list[BatchTiming]]:
    """Score each (agent, turn) of ``schedule`` (``cold``: the cache emptied before each); the answers
    and each request's timing."""
    answers: Answers = {}
    timings: list[BatchTiming] = []
    for agent, turn in schedule:
        if cold:
            engine.reset_prefix_cache()
        batch = engine.score(decisions_for(agent, turn))
        timings.append(batch.timing)
        for r in batch.results:
            answers[(agent, turn, r.id)] = (r.probabilities, r.option_logits)
    return answers, timings


def fake_model_info(**overrides: object) -> ModelInfo:
    """Model metadata for stand-in engines (used only where a state cannot be caused for real)."""
    values: dict[str, object] = {
        "name": "fake",
        "file": "fake.gguf",
        "sha256": "0" * 64,
        "architecture": "fake",
        "n_ctx": 512,
        "n_threads": 1,
        "n_batch": 32,
        "n_gpu_layers": 0,
        "gpu_offload": False,
        "chat_template": False,
        "llama_cpp_python_version": "0",
        "fork_mode": "copy",
        "scoring": {
            "version": "sv1-000000000000",
            "prompt": "test",
            "split": "test",
            "numerics": "test",
            "llama_cpp": "test",
            "model": "0" * 16,
        },
        "kernels": {
            "variant": "generic",
            "features": [],
            "library": None,
            "extra_buffers": False,
            "extra_buffers_reason": "test",
            "weight_buffers": ["CPU"],
        },
    }
    values.update(overrides)
    return ModelInfo.model_validate(values)


def stand_in_result(
    option_ids: Sequence[str],
    probabilities: Sequence[float],
    logits: Sequence[float] | None = None,
    mass: float = 0.9,
    decision_id: str = "q0",
) -> DecisionResult:
    """An engine result as the engine shapes it (only the numbers matter here)."""
    n = len(option_ids)
    return DecisionResult(
        id=decision_id,
        option_ids=list(option_ids),
        probabilities=list(probabilities),
        option_logits=list(logits) if logits is not None else [0.0] * n,
        input_tokens=10,
        allowed_token_mass=mass,
        argmax_token="A",
        argmax_is_option=True,
        labels=[chr(65 + i % 26) for i in range(n)],
        prompt_sha256="0" * 64,
        prompt_version="test",
        scoring_version="sv1-000000000000",
        timing=DecisionTiming(
            total_seconds=0.0,
            prefill_seconds=0.0,
            suffix_forward_seconds=0.0,
            readout_seconds=0.0,
            prefix_tokens=5,
            suffix_tokens=5,
            prefix_reused=False,
        ),
        model=fake_model_info(name="m", file="m.gguf", architecture="gemma3"),
    )


def stand_in_batch(decisions: Sequence[Decision]) -> BatchResult:
    """What a stand-in engine returns: every option equally likely."""
    results = [
        stand_in_result([o.id for o in d.options], [1 / len(d.options)] * len(d.options), decision_id=d.id)
        for d in decisions
    ]
    timing = BatchTiming(
        total_seconds=0.0,
        prefill_seconds=0.0,
        suffix_forward_seconds=0.0,
        prefix_tokens=1,
        prefix_reused=False,
        decisions=len(decisions),
        input_tokens=len(decisions) + 1,
    )
    return BatchResult(results=results, timing=timing)


def engine_settings(**overrides: object) -> Settings:
    values: dict[str, object] = {"n_ctx": ENGINE_N_CTX, "n_batch": 512, "verify_manifest": False}
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


# --- live servers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    ping_history: list[int] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, timeout: float = 30) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def make_model_dir(root: Path, gguf: Path, extra_files: dict[str, bytes] | None = None) -> Path:
    """Lay out /opt/ml/model the way SageMaker does: extract a model.tar.gz holding the GGUF."""
    staging = root / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    archive = root / "model.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(gguf, arcname=gguf.name)
        for name, data in (extra_files or {}).items():
            path = staging / name
            path.write_bytes(data)
            tar.add(path, arcname=name)
    model_dir = root / "opt-ml-model"
    model_dir.mkdir()
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(model_dir, filter="data")
    archive.unlink()
    shutil.rmtree(staging)
    return model_dir


def start_server(
    model_dir: Path | None,
    log_dir: Path,
    env: dict[str, str] | None = None,
    *,
    wait_ready: bool = True,
    timeout: float = 180,
) -> LiveServer:
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SEMIF_")}
    full_env.update(
        {
            "SEMIF_PORT": str(port),
            "SEMIF_HOST": "127.0.0.1",
            "SEMIF_N_CTX": str(ENGINE_N_CTX),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if model_dir is not None:
        full_env["SEMIF_MODEL_DIR"] = str(model_dir)
    full_env.update(env or {})
    log_path = log_dir / f"server-{port}.log"
    handle = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "semif_adapter", "serve"],
        cwd=REPO_ROOT,
        env=full_env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", process, log_path)
    if wait_ready:
        wait_for_ping(server, timeout)
    return server


def wait_for_ping(server: LiveServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if server.process is not None and server.process.poll() is not None:
                raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_text()}")
            try:
                status = client.get(server.url + "/ping").status_code
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            server.ping_history.append(status)
            if status == 200:
                return
            time.sleep(0.02)
    raise RuntimeError(f"server not ready within {timeout} s:\n{server.log_text()}")


@dataclass
class RequestInFlight:
    """One decision request running on a thread; ``status`` is set when its answer arrives."""

    thread: threading.Thread
    outcome: dict[str, Any]

    @property
    def status(self) -> int | None:
        return self.outcome.get("status")

    @property
    def body(self) -> Any:
        return json.loads(self.outcome["text"])


def start_request_in_engine(server: LiveServer, events: int, timeout: float = 30) -> RequestInFlight:
    """Send a decision over a state of ``events`` lines and return once the engine is working on it.

    For shutdown tests: the request is known to be admitted (``semif_engine_admitted`` is 1) before the
    caller signals the server.
    """
    decision = {
        "id": "long",
        "state": " ".join(f"Event {i}: the queue depth grew again." for i in range(events)),
        "question": "Is it growing?",
        "options": [{"id": "y"}, {"id": "n"}],
    }
    outcome: dict[str, Any] = {}

    def call() -> None:
        with httpx.Client(timeout=120) as client:
            response = client.post(server.url + "/invocations", json={"decision": decision})
            outcome["status"] = response.status_code
            outcome["text"] = response.text

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + timeout
    while "semif_engine_admitted 1.0" not in httpx.get(server.url + "/metrics").text:
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.01)
    return RequestInFlight(thread, outcome)


def thread_nice(stat_line: str) -> tuple[int, int]:
    """(thread id, nice) from one ``/proc/<pid>/task/<tid>/stat`` line (nice is field 19; the command
    name in field 2 may hold spaces, so fields are counted after its closing parenthesis)."""
    return int(stat_line.split()[0]), int(stat_line.rsplit(")", 1)[1].split()[16])
