"""Answer math from engine probabilities, checked by formula, by property and by the official SDK parser."""

from __future__ import annotations

import json
import math

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typesafe_sdk import ChoiceAnswer as SdkChoice
from typesafe_sdk import NoulAnswer as SdkNoul
from typesafe_sdk import ScoreAnswer as SdkScore
from typesafe_sdk import SystemOneResponse as SdkResponse

from semif_adapter.errors import EngineFailure
from semif_adapter.systemone.answers import answer_for, choice_confidence, score_confidence
from semif_adapter.systemone.convert import parse_question
from semif_adapter.systemone.protocol import SystemOneResponse, Usage
from tests.helpers.support import stand_in_result as result

TOL = 1e-9


def sdk_parse(answers: dict) -> SdkResponse:
    """Round-trip through strict JSON and the SDK's own response decoder."""
    body = SystemOneResponse(model="m", answers=answers, usage=Usage(input_tokens=7)).model_dump(
        mode="json", exclude_none=True
    )
    content = json.dumps(body, allow_nan=False, ensure_ascii=False).encode()
    return SdkResponse.from_http_response(httpx2.Response(200, content=content))


weights = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_subnormal=True)


def distribution(n_min: int, n_max: int):
    return st.lists(weights, min_size=n_min, max_size=n_max).filter(lambda ws: math.fsum(ws) > 0)


@settings(max_examples=200, deadline=None)
@given(distribution(2, 30), st.randoms(use_true_random=False))
def test_choice_answer_properties(ws, rnd):
    names = [f"opt{i}" for i in range(len(ws))]
    question = parse_question({"type": "choice", "criteria": dict.fromkeys(names)})
    # The engine's order is not trusted: shuffle it, answers are matched by id.
    order = list(range(len(ws)))
    rnd.shuffle(order)
    answer = answer_for(question, result([names[i] for i in order], [ws[i] for i in order]))
    probs = answer.probabilities
    assert list(probs) == names
    values = list(probs.values())
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in values)
    assert abs(math.fsum(values) - 1.0) < TOL
    # choice and confidence are recomputed from the returned probabilities, first name on ties.
    p_max = max(values)
    assert answer.choice == next(name for name, p in probs.items() if p == p_max)
    n = len(values)
    assert answer.confidence == pytest.approx(max(0.0, min(1.0, (n * p_max - 1) / (n - 1))), abs=1e-12)
    assert 0.0 <= answer.confidence <= 1.0
    parsed = sdk_parse({"c": answer}).choices["c"]
    assert isinstance(parsed, SdkChoice) and parsed.choice == answer.choice and parsed.probabilities == probs


@settings(max_examples=200, deadline=None)
@given(distribution(2, 10))
def test_score_answer_properties(ws):
    levels = [f"level {i}" for i in range(len(ws))]
    question = parse_question({"type": "score", "criteria": levels})
    answer = answer_for(question, result([str(i) for i in range(len(ws))], ws))
    values = [answer.probabilities[str(i)] for i in range(len(ws))]
    assert list(answer.probabilities) == [str(i) for i in range(len(ws))]
    assert answer.legend == {str(i): level for i, level in enumerate(levels)}
    assert abs(math.fsum(values) - 1.0) < TOL
    assert answer.score == pytest.approx(sum(i * p for i, p in enumerate(values)), abs=1e-12)
    assert -TOL <= answer.score <= len(ws) - 1 + TOL
    n = len(values)
    k = values.index(max(values))
    d = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    expected = max(0.0, 1 - sum(p * abs(i - k) for i, p in enumerate(values)) / d)
    assert answer.confidence == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= answer.confidence <= 1.0
    parsed = sdk_parse({"s": answer}).scores["s"]
    assert isinstance(parsed, SdkScore)
    assert parsed.probabilities == {i: p for i, p in enumerate(values)} and parsed.score == answer.score


@settings(max_examples=200, deadline=None)
@given(weights, weights, st.booleans())
def test_noul_answer_properties(p_no, p_yes, yes_first):
    if p_no + p_yes == 0:
        return
    question = parse_question({"type": "noul", "instructions": "?"})
    ids, probs = (["yes", "no"], [p_yes, p_no]) if yes_first else (["no", "yes"], [p_no, p_yes])
    answer = answer_for(question, result(ids, probs))
    assert answer.noul == pytest.approx(p_yes / (p_yes + p_no), abs=1e-12)
    assert 0.0 <= answer.noul <= 1.0
    dumped = answer.model_dump(exclude_none=True)
    assert "confidence" not in dumped and set(dumped) <= {
        "type",
        "noul",
        "x_option_logits",
        "x_allowed_token_mass",
        "x_scoring_version",
    }
    parsed = sdk_parse({"n": answer}).nouls["n"]
    assert isinstance(parsed, SdkNoul) and parsed.noul == answer.noul


def test_known_values():
    assert choice_confidence([0.25] * 4) == 0.0
    assert choice_confidence([1.0, 0.0, 0.0]) == 1.0
    assert choice_confidence([0.5, 0.5]) == 0.0
    assert choice_confidence([0.75, 0.25]) == pytest.approx(0.5)
    # n=3: D = (1 + 0 + 1)/3; all mass at the ends, k = 0 → 1 − (0.5·2)/(2/3) < 0 → 0.
    assert score_confidence([0.5, 0.0, 0.5]) == 0.0
    assert score_confidence([0.0, 1.0, 0.0]) == 1.0
    # n=2: D = 0.5; p = (0.8, 0.2), k = 0 → 1 − 0.2/0.5 = 0.6
    assert score_confidence([0.8, 0.2]) == pytest.approx(0.6)
    question = parse_question({"type": "score", "criteria": ["a", "b", "c"]})
    answer = answer_for(question, result(["0", "1", "2"], [0.2, 0.3, 0.5]))
    assert answer.score == pytest.approx(1.3)


def test_extras_are_x_prefixed_finite_and_keyed_by_option():
    question = parse_question({"type": "choice", "criteria": {"b": None, "a": None}})
    answer = answer_for(question, result(["a", "b"], [0.3, 0.7], logits=[1.5, 2.5], mass=0.42))
    assert answer.x_option_logits == {"b": 2.5, "a": 1.5}
    assert answer.x_allowed_token_mass == 0.42
    # A non-finite logit is never put on the wire; the answer itself stays valid.
    answer = answer_for(question, result(["a", "b"], [0.3, 0.7], logits=[float("-inf"), 2.5]))
    assert answer.x_option_logits is None
    json.dumps(answer.model_dump(mode="json", exclude_none=True), allow_nan=False)


@pytest.mark.parametrize(
    ("ids", "probs"),
    [
        (["a", "b"], [float("nan"), 1.0]),
        (["a", "b"], [-0.1, 1.0]),
        (["a", "b"], [0.0, 0.0]),
        (["a", "b"], [2.0, 0.5]),
        (["a", "c"], [0.5, 0.5]),
        (["a"], [1.0]),
    ],
)
def test_unusable_engine_output_is_an_engine_failure(ids, probs):
    question = parse_question({"type": "choice", "criteria": {"a": None, "b": None}})
    with pytest.raises(EngineFailure):
        answer_for(question, result(ids, probs))
