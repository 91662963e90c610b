"""Request parsing, auth and error shapes: the parts that need no model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from semif_adapter.errors import (
    DecisionValidationError,
    EngineFailure,
    ModelBusy,
    NotReady,
    SemifError,
    TokenBudgetExceeded,
)
from semif_adapter.http import auth
from semif_adapter.http.auth import AuthenticationFailed
from semif_adapter.http.body import BodyTooLarge, UnsupportedEncoding
from semif_adapter.settings import Settings
from semif_adapter.systemone import serving as s1
from semif_adapter.systemone.errors import SYSTEMONE_ERRORS, SystemOneValidationError

SETTINGS = Settings(max_decisions=3, model_aliases=["house-model"], retry_after_s=7)


def body(**extra):
    return {
        "model": "served",
        "state": "s",
        "questions": {"a": {"type": "noul"}, "b": {"type": "choice", "criteria": {"x": None, "y": None}}},
        **extra,
    }


def rendered(exc):
    if isinstance(exc, SemifError):
        response = SYSTEMONE_ERRORS.semif_error(exc, SETTINGS.retry_after_s)
    else:  # what the app's last-resort handler answers
        response = SYSTEMONE_ERRORS.internal_error()
    return response.status_code, json.loads(response.body), response.headers


# --- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "", "Bearer anything", "Basic Zm9vOmJhcg==", "garbage"])
def test_no_key_configured_accepts_any_authorization(header):
    auth.check_bearer(header, None)


@pytest.mark.parametrize("header", ["Bearer s3cret", "bearer s3cret", "Bearer  s3cret "])
def test_right_key_passes(header):
    auth.check_bearer(header, "s3cret")


@pytest.mark.parametrize(
    ("header", "word"),
    [
        (None, "missing"),
        ("", "missing"),
        ("Bearer wrong", "invalid"),
        ("Basic s3cret", "invalid"),
        ("s3cret", "invalid"),
        ("Bearer s3cre", "invalid"),
        ("Bearer s3cret\u00e9", "invalid"),
    ],
)
def test_wrong_or_missing_key_is_401(header, word):
    with pytest.raises(AuthenticationFailed) as info:
        auth.check_bearer(header, "s3cret")
    status, payload, headers = rendered(info.value)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert payload["detail"]["error_type"] == "authentication_error"
    assert word in payload["detail"]["message"]


def test_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    auth.check_bearer("Bearer s3cret", "s3cret")
    assert calls == [(b"s3cret", b"s3cret")]


# --- JSON and request parsing ----------------------------------------------------------------------


def test_invalid_json_is_fastapi_style_422():
    with pytest.raises(SystemOneValidationError) as info:
        s1.parse_json_body(b'{"model": "m", ')
    (error,) = info.value.errors
    assert error["type"] == "json_invalid" and error["loc"] == ["body", 15]
    for bad in (b'{"state": NaN}', b"\xff\xfe", b'{"a": Infinity}'):
        with pytest.raises(SystemOneValidationError):
            s1.parse_json_body(bad)


def test_unknown_fields_ignored_and_aliases_from_settings():
    request = s1.parse_request(body(temperature=0.3, metadata={"k": 1}), SETTINGS, "served")
    assert list(request.questions) == ["a", "b"]
    s1.parse_request({**body(), "model": "house-model"}, SETTINGS, "served")
    with pytest.raises(SystemOneValidationError) as info:
        s1.parse_request(
            {**body(), "model": "jev-latest"}, SETTINGS, "served"
        )  # not in this SETTINGS' aliases
    assert info.value.errors[0]["loc"] == ["body", "model"]


@pytest.mark.parametrize(
    ("payload", "loc", "type_"),
    [
        ([1, 2], ["body"], "model_type"),
        ({"state": "s", "questions": {"a": {"type": "noul"}}}, ["body", "model"], "missing"),
        ({"model": "served", "questions": {"a": {"type": "noul"}}}, ["body", "state"], "missing"),
        ({"model": "served", "state": "s", "questions": {}}, ["body", "questions"], "too_short"),
        ({"model": "served", "state": "s", "questions": []}, ["body", "questions"], "dict_type"),
        (
            {"model": "served", "state": 5, "questions": {"a": {"type": "noul"}}},
            ["body", "state", "str"],
            "string_type",
        ),
        (body(assets={"img": {"type": "image"}}), ["body", "assets"], "value_error"),
        ({**body(), "questions": {k: {"type": "noul"} for k in "abcd"}}, ["body", "questions"], "too_long"),
        ({**body(), "state": "bad \ud800"}, ["body", "state"], "string_unicode"),
    ],
)
def test_request_level_422s(payload, loc, type_):
    with pytest.raises(SystemOneValidationError) as info:
        s1.parse_request(payload, SETTINGS, "served")
    assert any(e["loc"] == loc and e["type"] == type_ for e in info.value.errors), info.value.errors


def test_all_bad_questions_are_reported_together_under_their_ids():
    questions = {
        "ok": {"type": "noul"},
        "dog": {"type": "box", "instructions": "the dog"},
        "one": {"type": "score", "criteria": ["only"]},
        "two": {"type": "choice", "criteria": {"x": None}},
        "bad\ud800id": {"type": "noul"},
    }
    # Schema errors first (all of them, as pydantic reports them) ...
    with pytest.raises(SystemOneValidationError) as info:
        s1.parse_request({**body(), "questions": questions}, Settings(), "served")
    assert [e["loc"][2] for e in info.value.errors] == ["one", "two"]
    # ... then what only this API refuses, again every question at once.
    del questions["one"], questions["two"]
    with pytest.raises(SystemOneValidationError) as info:
        s1.build_decisions(s1.parse_request({**body(), "questions": questions}, Settings(), "served"), 255)
    locs = [e["loc"] for e in info.value.errors]
    assert locs == [["body", "questions", "dog", "type"], ["body", "questions", "bad\ud800id"]]


def test_settings_option_limit_applies_before_the_engine():
    payload = {**body(), "questions": {"c": {"type": "choice", "criteria": dict.fromkeys("abcde")}}}
    with pytest.raises(SystemOneValidationError) as info:
        s1.build_decisions(s1.parse_request(payload, SETTINGS, "served"), 4)
    assert info.value.errors[0]["loc"] == ["body", "questions", "c", "choice", "criteria"]


def test_decision_ids_are_positional_and_never_the_question_id():
    built = s1.build_decisions(s1.parse_request(body(), SETTINGS, "served"), 255)
    assert [(qid, d.id) for qid, _, d in built] == [("a", "q0"), ("b", "q1")]


def test_systemone_payload_detection():
    assert s1.is_systemone_payload(body())
    assert not s1.is_systemone_payload({**body(), "decision": {}})
    assert not s1.is_systemone_payload({"decisions": []})
    assert not s1.is_systemone_payload([body()])


# --- engine errors mapped back to the caller's question ------------------------------------------------


@pytest.mark.parametrize(
    ("engine_loc", "expected"),
    [
        (("decisions", 1, "options"), ["body", "questions", "b", "choice", "criteria"]),
        (("decisions", 0, "question"), ["body", "questions", "a", "noul", "instructions"]),
        (("decisions", 1), ["body", "questions", "b"]),
        (("decisions", 0, "state"), ["body", "state"]),
        (("decisions",), ["body", "questions"]),
    ],
)
def test_engine_validation_error_loc_is_translated(engine_loc, expected):
    built = s1.build_decisions(s1.parse_request(body(), SETTINGS, "served"), 255)
    loc, _ = s1._question_loc(DecisionValidationError("too many options", loc=engine_loc), built)
    assert loc == expected


# --- rendering -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "error_type", "retry_after"),
    [
        (TokenBudgetExceeded("too long"), 413, "token_budget_exceeded", None),
        (BodyTooLarge("big"), 413, "payload_too_large", None),
        (UnsupportedEncoding("br"), 415, "unsupported_content_encoding", None),
        (ModelBusy("busy"), 503, "model_busy", "7"),
        (NotReady("loading"), 503, "not_ready", "7"),
        (EngineFailure("nan logits"), 500, "engine_error", None),
        (RuntimeError("bug"), 500, "internal_error", None),
        (ValidationError.from_exception_data("DecisionResult", []), 500, "internal_error", None),
    ],
)
def test_error_shapes(exc, status, error_type, retry_after):
    code, payload, headers = rendered(exc)
    assert code == status
    assert payload["detail"]["error_type"] == error_type and isinstance(payload["detail"]["message"], str)
    assert headers.get("retry-after") == retry_after
    if status == 500 and error_type == "internal_error":
        assert "bug" not in payload["detail"]["message"]  # internals stay in the log


def test_validation_shapes_are_422_lists():
    code, payload, _ = rendered(
        SystemOneValidationError.single(["body", "model"], "unknown", "model_not_found")
    )
    assert code == 422 and payload == {
        "detail": [{"loc": ["body", "model"], "msg": "unknown", "type": "model_not_found"}]
    }
    code, payload, _ = rendered(DecisionValidationError("too many", loc=("questions", "q")))
    assert code == 422 and payload["detail"][0]["loc"] == ["body", "questions", "q"]
