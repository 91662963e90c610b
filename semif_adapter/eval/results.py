"""Per-task rows and run totals: the benchmark report JSON (also read by ``compare`` and ``calibrate``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from semif_adapter.eval import metrics
from semif_adapter.eval.mapping import Prediction
from semif_adapter.eval.tasks import Task

REPORT_SCHEMA = "semif-benchmark/1"


class TaskRow(BaseModel):
    """One task's outcome. ``latency_s`` is the successful attempt only; retries live in ``retry_wait_s``."""

    id: str
    family: str
    type: str
    labels: list[str]
    expected: str
    expected_index: int
    valid: bool
    error: str | None = None
    probabilities: list[float] | None = None
    option_logits: list[float] | None = Field(default=None, description="Raw logits, aligned with labels.")
    predicted: str | None = None
    predicted_index: int | None = None
    correct: bool = False
    confidence: float | None = None
    latency_s: float | None = None
    retry_wait_s: float = 0.0
    retries_503: int = 0
    attempts: int = 0
    status: int | None = None
    calibration: dict[str, Any] | None = None
    prompt_version: str | None = None
    scoring_version: str | None = None
    model_sha256: str | None = None
    reply: str | None = None


def make_row(
    task: Task,
    prediction: Prediction | None,
    *,
    latency_s: float | None,
    retry_wait_s: float = 0.0,
    retries_503: int = 0,
    attempts: int = 1,
    status: int | None = None,
    error: str | None = None,
) -> TaskRow:
    """Build a row; a missing prediction (or an error) is an invalid response, never a guess."""
    row = TaskRow(
        id=task.id,
        family=task.family_name,
        type=task.type,
        labels=list(task.labels),
        expected=task.expected_label,
        expected_index=task.expected_index,
        valid=prediction is not None and error is None,
        error=error,
        retry_wait_s=retry_wait_s,
        retries_503=retries_503,
        attempts=attempts,
        status=status,
    )
    if prediction is None or error is not None:
        return row
    index = metrics.argmax_first(prediction.probabilities)
    row.probabilities = prediction.probabilities
    row.option_logits = prediction.option_logits
    row.predicted_index = index
    row.predicted = task.labels[index]
    row.correct = index == row.expected_index
    row.confidence = float(prediction.probabilities[index])
    row.latency_s = latency_s
    row.calibration = prediction.calibration
    row.prompt_version = prediction.prompt_version
    row.scoring_version = prediction.scoring_version
    row.model_sha256 = prediction.model_sha256
    row.reply = prediction.reply
    return row


def _ratio(correct: int, total: int) -> dict[str, Any]:
    return {"correct": correct, "total": total, "accuracy": correct / total if total else None}


def _grouped(rows: Sequence[TaskRow], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[TaskRow]] = {}
    for row in rows:
        groups.setdefault(getattr(row, key), []).append(row)
    return {name: _ratio(sum(r.correct for r in g), len(g)) for name, g in sorted(groups.items())}


def _nan_to_none(value: float) -> float | None:
    return None if value != value else value  # NaN is not JSON


def summarize(rows: Sequence[TaskRow], wall_s: float) -> dict[str, Any]:
    """Totals: accuracy counts invalid responses as wrong; probability metrics use valid rows only."""
    valid = [r for r in rows if r.valid and r.probabilities is not None]
    correct = sum(r.correct for r in rows)
    probs = [r.probabilities or [] for r in valid]
    expected = [r.expected_index for r in valid]
    score_rows = [r for r in valid if r.type == "score"]
    baseline_correct, positions = metrics.majority_baseline(
        [r.type for r in rows], [r.expected_index for r in rows]
    )
    latencies = [r.latency_s for r in valid if r.latency_s is not None]
    return {
        "tasks": len(rows),
        "valid": len(valid),
        "invalid": len(rows) - len(valid),
        **_ratio(correct, len(rows)),
        "accuracy_valid": (sum(r.correct for r in valid) / len(valid)) if valid else None,
        "by_type": _grouped(rows, "type"),
        "by_family": _grouped(rows, "family"),
        "majority_baseline": {**_ratio(baseline_correct, len(rows)), "positions": positions},
        "brier": _nan_to_none(metrics.brier_score(probs, expected)),
        "log_loss": _nan_to_none(metrics.log_loss(probs, expected)),
        "ece": _nan_to_none(
            metrics.expected_calibration_error(
                [r.confidence or 0.0 for r in valid], [r.correct for r in valid]
            )
        ),
        "ordinal_mae": _nan_to_none(
            metrics.ordinal_mae(
                [r.predicted_index or 0 for r in score_rows], [r.expected_index for r in score_rows]
            )
        ),
        "latency_s": metrics.latency_summary(latencies),
        "retries_503": sum(r.retries_503 for r in rows),
        "retry_wait_s": sum(r.retry_wait_s for r in rows),
        "wall_s": wall_s,
        "decisions_per_s": (len(valid) / wall_s) if wall_s > 0 else None,
    }


class RunResult(BaseModel):
    """One benchmark run against one target: what ``run_benchmark`` returns and the report JSON holds."""

    schema_: str = Field(default=REPORT_SCHEMA, alias="schema")
    name: str
    target: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    wall_s: float = 0.0
    totals: dict[str, Any] = Field(default_factory=dict)
    rows: list[TaskRow] = Field(default_factory=list)

    model_config = {"populate_by_name": True}

    @classmethod
    def from_rows(cls, name: str, rows: Iterable[TaskRow], wall_s: float, **fields: Any) -> RunResult:
        rows = list(rows)
        return cls(name=name, rows=rows, wall_s=wall_s, totals=summarize(rows, wall_s), **fields)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> RunResult:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"{path} is not a benchmark report ({REPORT_SCHEMA})")
        return cls.model_validate(raw)
