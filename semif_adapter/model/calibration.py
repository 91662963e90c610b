"""Temperature calibration: the ``calibration.json`` schema, its loader and the softmax it drives.

Raw option probabilities of a language model are not calibrated confidence. ``semif-adapter calibrate``
fits one temperature per question type (optionally per option count) on labelled decisions and
writes ``calibration.json``; the engine loads it here and reports ``softmax(logits / T)`` while the
raw ``option_logits`` stay untouched. The writer (``semif_adapter.eval.calibrate``) and this reader
share :class:`CalibrationFile`, so the two cannot drift apart.

Schema (version 2; version 1 files, without ``scoring_version``, still load)::

    {
      "version": 2,
      "method": "temperature",
      "created_at": "2026-01-01T00:00:00+00:00",
      "prompt_version": "v1" | null,     # prompt the logits were read with
      "scoring_version": "sv1-…" | null, # scoring the logits were read under (``engine.scoring``)
      "model_sha256": "<hex>" | null,    # GGUF the fit belongs to, if known
      "temperatures": {"choice": 1.4, "choice/4": 1.2, "noul": 0.9},   # accepted fits only
      "fits": {"<key>": {...}},          # per key: fit/held-out metrics, accepted or not (free form)
      "split": {"seed": 0, "held_out_fraction": 0.3},
      "source": {...}                    # where the logits came from (free form)
    }

A key is a question type (``choice``, ``noul``, ``score``) or ``type/n_options`` (``choice/4``);
the most specific key wins.

A temperature fitted on one scoring's logits does not fit another's, so the engine refuses a file whose
``scoring_version`` is not the one it serves under (or that records none), unless told to serve it marked
stale (``SEMIF_STALE_CALIBRATION=mark``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from semif_adapter.errors import ModelLoadError

CALIBRATION_VERSION: Literal[2] = 2
CALIBRATION_FILENAME = "calibration.json"
QUESTION_TYPES = ("choice", "noul", "score")
_KEY_RE = re.compile(r"^(choice|noul|score)(?:/([1-9][0-9]*))?$")


def calibration_key(question_type: str, n_options: int | None = None) -> str:
    """The key a fit is stored under: the type alone, or ``type/n`` for one option count."""
    return question_type if n_options is None else f"{question_type}/{n_options}"


class CalibrationFile(BaseModel):
    """On-disk form of ``calibration.json`` (see the module docstring).

    Unknown top-level fields are refused: a hand-written ``{"temperature": 1.3}`` would otherwise load
    as "no temperatures" and the server would silently serve raw probabilities. New fields come with a
    new ``version``.
    """

    model_config = ConfigDict(extra="forbid")

    version: Literal[1, 2] = CALIBRATION_VERSION
    method: Literal["temperature"] = "temperature"
    created_at: str | None = None
    prompt_version: str | None = None
    scoring_version: str | None = None
    model_sha256: str | None = None
    temperatures: dict[str, float] = Field(default_factory=dict)
    fits: dict[str, dict[str, Any]] = Field(default_factory=dict)
    split: dict[str, Any] = Field(default_factory=dict)
    source: dict[str, Any] = Field(default_factory=dict)

    @field_validator("temperatures")
    @classmethod
    def _valid_temperatures(cls, temperatures: dict[str, float]) -> dict[str, float]:
        for key, value in temperatures.items():
            match = _KEY_RE.match(key)
            if match is None:
                raise ValueError(f"key {key!r} is not 'type' or 'type/n_options' (type: choice|noul|score)")
            if match.group(2) is not None and int(match.group(2)) < 2:
                raise ValueError(f"key {key!r}: a decision has at least 2 options")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"temperature for {key!r} must be a finite number > 0, got {value!r}")
        return temperatures


class Calibration:
    """Loaded temperatures; the engine asks :meth:`temperature_for` once per decision."""

    def __init__(self, data: CalibrationFile, path: Path | None = None) -> None:
        self.data = data
        self.path = path

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read and validate ``path``; any defect stops start-up with a message naming the file."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ModelLoadError(f"calibration file {path} does not exist") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"calibration file {path} is not readable JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"calibration file {path} must hold a JSON object")
        try:
            data = CalibrationFile.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
            )
            raise ModelLoadError(f"calibration file {path} is malformed: {problems}") from exc
        return cls(data, path)

    @property
    def temperatures(self) -> dict[str, float]:
        return dict(self.data.temperatures)

    @property
    def prompt_version(self) -> str | None:
        return self.data.prompt_version

    @property
    def model_sha256(self) -> str | None:
        return self.data.model_sha256

    @property
    def scoring_version(self) -> str | None:
        return self.data.scoring_version

    def temperature_for(self, question_type: str, n_options: int) -> tuple[float, str] | None:
        """``(T, key)`` for a decision, preferring ``type/n_options`` over ``type``; None if uncalibrated."""
        for key in (calibration_key(question_type, n_options), calibration_key(question_type)):
            value = self.data.temperatures.get(key)
            if value is not None:
                return float(value), key
        return None


def stale_reason(calibration: Calibration, scoring_version: str, model_sha256: str) -> str | None:
    """Why ``calibration`` does not belong to a server scoring under ``scoring_version`` with the model
    ``model_sha256``; None when it does. A temperature fitted on one scoring's logits does not fit
    another's, and one that records no scoring version was fitted under an unknown one."""
    if calibration.model_sha256 and calibration.model_sha256 != model_sha256:
        return f"was fitted on model {calibration.model_sha256[:16]}…, this is {model_sha256[:16]}…"
    if calibration.scoring_version is None:
        return "records no scoring_version (fitted before scoring versions existed)"
    if calibration.scoring_version != scoring_version:
        return f"was fitted under scoring {calibration.scoring_version}; this server scores {scoring_version}"
    return None


