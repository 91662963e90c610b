"""Server-side calibration: loading calibration.json, choosing a temperature, applying it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.errors import ModelLoadError
from semif_adapter.model.calibration import Calibration, apply_temperature, find_calibration, portable_softmax


def _write(path: Path, payload: object) -> Path:
    path.write_text(json.dumps(payload) if not isinstance(payload, str) else payload, encoding="utf-8")
    return path


def test_load_and_most_specific_key_wins(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "calibration.json",
        {
            "version": 1,
            "temperatures": {"choice": 1.5, "choice/4": 2.0, "noul": 0.8},
            "prompt_version": "v3",
            "model_sha256": "cd" * 32,
        },
    )
    cal = Calibration.load(path)
    assert cal.temperature_for("choice", 4) == (2.0, "choice/4")
    assert cal.temperature_for("choice", 3) == (1.5, "choice")
    assert cal.temperature_for("noul", 2) == (0.8, "noul")
    assert cal.temperature_for("score", 5) is None
    assert cal.prompt_version == "v3" and cal.model_sha256 == "cd" * 32


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "JSON object"),
        ({"version": 3, "temperatures": {}}, "version"),
        ({"version": 1, "temperatures": {"choice": -1.0}}, "finite number > 0"),
        ({"version": 1, "temperatures": {"choice": 0}}, "finite number > 0"),
        ({"version": 1, "temperatures": {"choice": "hot"}}, "temperatures"),
        ({"version": 1, "temperatures": {"multi": 1.0}}, "multi"),
        ({"version": 1, "temperatures": {"choice/1": 1.0}}, "at least 2 options"),
        ('{"version": 1, "temperatures": {"noul": NaN}}', "finite number > 0"),
        ({"version": 1, "method": "platt", "temperatures": {}}, "method"),
        ({"version": 1, "temperature": 1.3}, "temperature: Extra inputs are not permitted"),
    ],
)
def test_malformed_files_raise_model_load_error(tmp_path: Path, content: object, fragment: str) -> None:
    path = _write(tmp_path / "calibration.json", content)
    with pytest.raises(ModelLoadError) as info:
        Calibration.load(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_raises_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        Calibration.load(tmp_path / "nope.json")


def test_the_served_softmax_is_libm_exp_and_an_exactly_rounded_sum() -> None:
    """``portable_softmax`` (what the engine serves): each term exactly ``math.exp`` of the max-shifted
    logit, divided by the ``math.fsum`` of the terms, whatever numpy's exp kernel on this CPU does; it
    agrees with the vectorised softmax to rounding, and refuses what that refuses."""
    logits = [21.0597, 20.4238, -3.5, 20.4238, 7.25]
    for t in (1.0, 0.7, 2.5):
        scaled = [x / t for x in logits]
        terms = [math.exp(x - max(scaled)) for x in scaled]
        assert portable_softmax(logits, t) == [term / math.fsum(terms) for term in terms]
        np.testing.assert_allclose(
            portable_softmax(logits, t), apply_temperature(np.array(logits), t), rtol=1e-13
        )
    assert portable_softmax([1000.0, 999.0]) == pytest.approx([0.7310585786, 0.2689414214])
    for bad, t in (([], 1.0), ([1.0, math.inf], 1.0), ([1.0], 0.0), ([1.0], math.nan)):
        with pytest.raises(ValueError):
            portable_softmax(bad, t)


def test_apply_temperature_matches_softmax_and_is_stable() -> None:
    logits = np.array([2.0, 1.0, 0.0])
    expected = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    out = apply_temperature(logits, 2.0)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    # T=1 is the plain softmax; large logits do not overflow; rows of a 2-D batch are independent
    np.testing.assert_allclose(
        apply_temperature(np.array([1000.0, 999.0]), 1.0), [0.7310585786, 0.2689414214]
    )
    batch = apply_temperature(np.array([[0.0, 0.0], [3.0, 1.0]]), 1.0)
    np.testing.assert_allclose(batch.sum(axis=1), [1.0, 1.0])
    assert batch[0, 0] == pytest.approx(0.5)
    # higher T flattens, lower T sharpens; argmax never changes
    assert apply_temperature(logits, 5.0).max() < out.max() < apply_temperature(logits, 0.5).max()


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_apply_temperature_rejects_bad_temperature(t: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(np.array([1.0, 2.0]), t)


def test_apply_temperature_rejects_non_finite_logits() -> None:
    with pytest.raises(ValueError, match="finite"):
        apply_temperature(np.array([1.0, np.nan]), 1.0)


def test_find_calibration(tmp_path: Path) -> None:
    assert find_calibration(tmp_path, None) is None
    default = _write(tmp_path / "calibration.json", {"version": 1})
    assert find_calibration(tmp_path, None) == default
    explicit = _write(tmp_path / "other.json", {"version": 1})
    assert find_calibration(tmp_path, explicit) == explicit
    assert find_calibration(None, None) is None
    with pytest.raises(ModelLoadError, match="does not exist"):
        find_calibration(tmp_path, tmp_path / "missing.json")
