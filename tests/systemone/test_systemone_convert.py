"""Question → engine decision: the mapping the model actually reads."""

from __future__ import annotations

import pytest

from semif_adapter.systemone.convert import (
    COMPLEMENT_PREFIX,
    DEFAULT_INSTRUCTIONS,
    decision_for_question,
    parse_question,
    question_to_decision,
)
from semif_adapter.systemone.errors import SystemOneValidationError


def options(decision):
    return [(o.id, o.description) for o in decision.options]


def test_noul_with_both_criteria_reads_them_no_first():
    d = decision_for_question(
        {"type": "noul", "instructions": "Is it spam?", "criteria": {"true": "advert", "false": "legit"}},
        "buy now",
        "q0",
    )
    assert d.type == "noul"
    assert d.question == "Is it spam?"
    assert options(d) == [("no", "legit"), ("yes", "advert")]


@pytest.mark.parametrize(
    ("criteria", "expected"),
    [
        (None, [("no", None), ("yes", None)]),
        ({"true": None, "false": None}, [("no", None), ("yes", None)]),
        ({}, [("no", None), ("yes", None)]),
        ({"true": "advert"}, [("no", COMPLEMENT_PREFIX + "advert"), ("yes", "advert")]),
        ({"true": "advert", "false": None}, [("no", COMPLEMENT_PREFIX + "advert"), ("yes", "advert")]),
        ({"false": "legit"}, [("no", "legit"), ("yes", COMPLEMENT_PREFIX + "legit")]),
        ({"true": "", "false": "legit"}, [("no", "legit"), ("yes", COMPLEMENT_PREFIX + "legit")]),
    ],
)
def test_noul_one_sided_and_missing_criteria(criteria, expected):
    question = {"type": "noul", "instructions": "Spam?"}
    if criteria is not None:
        question["criteria"] = criteria
    d = decision_for_question(question, "s", "q0")
    assert options(d) == expected
    # With no description the engine shows the id: the model reads the words "no" / "yes".
    assert [o.shown_text for o in d.options] == [text or oid for oid, text in expected]


def test_default_instructions_per_type():
    noul = decision_for_question({"type": "noul"}, "The sky is green.", "q0")
    assert noul.question == DEFAULT_INSTRUCTIONS["noul"]
    described = decision_for_question({"type": "noul", "criteria": {"true": "spam"}}, "s", "q0")
    assert described.question == DEFAULT_INSTRUCTIONS["noul_with_criteria"]
    choice = decision_for_question(
        {"type": "choice", "instructions": "  ", "criteria": {"a": None, "b": None}}, "s", "q0"
    )
    assert choice.question == DEFAULT_INSTRUCTIONS["choice"]
    score = decision_for_question(
        {"type": "score", "instructions": None, "criteria": ["lo", "hi"]}, "s", "q0"
    )
    assert score.question == DEFAULT_INSTRUCTIONS["score"]


def test_structured_content_is_compact_json_in_caller_order():
    d = decision_for_question(
        {
            "type": "choice",
            "instructions": {"task": "route", "zeta": [1, 2], "alpha": "é"},
            "criteria": {"x": {"when": "always"}, "y": ["a", None], "z": None, "w": ""},
        },
        {"msg": "hi"},
        "q0",
    )
    assert d.question == '{"task":"route","zeta":[1,2],"alpha":"é"}'
    assert options(d) == [("x", '{"when":"always"}'), ("y", '["a",null]'), ("z", None), ("w", None)]
    assert d.state_text == '{"msg":"hi"}'


def test_choice_keeps_unicode_names_and_order():
    names = ["🚀 launch", "日本語", "e\u0301", "é", " spaced "]
    d = decision_for_question({"type": "choice", "criteria": dict.fromkeys(names)}, "s", "q0")
    assert [o.id for o in d.options] == names  # byte-for-byte, no normalisation (e + ◌́ ≠ é)


def test_score_levels_become_indexed_options():
    d = decision_for_question({"type": "score", "criteria": ["low", {"lvl": "mid"}, ["hi"]]}, "s", "q0")
    assert options(d) == [("0", "low"), ("1", '{"lvl":"mid"}'), ("2", '["hi"]')]


def errors_of(raw):
    loc = ["body", "questions", "q"]
    with pytest.raises(SystemOneValidationError) as info:
        question_to_decision(parse_question(raw, loc), "s", "q0", loc)
    return info.value.errors


@pytest.mark.parametrize(
    ("raw", "loc_tail", "type_"),
    [
        ({"type": "choice", "criteria": {"only": None}}, ["choice", "criteria"], "too_short"),
        (
            {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}},
            ["choice", "criteria"],
            "too_long",
        ),
        ({"type": "choice", "criteria": {"": None, "b": None}}, ["choice", "criteria"], "value_error"),
        ({"type": "choice"}, ["choice", "criteria"], "missing"),
        ({"type": "score", "criteria": ["one"]}, ["score", "criteria"], "too_short"),
        ({"type": "score", "criteria": [str(i) for i in range(11)]}, ["score", "criteria"], "too_long"),
        ({"type": "noul", "instructions": 5}, ["noul", "instructions", "str"], "string_type"),
        ({"type": "box", "instructions": "the dog"}, ["type"], "unsupported_question_type"),
        ({"type": "essay"}, [], "union_tag_invalid"),
        ({"instructions": "x"}, [], "union_tag_not_found"),
    ],
)
def test_invalid_questions_name_the_field(raw, loc_tail, type_):
    errors = errors_of(raw)
    assert any(
        e["type"] == type_ and e["loc"][: 3 + len(loc_tail)] == ["body", "questions", "q", *loc_tail]
        for e in errors
    ), errors


def test_blank_score_level_is_refused_not_shown_as_its_index():
    errors = errors_of({"type": "score", "criteria": ["low", " "]})
    assert errors[0]["loc"] == ["body", "questions", "q", "score", "criteria", 1]


def test_unencodable_text_and_nan_are_422_not_crashes():
    lone = decision_for_question
    with pytest.raises(SystemOneValidationError) as info:
        lone({"type": "choice", "criteria": {"a\ud800": None, "b": None}}, "s", "q0")
    assert info.value.errors[0]["type"] == "string_unicode"
    with pytest.raises(SystemOneValidationError) as info:
        lone({"type": "score", "criteria": [{"x": float("nan")}, "b"]}, "s", "q0")
    assert info.value.errors[0]["loc"] == ["score", "criteria", 0]
