"""Decision by generation against a real OpenAI-compatible server: llama-cpp-python's own server
running the same Qwen GGUF (the stock-DLC comparison path, here without a container), with extra buffer
types off where the CPU's AMX buffer type would crash it (``tests.helpers.chat_server``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semif_adapter.eval.runner import run_benchmark
from semif_adapter.eval.targets import ChatTarget
from semif_adapter.eval.tasks import load_tasks
from tests.helpers.support import REPO_ROOT, free_port

DEVSET = REPO_ROOT / "tests" / "data" / "decision-devset.jsonl"


@pytest.fixture(scope="module")
def chat_url(qwen_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("chat") / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.chat_server",
            "--model",
            str(qwen_gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--chat_format",
            "chatml",
            "--verbose",
            "false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "llama_cpp.server exited"
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "llama_cpp.server did not start"
        time.sleep(0.2)
    yield url
    process.terminate()
    process.wait(30)


def test_generation_answers_are_parsed_into_labels(chat_url: str) -> None:
    tasks = [t for t in load_tasks(DEVSET) if t.id in {"c01", "c02", "n01", "n02", "s01", "s02"}]
    assert len(tasks) == 6
    run = run_benchmark(tasks, ChatTarget(chat_url, name="chat"))
    assert [row.id for row in run.rows] == [t.id for t in tasks]
    valid = [row for row in run.rows if row.valid]
    assert len(valid) >= 4, [(row.id, row.error, row.reply) for row in run.rows]
    for row in valid:
        # a parsed reply is a one-hot answer on exactly one declared label
        assert sorted(row.probabilities) == [0.0] * (len(row.probabilities) - 1) + [1.0]
        assert row.latency_s is not None and row.latency_s > 0
    assert run.totals["valid"] == len(valid)
