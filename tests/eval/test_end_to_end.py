"""The benchmark harness end to end against the project's real server (gemma-270m, live subprocess).

The stand-in of ``tests/helpers/evalserver.py`` proves the arithmetic; this module proves the harness and the
server agree on the wire: all 60 devset tasks go through ``/invocations`` and ``/v1/systemone``, every
one gets a usable answer, the three report files are written and readable, and ``compare`` renders
both runs. Both protocols score the same decision, so their answers must agree task by task.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from semif_adapter.eval.cli import benchmark_main
from semif_adapter.eval.results import RunResult
from semif_adapter.eval.tasks import load_tasks
from tests.helpers.evalserver import DEVSET
from tests.helpers.support import LiveServer

PROTOCOLS = ("semif", "systemone")
N_TASKS = 60
SEED_TABLE_HEADER = "| target | correct/total (%) | p50 | p95 |"


@dataclass
class Runs:
    out_dir: Path
    runs: dict[str, RunResult]
    stdout: dict[str, str]


@pytest.fixture(scope="module")
def runs(live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """One sequential devset run per protocol through the CLI entry point (what operators run)."""
    out_dir = tmp_path_factory.mktemp("e2e-reports")
    results: dict[str, RunResult] = {}
    stdout: dict[str, str] = {}
    for protocol in PROTOCOLS:
        log = out_dir / f"{protocol}.stdout"
        with pytest.MonkeyPatch.context() as mp, log.open("w") as handle:
            mp.setattr("sys.stdout", handle)
            code = benchmark_main(
                [
                    str(DEVSET),
                    "--url",
                    live_server.url,
                    "--protocol",
                    protocol,
                    "--name",
                    f"gemma-270m {protocol}",
                    "--stem",
                    protocol,
                    "--out-dir",
                    str(out_dir),
                    "--no-progress",
                ]
            )
        assert code == 0
        stdout[protocol] = log.read_text()
        results[protocol] = RunResult.load(out_dir / f"{protocol}.json")
    return Runs(out_dir, results, stdout)


def _assert_png(path: Path) -> None:
    image = imread(path)  # decodes the file; raises on anything that is not an image
    assert image.ndim == 3 and image.shape[0] >= 100 and image.shape[1] >= 100
    assert float(np.ptp(image)) > 0  # not a blank canvas


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_task_gets_a_valid_answer(runs: Runs, protocol: str) -> None:
    run = runs.runs[protocol]
    tasks = load_tasks(DEVSET)
    assert [row.id for row in run.rows] == [t.id for t in tasks]
    assert run.target["protocol"] == protocol
    assert run.target["endpoint"].endswith("/invocations" if protocol == "semif" else "/v1/systemone")
    for row, task in zip(run.rows, tasks, strict=True):
        assert row.valid and row.error is None and row.status == 200, (row.id, row.error)
        assert row.attempts == 1 and row.retries_503 == 0
        assert row.probabilities is not None and len(row.probabilities) == len(task.labels)
        assert math.fsum(row.probabilities) == pytest.approx(1.0, abs=1e-6)
        assert row.latency_s is not None and 0 < row.latency_s < 60
        # raw logits come back on both routes (System One as x_option_logits), aligned with the labels
        assert row.option_logits is not None and len(row.option_logits) == len(task.labels)
        assert row.predicted == task.labels[int(np.argmax(row.probabilities))]
        assert row.correct == (row.predicted == task.expected_label)
    if protocol == "semif":
        assert {row.prompt_version for row in run.rows} != {None}
        assert all(row.calibration is None for row in run.rows)  # the test server has no calibration.json


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_report_files(runs: Runs, protocol: str) -> None:
    run = runs.runs[protocol]
    t = run.totals
    assert t["tasks"] == t["valid"] == N_TASKS and t["invalid"] == 0
    assert t["correct"] == sum(row.correct for row in run.rows)
    assert {k: v["total"] for k, v in t["by_type"].items()} == {"choice": 24, "noul": 18, "score": 18}
    for key in ("brier", "ece", "log_loss", "ordinal_mae"):
        assert isinstance(t[key], float) and math.isfinite(t[key]), key
    assert 0 <= t["ece"] <= 1 and 0 <= t["brier"] <= 2
    lat = t["latency_s"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]

    markdown = (runs.out_dir / f"{protocol}.md").read_text()
    row = f"| gemma-270m {protocol} | {t['correct']}/60 ("
    assert SEED_TABLE_HEADER in markdown and row in markdown
    assert row in runs.stdout[protocol] and "valid 60/60" in runs.stdout[protocol]
    for plot in ("reliability", "latency"):
        _assert_png(runs.out_dir / f"{protocol}-{plot}.png")


def test_both_protocols_score_the_same_decision(runs: Runs) -> None:
    """/v1/systemone maps a question to the very decision /invocations scores: same logits, same answers."""
    semif, systemone = runs.runs["semif"].rows, runs.runs["systemone"].rows
    for a, b in zip(semif, systemone, strict=True):
        np.testing.assert_allclose(b.option_logits, a.option_logits, atol=1e-3, err_msg=a.id)
        np.testing.assert_allclose(b.probabilities, a.probabilities, atol=1e-4, err_msg=a.id)
    assert runs.runs["semif"].totals["correct"] == runs.runs["systemone"].totals["correct"]


def test_compare_writes_one_table_and_one_figure(runs: Runs, capsys: pytest.CaptureFixture) -> None:
    out = runs.out_dir / "compare"
    reports = [str(runs.out_dir / f"{p}.json") for p in PROTOCOLS]
    assert benchmark_main(["--compare", *reports, "--out-dir", str(out), "--stem", "both"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["both.md", "both.png"]
    printed = capsys.readouterr().out
    markdown = (out / "both.md").read_text()
    assert markdown.count(SEED_TABLE_HEADER) == 1
    headline = markdown.split(SEED_TABLE_HEADER, 1)[1].split("\n\n", 1)[0]
    for protocol in PROTOCOLS:
        t = runs.runs[protocol].totals
        line = f"| gemma-270m {protocol} | {t['correct']}/60 ("
        assert line in headline and line in printed
    _assert_png(out / "both.png")
    # the report JSONs are untouched by compare and still load
    assert json.loads(Path(reports[0]).read_text())["totals"]["tasks"] == N_TASKS
