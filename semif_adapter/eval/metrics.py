"""Metric functions over per-task predictions: pure numpy, no I/O, so each is checkable by hand.

Conventions:
- the predicted answer is the argmax, ties broken by label order (first label wins);
- Brier is the multi-class sum over options of ``(p - onehot)^2``, averaged over tasks (0..2);
- ECE uses 10 equal-width bins on top-1 confidence (a confidence of exactly 1.0 falls in the last bin)
  and weights each bin's ``|accuracy - mean confidence|`` by its share of tasks;
- the majority baseline answers, for every question type, the label *position* most often correct
  in that type (ties: lowest position), because choice tasks have different label names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

ProbRows = Sequence[Sequence[float]]


def argmax_first(probs: ArrayLike) -> int:
    """Index of the largest probability; an exact tie goes to the earlier label."""
    values = np.asarray(probs, dtype=np.float64)
    if values.size == 0:
        raise ValueError("empty probability vector")
    return int(np.argmax(values))  # numpy returns the first maximum


def brier_score(probs: ProbRows, expected: Sequence[int]) -> float:
    if len(probs) != len(expected):
        raise ValueError("probs and expected differ in length")
    if not probs:
        return float("nan")
    total = 0.0
    for row, target in zip(probs, expected, strict=True):
        p = np.asarray(row, dtype=np.float64)
        onehot = np.zeros_like(p)
        onehot[target] = 1.0
        total += float(np.sum((p - onehot) ** 2))
    return total / len(probs)


def log_loss(probs: ProbRows, expected: Sequence[int], eps: float = 1e-12) -> float:
    """Mean negative log probability of the right answer (clipped at ``eps`` so one zero stays finite)."""
    if not probs:
        return float("nan")
    return float(np.mean([-np.log(max(float(row[t]), eps)) for row, t in zip(probs, expected, strict=True)]))


@dataclass(frozen=True)
class ReliabilityBin:
    lower: float
    upper: float
    count: int
    accuracy: float
    confidence: float


def reliability_bins(
    confidences: Sequence[float], correct: Sequence[bool], n_bins: int = 10
) -> list[ReliabilityBin]:
    """Equal-width bins on [0, 1]; empty bins report count 0 and NaN means."""
    conf = np.asarray(confidences, dtype=np.float64)
    hits = np.asarray(correct, dtype=np.float64)
    if conf.shape != hits.shape:
        raise ValueError("confidences and correct differ in length")
    index = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    bins: list[ReliabilityBin] = []
    for b in range(n_bins):
        mask = index == b
        count = int(mask.sum())
        bins.append(
            ReliabilityBin(
                lower=b / n_bins,
                upper=(b + 1) / n_bins,
                count=count,
                accuracy=float(hits[mask].mean()) if count else float("nan"),
                confidence=float(conf[mask].mean()) if count else float("nan"),
            )
        )
    return bins


def expected_calibration_error(
    confidences: Sequence[float], correct: Sequence[bool], n_bins: int = 10
) -> float:
    n = len(confidences)
    if n == 0:
        return float("nan")
    return float(
        sum(
            b.count / n * abs(b.accuracy - b.confidence)
            for b in reliability_bins(confidences, correct, n_bins)
            if b.count
        )
    )


def ordinal_mae(predicted: Sequence[int], expected: Sequence[int]) -> float:
    if not predicted:
        return float("nan")
    return float(np.mean(np.abs(np.asarray(predicted) - np.asarray(expected))))


def majority_baseline(types: Sequence[str], expected: Sequence[int]) -> tuple[int, dict[str, int]]:
    """Tasks a constant per-type answer gets right, and the position chosen per type."""
    by_type: dict[str, Counter[int]] = {}
    for qtype, target in zip(types, expected, strict=True):
        by_type.setdefault(qtype, Counter())[target] += 1
    correct = 0
    chosen: dict[str, int] = {}
    for qtype, counts in by_type.items():
        best = max(counts.values())
        position = min(pos for pos, c in counts.items() if c == best)
        chosen[qtype] = position
        correct += best
    return correct, chosen


def latency_summary(latencies: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (numpy's linear interpolation) and mean, in seconds; None when nothing succeeded."""
    if not latencies:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    values = np.asarray(latencies, dtype=np.float64)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(values.mean())}
