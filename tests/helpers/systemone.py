"""Shared helpers of the System One tests: sample questions, strict JSON, the answer contract, results."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

STATE = "I was charged twice for my subscription this month. Please refund one of the charges."
NOUL = {"type": "noul", "instructions": "Is this message about billing?"}
CHOICE = {
    "type": "choice",
    "instructions": "What is the tone of the message?",
    "criteria": {"calm": "neutral or polite", "angry": "upset or hostile", "excited": None},
}
SCORE = {
    "type": "score",
    "instructions": "How urgent is this message?",
    "criteria": ["can wait", "needs attention this week", "needs attention today"],
}


def strict_json(content: bytes) -> Any:
    """Parse like a strict client: NaN/Infinity are not JSON."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in response")

    return json.loads(content, parse_constant=refuse)


def ask(
    client: httpx.Client,
    questions: dict[str, Any],
    *,
    state: Any = STATE,
    model: str = "jev-latest",
    path: str = "/v1/systemone",
    **extra: Any,
) -> httpx.Response:
    return client.post(path, json={"model": model, "state": state, "questions": questions, **extra})


def answers(client: httpx.Client, questions: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    response = ask(client, questions, **kwargs)
    assert response.status_code == 200, response.text
    return strict_json(response.content)["answers"]


def check_answer(answer: dict[str, Any], question: dict[str, Any]) -> None:
    """Every rule of the answer contract, recomputed from the probabilities actually returned."""
    kind = question["type"]
    assert answer["type"] == kind
    assert all(
        key in {"type", kind, "probabilities", "legend", "confidence"} or key.startswith("x_")
        for key in answer
    )
    if kind == "noul":
        assert "confidence" not in answer
        assert isinstance(answer["noul"], float) and 0.0 <= answer["noul"] <= 1.0
        return
    probs = answer["probabilities"]
    keys = (
        list(question["criteria"]) if kind == "choice" else [str(i) for i in range(len(question["criteria"]))]
    )
    assert list(probs) == keys
    values = list(probs.values())
    assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in values)
    assert abs(math.fsum(values) - 1.0) < 1e-9
    n = len(values)
    p_max = max(values)
    assert isinstance(answer["confidence"], float) and 0.0 <= answer["confidence"] <= 1.0
    if kind == "choice":
        assert answer["choice"] == keys[values.index(p_max)]
        assert answer["confidence"] == pytest.approx((n * p_max - 1) / (n - 1), abs=1e-12)
    else:
        assert answer["legend"] == {str(i): level for i, level in enumerate(question["criteria"])}
        assert answer["score"] == pytest.approx(sum(i * p for i, p in enumerate(values)), abs=1e-12)
        k = values.index(p_max)
        d = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
        expected = max(0.0, 1 - sum(p * abs(i - k) for i, p in enumerate(values)) / d)
        assert answer["confidence"] == pytest.approx(expected, abs=1e-12)
