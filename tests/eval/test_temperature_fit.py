"""Temperature fitting on synthetic logits, and the held-out gate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.eval import calibrate as cal
from semif_adapter.model.calibration import Calibration, apply_temperature


def synthetic(
    n: int, t_true: float, seed: int, n_options: int = 4, qtype: str = "choice", prefix: str = "s"
) -> list[cal.Sample]:
    """Labels drawn from softmax(z / t_true): the log-loss optimal temperature for z is t_true."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=2.0, size=(n, n_options))
    probs = apply_temperature(z, t_true)
    labels = [int(rng.choice(n_options, p=p)) for p in probs]
    return [cal.Sample(f"{prefix}{i}", qtype, z[i], labels[i]) for i in range(n)]


@pytest.mark.parametrize("t_true", [0.5, 2.0])
def test_fit_recovers_true_temperature(t_true: float) -> None:
    samples = synthetic(2000, t_true, seed=11)
    t = cal.fit_temperature(samples)
    assert abs(t - t_true) / t_true < 0.10
    # the fit really is the minimum of log loss around it
    assert cal.mean_nll(samples, t) <= min(cal.mean_nll(samples, t * 1.3), cal.mean_nll(samples, t / 1.3))


def test_golden_section_finds_minimum_of_a_parabola() -> None:
    assert cal.golden_section_min(lambda x: (x - 1.234) ** 2, -5, 5) == pytest.approx(1.234, abs=1e-5)
    # a minimum at the bound is found at the bound (no extrapolation)
    assert cal.golden_section_min(lambda x: x, 0.0, 1.0) == pytest.approx(0.0, abs=1e-5)


def test_fit_calibration_accepts_a_helpful_fit_and_writes_a_loadable_file(tmp_path: Path) -> None:
    samples = synthetic(1500, 2.5, seed=3) + synthetic(
        600, 1.0, seed=4, n_options=2, qtype="noul", prefix="n"
    )
    result = cal.fit_calibration(samples, seed=0, prompt_version="v1", model_sha256="ef" * 32)
    choice = result.fits["choice"]
    assert choice["accepted"] is True
    assert abs(choice["temperature"] - 2.5) / 2.5 < 0.15
    assert choice["held_out"]["after"]["ece"] < choice["held_out"]["before"]["ece"]
    assert choice["n_fit"] + choice["n_held_out"] == 1500
    path = cal.write_calibration(result, tmp_path / "calibration.json")
    loaded = Calibration.load(path)
    t, key = loaded.temperature_for("choice", 4) or (None, None)
    assert key == "choice" and t == pytest.approx(choice["temperature"])
    assert loaded.prompt_version == "v1"


def test_held_out_gate_rejects_a_fit_that_hurts() -> None:
    # The fit split is generated sharp (T=0.3) and the held-out split flat (T=3): the fitted T < 1
    # makes held-out probabilities even more overconfident, so the gate must refuse it.
    ids = [f"x{i}" for i in range(1000)]
    held = cal.split_ids(ids, 0.3, seed=5)
    sharp = synthetic(1000, 0.3, seed=21)
    flat = synthetic(1000, 3.0, seed=21)  # same logits, labels from a different temperature
    samples = [flat[i] if ids[i] in held else sharp[i] for i in range(1000)]
    samples = [cal.Sample(ids[i], s.type, s.logits, s.expected) for i, s in enumerate(samples)]
    result = cal.fit_calibration(samples, seed=5, held_out_fraction=0.3)
    fit = result.fits["choice"]
    assert fit["temperature"] < 0.5
    assert fit["held_out"]["after"]["ece"] > fit["held_out"]["before"]["ece"]
    assert fit["accepted"] is False
    assert result.temperatures == {}


def test_per_option_count_keys_and_small_groups_are_skipped() -> None:
    samples = synthetic(800, 2.0, seed=1, n_options=3, prefix="a") + synthetic(
        8, 2.0, seed=2, n_options=5, prefix="b"
    )
    result = cal.fit_calibration(samples, per_option_count=True, seed=0)
    assert set(result.fits) == {"choice", "choice/3", "choice/5"}
    assert result.fits["choice/5"]["accepted"] is False
    assert "too few samples" in result.fits["choice/5"]["reason"]
    assert "choice/3" in result.temperatures


@pytest.mark.parametrize(
    ("n_fit", "n_held", "reason"),
    [
        (14, 4, "too few samples (held-out 4 < 5)"),
        (6, 9, "too few samples (fit 6 < 10)"),
        (6, 2, "too few samples (fit 6 < 10, held-out 2 < 5)"),
    ],
)
def test_too_few_samples_names_only_the_short_split(n_fit: int, n_held: int, reason: str) -> None:
    samples = synthetic(n_fit + n_held, 1.0, seed=3)
    result = cal.fit_key(samples[:n_fit], samples[n_fit:], min_fit=10, min_held_out=5)
    assert result == {"n_fit": n_fit, "n_held_out": n_held, "accepted": False, "reason": reason}


def test_split_is_deterministic_and_order_free() -> None:
    ids = [f"t{i}" for i in range(100)]
    a = cal.split_ids(ids, 0.3, seed=9)
    assert a == cal.split_ids(list(reversed(ids)), 0.3, seed=9)
    assert len(a) == 30
    assert a != cal.split_ids(ids, 0.3, seed=10)
    with pytest.raises(ValueError):
        cal.split_ids(ids, 1.0, seed=0)


def test_samples_from_jsonl_rejects_bad_rows(tmp_path: Path) -> None:
    good = tmp_path / "rows.jsonl"
    good.write_text(
        '{"id": "a", "type": "noul", "option_logits": [0.1, 2.0], "expected_index": 1}\n'
        '{"id": "b", "type": "choice", "logits": [1, 2, 3], "labels": ["x", "y", "z"], "expected": "z"}\n'
    )
    samples = cal.samples_from_jsonl(good)
    assert [(s.id, s.expected, s.n_options) for s in samples] == [("a", 1, 2), ("b", 2, 3)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "type": "noul", "option_logits": [0.1, 2.0], "expected_index": 5}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        cal.samples_from_jsonl(bad)
    assert math.isfinite(cal.mean_nll(samples, 1.0))


def test_fit_at_the_search_bound_is_rejected() -> None:
    # every answer right with a clear margin: log loss keeps falling as T -> 0, so the fit hits T_MIN
    rng = np.random.default_rng(0)
    samples = []
    for i in range(200):
        z = rng.normal(size=3)
        samples.append(cal.Sample(f"p{i}", "choice", z, int(np.argmax(z))))
    fit = cal.fit_calibration(samples, seed=0).fits["choice"]
    assert fit["at_bound"] is True and fit["accepted"] is False
    assert fit["temperature"] == pytest.approx(cal.T_MIN, rel=0.02)
