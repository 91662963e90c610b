"""The soak script's 60-second version: 8 clients over capacity against a real server (gemma).

Asserts the properties that must hold however loaded the machine is — every status as expected for its
request kind, the same probabilities after the soak, no fd or thread growth, a clean exit — and prints
the latency and memory figures, which are the script's to judge on a quiet machine (10-minute run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.support import REPO_ROOT


def test_soak_60_seconds(tmp_path: Path, gemma_gguf: Path) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "soak.py"),
        "--duration", "60",
        "--clients", "8",
        "--gguf", str(gemma_gguf),
        "--enforce", "hard",
        "--server-log", str(tmp_path / "server.log"),
        "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    print(run.stdout)
    assert out.exists(), run.stdout + run.stderr + (tmp_path / "server.log").read_text(errors="replace")
    figures = json.loads(out.read_text())
    goals = figures["goals"]
    assert figures["unexpected_count"] == 0, figures["unexpected"]
    assert goals["statuses"] and goals["identical_probabilities"], figures
    assert goals["no_fd_growth"] and goals["no_thread_growth"], (figures["start"], figures["end"])
    assert goals["clean_exit"], figures["server_exit_code"]
    # every path answered correctly when tried alone, and under load some real work got through
    assert figures["priming_status"] == {
        "single": 200,
        "shared": 200,
        "jsonlines": 200,
        "systemone": 200,
        "malformed": 400,
        "over_deadline": 504,
    }
    assert int(figures["status_counts"].get("200", 0)) > 0
    counts = figures["status_by_kind"]
    assert counts["malformed"].get("400", 0) > 0 and counts["over_deadline"].get("504", 0) > 0
    assert run.returncode == 0, run.stdout + run.stderr
