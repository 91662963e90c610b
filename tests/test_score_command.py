"""The one-shot ``score`` command and the package CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REQUEST = {
    "decisions": [
        {
            "id": "a",
            "state": "Disk is 99% full on db-1.",
            "question": "Page someone now?",
            "options": [{"id": "yes"}, {"id": "no"}],
        },
        {
            "id": "b",
            "state": "Disk is 99% full on db-1.",
            "question": "Which team?",
            "options": [{"id": "storage"}, {"id": "network"}, {"id": "billing"}],
        },
    ]
}


def _run(args: list[str], gguf: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMIF_")}
    env.update({"SEMIF_GGUF_PATH": str(gguf), "SEMIF_N_CTX": "1024"})
    return subprocess.run(
        [sys.executable, "-m", "semif_adapter", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_score_prints_the_shared_response(tmp_path: Path, gemma_gguf: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(REQUEST))
    done = _run(["score", str(request)], gemma_gguf)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert [r["id"] for r in body["results"]] == ["a", "b"]
    assert all(abs(sum(r["probabilities"]) - 1) < 1e-9 for r in body["results"])


def test_score_refuses_a_bad_request_with_one_message(gemma_gguf: Path) -> None:
    done = _run(["score", "-"], gemma_gguf, stdin=json.dumps({"decision": {"id": "x"}}))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == ["semif-adapter: decision.state: Field required"]
