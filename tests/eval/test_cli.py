"""benchmark/calibrate command lines end to end against the local stand-in server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from semif_adapter.eval.cli import benchmark_main, calibrate_main
from semif_adapter.eval.results import RunResult
from semif_adapter.model.calibration import Calibration
from tests.helpers.evalserver import DEVSET, LocalServer

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_compare_and_calibrate(
    server: LocalServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    common = [str(DEVSET), "--url", server.url, "--out-dir", str(tmp_path), "--no-progress"]
    assert benchmark_main([*common, "--name", "local semif", "--stem", "semif"]) == 0
    assert benchmark_main([*common, "--protocol", "systemone", "--name", "local s1", "--stem", "s1"]) == 0
    out = capsys.readouterr().out
    assert "| target | correct/total (%) | p50 | p95 |" in out
    semif = RunResult.load(tmp_path / "semif.json")
    assert semif.totals["tasks"] == 60 and semif.config["tasks"] == [str(DEVSET)]
    for suffix in ("md", "json"):
        assert (tmp_path / f"s1.{suffix}").is_file()

    assert (
        benchmark_main(
            ["--compare", str(tmp_path / "semif.json"), str(tmp_path / "s1.json"), "--out-dir", str(tmp_path)]
        )
        == 0
    )
    text = (tmp_path / "compare.md").read_text()
    assert "| local semif |" in text and "| local s1 |" in text
    assert (tmp_path / "compare.png").stat().st_size > 1000

    cal_path = tmp_path / "calibration.json"
    assert (
        calibrate_main(
            [
                "--report",
                str(tmp_path / "semif.json"),
                "--out",
                str(cal_path),
                "--min-fit",
                "5",
                "--min-held-out",
                "3",
            ]
        )
        == 0
    )
    written = json.loads(cal_path.read_text())
    assert set(written["fits"]) == {"choice", "noul", "score"}
    assert written["prompt_version"] == "test-v1"  # agreed by every row of the report
    loaded = Calibration.load(cal_path)
    assert set(loaded.temperatures) <= {"choice", "noul", "score"}
    for key, fit in written["fits"].items():
        assert fit["accepted"] == (key in loaded.temperatures)


def test_calibrate_runs_the_benchmark_first(server: LocalServer, tmp_path: Path) -> None:
    cal_path = tmp_path / "calibration.json"
    code = calibrate_main(
        [
            str(DEVSET),
            "--url",
            server.url,
            "--out",
            str(cal_path),
            "--no-progress",
            "--report-out",
            str(tmp_path / "run.json"),
            "--per-option-count",
        ]
    )
    assert code == 0
    written = json.loads(cal_path.read_text())
    assert written["prompt_version"] == "test-v1" and written["model_sha256"] == "ab" * 32
    assert written["source"]["target"]["protocol"] == "semif"
    assert (tmp_path / "run.json").is_file()
    Calibration.load(cal_path)


def test_calibrate_refuses_generation_runs(server: LocalServer, tmp_path: Path) -> None:
    report = tmp_path / "chat.json"
    server.state.chat_replies = {"c01": "technical"}
    assert (
        benchmark_main(
            [
                str(DEVSET),
                "--chat-url",
                server.url,
                "--limit",
                "1",
                "--out-dir",
                str(tmp_path),
                "--stem",
                "chat",
                "--no-progress",
            ]
        )
        == 0
    )
    assert calibrate_main(["--report", str(report), "--out", str(tmp_path / "c.json")]) == 1
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        [str(DEVSET)],  # no target
        [str(DEVSET), "--url", "http://x", "--chat-url", "http://y"],  # two targets
        ["--compare", "only-one.json"],
        [],
    ],
)
def test_usage_errors_exit_nonzero(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        benchmark_main([*argv, "--out-dir", str(tmp_path)])
    assert info.value.code not in (0, None)


def test_bad_task_file_is_reported_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(SystemExit) as info:
        benchmark_main([str(bad), "--url", "http://127.0.0.1:9"])
    assert "bad.jsonl:1" in str(info.value.code)


def test_the_package_cli_runs_benchmark_as_a_program(server: LocalServer, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "semif_adapter",
            "benchmark",
            str(DEVSET),
            "--url",
            server.url,
            "--limit",
            "5",
            "--out-dir",
            str(tmp_path),
            "--stem",
            "script",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "/5 (" in proc.stdout
    assert RunResult.load(tmp_path / "script.json").totals["tasks"] == 5
