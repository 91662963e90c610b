"""Fit per-question-type temperatures on labelled raw option logits and write ``calibration.json``.

One scalar T per key minimises the mean log loss of ``softmax(logits / T)`` on a fit split. The
search is a bounded golden-section on log T (log loss is unimodal in T for a fixed set of logits,
and numpy is all we need — scipy is not a dependency). A fit is kept only if it lowers ECE on a
held-out split chosen by a seeded shuffle of task ids, so a temperature that merely overfits a small
set is rejected and the key stays uncalibrated. A fit that runs into the search bound (e.g. a fit split
with no errors, where log loss keeps falling as T -> 0) is rejected too: it is an artefact of the
data, not a minimum. Both splits' metrics are written for audit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from semif_adapter.eval import metrics
from semif_adapter.eval.results import RunResult
from semif_adapter.model.calibration import CalibrationFile, apply_temperature, calibration_key

T_MIN = 0.05
T_MAX = 20.0
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class Sample:
    """One labelled decision's raw logits (aligned with its labels) and the right answer's index."""

    id: str
    type: str
    logits: np.ndarray
    expected: int

    @property
    def n_options(self) -> int:
        return int(self.logits.shape[0])


def golden_section_min(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-6) -> float:
    """Minimiser of a unimodal ``f`` on ``[lo, hi]`` (interval shrinks by 0.618 per step)."""
    a, b = lo, hi
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2.0


def _by_width(samples: Sequence[Sample]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stack samples with equal option counts so each softmax is one vectorised call."""
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.n_options, []).append(s)
    return [(np.stack([s.logits for s in g]), np.asarray([s.expected for s in g])) for g in groups.values()]


def probabilities(samples: Sequence[Sample], t: float) -> list[np.ndarray]:
    return [apply_temperature(s.logits, t) for s in samples]


def mean_nll(samples: Sequence[Sample], t: float) -> float:
    total, count = 0.0, 0
    for logits, expected in _by_width(samples):
        probs = apply_temperature(logits, t)
        picked = probs[np.arange(len(expected)), expected]
        total += float(-np.log(np.maximum(picked, 1e-300)).sum())
        count += len(expected)
    return total / count


def fit_temperature(samples: Sequence[Sample], lo: float = T_MIN, hi: float = T_MAX) -> float:
    """T minimising mean log loss, searched on log T within ``[lo, hi]``."""
    if not samples:
        raise ValueError("no samples to fit")
    log_t = golden_section_min(lambda x: mean_nll(samples, math.exp(x)), math.log(lo), math.log(hi), 1e-5)
    return math.exp(log_t)


def evaluate(samples: Sequence[Sample], t: float) -> dict[str, float]:
    """Log loss, ECE, Brier and accuracy of ``softmax(logits / t)``."""
    probs = probabilities(samples, t)
    expected = [s.expected for s in samples]
    top = [metrics.argmax_first(p) for p in probs]
    return {
        "n": len(samples),
        "nll": mean_nll(samples, t),
        "ece": metrics.expected_calibration_error(
            [float(p[i]) for p, i in zip(probs, top, strict=True)],
            [i == e for i, e in zip(top, expected, strict=True)],
        ),
        "brier": metrics.brier_score([p.tolist() for p in probs], expected),
        "accuracy": float(np.mean([i == e for i, e in zip(top, expected, strict=True)])),
    }


def split_ids(ids: Iterable[str], held_out_fraction: float, seed: int) -> set[str]:
    """Held-out ids: a seeded permutation of the sorted ids, so the split ignores file order."""
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError("held_out_fraction must be in (0, 1)")
    ordered = sorted(set(ids))
    order = np.random.default_rng(seed).permutation(len(ordered))
    n_held = max(1, round(len(ordered) * held_out_fraction))
    return {ordered[i] for i in order[:n_held]}


