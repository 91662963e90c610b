"""Answer math: from the engine's option probabilities to noul / choice / score answers.

Everything is computed from the normalised probabilities that are actually returned, so a client
that recomputes ``choice``, ``score`` or ``confidence`` from the response gets the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from semif_adapter.errors import EngineFailure
from semif_adapter.protocol import DecisionResult
from semif_adapter.systemone.convert import NOUL_NO, NOUL_YES
from semif_adapter.systemone.protocol import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    TextQuestion,
)


def normalise(probabilities: Sequence[float]) -> list[float]:
    """Rescaled to sum to 1; values outside [0, 1] or NaN are an engine fault, never passed on."""
    values = [float(p) for p in probabilities]
    if not values or any(not (math.isfinite(p) and 0.0 <= p <= 1.0 + 1e-6) for p in values):
        raise EngineFailure(f"engine returned invalid probabilities: {values!r}")
    total = math.fsum(values)
    if not 0 < total < math.inf:
        raise EngineFailure(f"engine returned probabilities that sum to {total}")
    return [p / total for p in values]


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (criteria order decides)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def choice_confidence(probabilities: Sequence[float]) -> float:
    """(n·p_max − 1)/(n − 1): 0 for a uniform distribution, 1 for a certain one."""
    n = len(probabilities)
    return _clamp01((n * max(probabilities) - 1.0) / (n - 1))


def score_dispersion_baseline(n: int) -> float:
    """D = (1/n)·Σ_i |i − (n−1)/2|: mean distance of the levels from the middle of the scale."""
    middle = (n - 1) / 2
    return math.fsum(abs(i - middle) for i in range(n)) / n


def score_confidence(probabilities: Sequence[float]) -> float:
    """max(0, 1 − Σ p_i·|i − k| / D) with k the most likely level."""
    k = argmax(probabilities)
    spread = math.fsum(p * abs(i - k) for i, p in enumerate(probabilities))
    return _clamp01(1.0 - spread / score_dispersion_baseline(len(probabilities)))


def expected_score(probabilities: Sequence[float]) -> float:
    return math.fsum(i * p for i, p in enumerate(probabilities))


def _ordered(result: DecisionResult, option_ids: Sequence[str]) -> tuple[list[float], list[float]]:
    """Probabilities and logits in ``option_ids`` order, matched by id rather than trusted by position."""
    if sorted(result.option_ids) != sorted(option_ids) or len(result.probabilities) != len(option_ids):
        raise EngineFailure(f"engine answered options {result.option_ids!r}, expected {list(option_ids)!r}")
    position = {option_id: i for i, option_id in enumerate(result.option_ids)}
    probabilities = [result.probabilities[position[o]] for o in option_ids]
    logits = [result.option_logits[position[o]] for o in option_ids] if result.option_logits else []
    return normalise(probabilities), logits


def _extras(keys: Sequence[str], logits: Sequence[float], result: DecisionResult) -> dict[str, object]:
    extras: dict[str, object] = {}
    if len(logits) == len(keys) and all(math.isfinite(x) for x in logits):
        extras["x_option_logits"] = {k: float(x) for k, x in zip(keys, logits, strict=True)}
    if math.isfinite(result.allowed_token_mass):
        extras["x_allowed_token_mass"] = _clamp01(float(result.allowed_token_mass))
    extras["x_scoring_version"] = result.scoring_version
    return extras


def answer_for(question: TextQuestion, result: DecisionResult) -> Answer:
    """The Jev answer for one question from the engine's result for its decision."""
    if isinstance(question, NoulQuestion):
        keys = [NOUL_NO, NOUL_YES]
        probabilities, logits = _ordered(result, keys)
        return NoulAnswer(noul=_clamp01(probabilities[1]), **_extras(keys, logits, result))
    if isinstance(question, ChoiceQuestion):
        keys = list(question.criteria)
        probabilities, logits = _ordered(result, keys)
        return ChoiceAnswer(
            choice=keys[argmax(probabilities)],
            probabilities=dict(zip(keys, probabilities, strict=True)),
            confidence=choice_confidence(probabilities),
            **_extras(keys, logits, result),
        )
    keys = [str(i) for i in range(len(question.criteria))]
    probabilities, logits = _ordered(result, keys)
    return ScoreAnswer(
        score=expected_score(probabilities),
        legend=dict(zip(keys, question.criteria, strict=True)),
        probabilities=dict(zip(keys, probabilities, strict=True)),
        confidence=score_confidence(probabilities),
        **_extras(keys, logits, result),
    )
