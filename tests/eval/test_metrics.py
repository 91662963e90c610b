"""Metric functions against values worked out by hand (see the comments for the arithmetic)."""

from __future__ import annotations

import math

import pytest

from semif_adapter.eval import metrics
from semif_adapter.eval.mapping import Prediction
from semif_adapter.eval.results import make_row, summarize
from semif_adapter.eval.tasks import Task


def test_brier_is_multiclass_sum_averaged() -> None:
    # (0.3² + 0.2² + 0.1²) = 0.14 ; (0.5² + 0.5²) = 0.5 ; mean 0.32
    assert metrics.brier_score([[0.7, 0.2, 0.1], [0.5, 0.5]], [0, 1]) == pytest.approx(0.32)
    assert metrics.brier_score([[0.0, 1.0]], [0]) == pytest.approx(2.0)  # worst case


def test_ece_ten_equal_width_bins() -> None:
    # bin 9: conf .95,.95 acc .5 -> gap .45 ; bin 5: conf .55,.55 acc 1 -> .45 ; bin 2: conf .25 acc 0 -> .25
    # ECE = 2/5*.45 + 2/5*.45 + 1/5*.25 = 0.41
    conf = [0.95, 0.95, 0.55, 0.55, 0.25]
    correct = [True, False, True, True, False]
    assert metrics.expected_calibration_error(conf, correct) == pytest.approx(0.41)


def test_ece_confidence_one_lands_in_last_bin() -> None:
    bins = metrics.reliability_bins([1.0, 0.91], [True, False])
    assert bins[9].count == 2 and bins[9].accuracy == pytest.approx(0.5)
    assert sum(b.count for b in bins) == 2
    # all-correct with confidence 1 is perfectly calibrated
    assert metrics.expected_calibration_error([1.0, 1.0], [True, True]) == pytest.approx(0.0)


def test_ordinal_mae() -> None:
    assert metrics.ordinal_mae([0, 2, 4], [1, 2, 1]) == pytest.approx(4 / 3)


def test_ties_broken_by_label_order() -> None:
    assert metrics.argmax_first([0.4, 0.4, 0.2]) == 0
    assert metrics.argmax_first([0.2, 0.4, 0.4]) == 1
    task = Task.model_validate(
        {
            "id": "t",
            "state": "s",
            "question": {"type": "choice", "instructions": "q", "criteria": {"b": "", "a": ""}},
            "labels": ["b", "a"],
            "expected": "a",
        }
    )
    row = make_row(task, Prediction(probabilities=[0.5, 0.5]), latency_s=0.1)
    assert row.predicted == "b" and row.correct is False


def test_majority_baseline_per_type_position() -> None:
    # noul: position 1 right twice of three -> 2 ; choice: positions 2 and 0 tie -> lowest (0) -> 1
    correct, chosen = metrics.majority_baseline(["noul", "noul", "noul", "choice", "choice"], [1, 1, 0, 2, 0])
    assert correct == 3
    assert chosen == {"noul": 1, "choice": 0}


def test_log_loss_and_latency_summary() -> None:
    assert metrics.log_loss([[0.5, 0.5], [0.25, 0.75]], [0, 1]) == pytest.approx(
        (math.log(2) + math.log(4 / 3)) / 2
    )
    summary = metrics.latency_summary([1.0, 2.0, 3.0, 4.0])
    assert summary["p50"] == pytest.approx(2.5)
    assert summary["mean"] == pytest.approx(2.5)
    assert summary["p95"] == pytest.approx(3.85)  # linear: 1 + 0.95*3
    assert metrics.latency_summary([])["p50"] is None


def _noul(task_id: str, expected: str) -> Task:
    return Task.model_validate(
        {
            "id": task_id,
            "family": "fam",
            "state": "s",
            "question": {"type": "noul", "instructions": "q"},
            "labels": ["no", "yes"],
            "expected": expected,
        }
    )


def test_summary_counts_invalid_as_wrong_and_uses_valid_for_probability_metrics() -> None:
    rows = [
        make_row(_noul("a", "yes"), Prediction([0.2, 0.8]), latency_s=1.0),  # right, conf .8
        make_row(_noul("b", "no"), Prediction([0.4, 0.6]), latency_s=3.0),  # wrong, conf .6
        make_row(_noul("c", "yes"), None, latency_s=None, error="HTTP 500"),  # invalid
    ]
    totals = summarize(rows, wall_s=2.0)
    assert (totals["correct"], totals["tasks"], totals["valid"]) == (1, 3, 2)
    assert totals["accuracy"] == pytest.approx(1 / 3)
    assert totals["accuracy_valid"] == pytest.approx(0.5)
    # Brier: (.2²+.2²)=.08 ; (.4²+.6²)... expected no: (0.4-1)²+(0.6)² = .36+.36=.72 ; mean .40
    assert totals["brier"] == pytest.approx(0.40)
    # ECE: bin 8 (.8, right) gap .2 ; bin 6 (.6, wrong) gap .6 -> (.2+.6)/2 = .4
    assert totals["ece"] == pytest.approx(0.4)
    assert totals["latency_s"]["p50"] == pytest.approx(2.0)
    assert totals["decisions_per_s"] == pytest.approx(1.0)
    assert totals["majority_baseline"]["correct"] == 2  # "yes" twice of three
    assert totals["by_family"]["fam"] == {"correct": 1, "total": 3, "accuracy": pytest.approx(1 / 3)}
    assert totals["ordinal_mae"] is None  # no score tasks
