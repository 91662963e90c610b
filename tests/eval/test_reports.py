"""Report files (JSON, Markdown, PNG) and `compare`, from run results built by hand."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest

from semif_adapter.eval.mapping import Prediction
from semif_adapter.eval.reports import seed_table, write_comparison, write_run_report
from semif_adapter.eval.results import RunResult, make_row
from semif_adapter.eval.tasks import Task

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _task(task_id: str, qtype: str, expected: str | int) -> Task:
    if qtype == "score":
        question = {"type": "score", "instructions": "how bad?", "criteria": ["low", "mid", "high"]}
        labels = ["0", "1", "2"]
    else:
        question = {"type": "noul", "instructions": "page?"}
        labels = ["no", "yes"]
    return Task.model_validate(
        {"id": task_id, "state": "s", "question": question, "labels": labels, "expected": expected}
    )


def _run(name: str, latencies: list[float], noul_p_yes: float) -> RunResult:
    rows = [
        make_row(
            _task("n1", "noul", "yes"), Prediction([1 - noul_p_yes, noul_p_yes]), latency_s=latencies[0]
        ),
        make_row(_task("s1", "score", 2), Prediction([0.1, 0.6, 0.3]), latency_s=latencies[1]),
        make_row(_task("s2", "score", 0), Prediction([0.7, 0.2, 0.1]), latency_s=latencies[2]),
        make_row(_task("n2", "noul", "no"), None, latency_s=None, error="HTTP 500: boom"),
    ]
    return RunResult.from_rows(name, rows, wall_s=sum(latencies), target={"kind": "http"})


def _valid_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_run_report_files(tmp_path: Path) -> None:
    run = _run("CPU 2 threads", [1.0, 2.0, 3.0], 0.9)
    paths = write_run_report(run, tmp_path)
    assert {p.name for p in paths.values()} == {
        "CPU-2-threads.json",
        "CPU-2-threads.md",
        "CPU-2-threads-reliability.png",
        "CPU-2-threads-latency.png",
    }
    # 2 of 4 right (n1 yes at .9, s2 level 0; s1 picks level 1 and n2 is invalid)
    text = paths["markdown"].read_text()
    assert "| CPU 2 threads | 2/4 (50.0%) | 2.000 s | 2.900 s |" in text
    assert "| score | 1/2 (50.0%) |" in text
    loaded = RunResult.load(paths["json"])
    assert loaded.totals == run.totals
    assert [r.id for r in loaded.rows] == ["n1", "s1", "s2", "n2"]
    assert loaded.totals["ordinal_mae"] == pytest.approx(0.5)  # |1-2| and |0-0|
    assert loaded.rows[3].error == "HTTP 500: boom"
    _valid_png(paths["reliability"])
    _valid_png(paths["latency"])


def test_compare_two_runs(tmp_path: Path) -> None:
    cpu = _run("CPU", [1.7, 2.0, 19.3], 0.9)
    gpu = _run("GPU", [0.35, 0.4, 0.6], 0.4)  # the noul answer flips to "no": 1/4 right
    paths = write_comparison([cpu, gpu], tmp_path)
    text = paths["markdown"].read_text()
    assert "| CPU | 2/4 (50.0%) |" in text and "| GPU | 1/4 (25.0%) |" in text
    assert text.index("| CPU |") < text.index("| GPU |")
    assert "| noul | 1/2 (50.0%) | 0/2 (0.0%) |" in text
    _valid_png(paths["figure"])
    with pytest.raises(ValueError, match="at least two"):
        write_comparison([cpu], tmp_path)


def test_seed_table_shape() -> None:
    table = seed_table([_run("a|b", [0.5, 0.5, 0.5], 0.9)])
    header, rule, row = table.splitlines()
    assert rule == "|---|---|---|---|"
    assert header == "| target | correct/total (%) | p50 | p95 |"
    assert row.startswith("| a\\|b | 2/4 (50.0%) | 0.500 s | 0.500 s |")


def test_load_rejects_other_json(tmp_path: Path) -> None:
    other = tmp_path / "x.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a benchmark report"):
        RunResult.load(other)