def apply_temperature(logits: np.ndarray, t: float) -> np.ndarray:
    """float64 ``softmax(logits / t)`` over the last axis (max-shifted, so large logits cannot overflow)."""
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
    scaled = np.asarray(logits, dtype=np.float64) / t
    if scaled.ndim == 0 or scaled.shape[-1] == 0:
        raise ValueError("logits must have at least one entry on the last axis")
    if not np.all(np.isfinite(scaled)):
        raise ValueError("logits must be finite")
    shifted = scaled - scaled.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=-1, keepdims=True))


def portable_softmax(logits: Sequence[float], t: float = 1.0) -> list[float]:
    """``softmax(logits / t)`` of one decision, the same to the last bit on every CPU: each term by libm's
    scalar ``exp`` (``math.exp``), the sum exactly rounded (``math.fsum``).

    Served probabilities go through here, not :func:`apply_temperature`: numpy picks its ``exp`` kernel by
    the CPU (an AVX-512 one where the CPU has it, libm's elsewhere), and the two differ in the last bit, so
    the same logits gave other probabilities on an AVX2-only machine than on the AVX-512 machines that
    recorded the golden answers (up to 6.9e-18). A decision has at most a few hundred options: the scalar
    loop costs microseconds."""
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
    scaled = [float(x) / t for x in logits]
    if not scaled:
        raise ValueError("logits must have at least one entry")
    if not all(math.isfinite(x) for x in scaled):
        raise ValueError("logits must be finite")
    peak = max(scaled)
    terms = [math.exp(x - peak) for x in scaled]
    total = math.fsum(terms)
    return [term / total for term in terms]


def find_calibration(model_dir: Path | None, explicit_path: Path | None) -> Path | None:
    """The explicit file if given (it must exist), else ``model_dir/calibration.json`` if present.

    A configured path that is missing is an operator error, so it fails loudly instead of silently
    serving uncalibrated probabilities.
    """
    if explicit_path is not None:
        explicit_path = Path(explicit_path)
        if not explicit_path.is_file():
            raise ModelLoadError(f"calibration file {explicit_path} (SEMIF_CALIBRATION_PATH) does not exist")
        return explicit_path
    if model_dir is not None:
        candidate = Path(model_dir) / CALIBRATION_FILENAME
        if candidate.is_file():
            return candidate
    return None