def fit_key(
    fit: Sequence[Sample], held: Sequence[Sample], *, min_fit: int, min_held_out: int
) -> dict[str, Any]:
    """Fit one key and apply the held-out gate; the result says whether and why it was accepted."""
    report: dict[str, Any] = {"n_fit": len(fit), "n_held_out": len(held)}
    shortfalls = [
        f"{split} {n} < {minimum}"
        for split, n, minimum in (("fit", len(fit), min_fit), ("held-out", len(held), min_held_out))
        if n < minimum
    ]
    if shortfalls:
        report.update(accepted=False, reason=f"too few samples ({', '.join(shortfalls)})")
        return report
    t = fit_temperature(fit)
    before, after = evaluate(held, 1.0), evaluate(held, t)
    at_low, at_high = t <= T_MIN * 1.01, t >= T_MAX / 1.01
    at_bound = at_low or at_high
    accepted = after["ece"] < before["ece"] and not at_bound
    if at_low:
        reason = f"fit ran into T_MIN={T_MIN}: the fit split has (almost) no errors; rejected"
    elif at_high:
        reason = f"fit ran into T_MAX={T_MAX}: the logits carry (almost) no signal; rejected"
    elif accepted:
        reason = "held-out ECE improved"
    else:
        reason = "held-out ECE did not improve; fit rejected"
    report.update(
        temperature=t,
        accepted=accepted,
        at_bound=at_bound,
        reason=reason,
        fit={"before": evaluate(fit, 1.0), "after": evaluate(fit, t)},
        held_out={"before": before, "after": after},
    )
    return report


def fit_calibration(
    samples: Sequence[Sample],
    *,
    per_option_count: bool = False,
    held_out_fraction: float = 0.3,
    seed: int = 0,
    min_fit: int = 10,
    min_held_out: int = 5,
    prompt_version: str | None = None,
    scoring_version: str | None = None,
    model_sha256: str | None = None,
    source: dict[str, Any] | None = None,
) -> CalibrationFile:
    """Fit every type (and, if asked, every option count of a type with several) and gate each key."""
    if not samples:
        raise ValueError("no labelled samples with raw option logits")
    held_ids = split_ids((s.id for s in samples), held_out_fraction, seed)
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(calibration_key(s.type), []).append(s)
    if per_option_count:
        for qtype in sorted({s.type for s in samples}):
            widths = sorted({s.n_options for s in samples if s.type == qtype})
            if len(widths) > 1:
                for n in widths:
                    groups[calibration_key(qtype, n)] = [
                        s for s in samples if s.type == qtype and s.n_options == n
                    ]
    fits: dict[str, dict[str, Any]] = {}
    temperatures: dict[str, float] = {}
    for key in sorted(groups):
        group = groups[key]
        report = fit_key(
            [s for s in group if s.id not in held_ids],
            [s for s in group if s.id in held_ids],
            min_fit=min_fit,
            min_held_out=min_held_out,
        )
        fits[key] = report
        if report["accepted"]:
            temperatures[key] = report["temperature"]
    return CalibrationFile(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        prompt_version=prompt_version,
        scoring_version=scoring_version,
        model_sha256=model_sha256,
        temperatures=temperatures,
        fits=fits,
        split={"seed": seed, "held_out_fraction": held_out_fraction, "held_out_ids": len(held_ids)},
        source=source or {},
    )


def samples_from_run(run: RunResult) -> list[Sample]:
    """Valid rows that carry raw option logits (generation runs have none)."""
    return [
        Sample(row.id, row.type, np.asarray(row.option_logits, dtype=np.float64), row.expected_index)
        for row in run.rows
        if row.valid and row.option_logits is not None and len(row.option_logits) == len(row.labels)
    ]


def samples_from_jsonl(path: Path) -> list[Sample]:
    """Rows ``{"id", "type", "option_logits" (or "logits"), "expected_index" | "expected" + "labels"}``."""
    samples: list[Sample] = []
    with Path(path).open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                logits = np.asarray(row.get("option_logits", row.get("logits")), dtype=np.float64)
                if "expected_index" in row:
                    expected = int(row["expected_index"])
                else:
                    expected = [str(x) for x in row["labels"]].index(str(row["expected"]))
                qtype = str(row["type"])
                if logits.ndim != 1 or logits.size < 2 or not 0 <= expected < logits.size:
                    raise ValueError("logits must be a list of >= 2 numbers and expected must index it")
                if qtype not in ("choice", "noul", "score"):
                    raise ValueError(f"unknown type {qtype!r}")
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: unusable logits row: {exc}") from exc
            samples.append(Sample(str(row.get("id", lineno)), qtype, logits, expected))
    return samples


def single_value(values: Iterable[str | None]) -> str | None:
    """The one value all rows agree on, else None (mixed prompts or models are not one calibration)."""
    distinct = {v for v in values if v}
    return distinct.pop() if len(distinct) == 1 else None


def write_calibration(calibration: CalibrationFile, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(calibration.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path
