"""The System One rules over real HTTP against the live gemma server (``python -m semif_adapter serve``)."""

from __future__ import annotations

import gzip
import json
import re

import httpx
import zstandard

from tests.helpers.systemone import CHOICE, NOUL, SCORE, STATE, answers, ask, check_answer, strict_json

ALL = {"billing": NOUL, "tone": CHOICE, "urgency": SCORE}


def detail_locs(response: httpx.Response) -> list[list]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and all({"loc", "msg", "type"} <= set(e) for e in detail)
    assert all(e["loc"][0] == "body" for e in detail)
    return [e["loc"] for e in detail]


def test_every_answer_type_model_and_usage(s1):
    response = ask(s1, ALL)
    assert response.status_code == 200
    body = strict_json(response.content)
    models = [m["name"] for m in s1.get("/v1/models").json()["models"]]
    assert body["model"] == models[0] != "jev-latest"  # the served name, not the alias asked for
    assert list(body["answers"]) == list(ALL)
    for qid, question in ALL.items():
        check_answer(body["answers"][qid], question)
    usage = body["usage"]
    assert usage["output_tokens"] == 0 and isinstance(usage["input_tokens"], int)
    # Shared prefix counted once: three questions cost less than three single-question requests.
    singles = sum(ask(s1, {q: v}).json()["usage"]["input_tokens"] for q, v in ALL.items())
    assert 0 < usage["input_tokens"] < singles


def test_answers_do_not_change_when_questions_are_added_renamed_or_reordered(s1):
    alone = answers(s1, {"tone": CHOICE})["tone"]
    extra = {"type": "noul", "instructions": "Does the customer mention a refund?"}
    crowded = answers(s1, {"x": extra, "tone": CHOICE, "billing": NOUL, "urgency": SCORE})
    renamed = answers(s1, {"urgency": SCORE, "🎭 renamed tone": CHOICE})
    assert crowded["tone"] == alone == renamed["🎭 renamed tone"]  # exact floats, logits included
    assert crowded["urgency"] == renamed["urgency"]


def test_unicode_and_emoji_names_come_back_byte_for_byte(s1):
    names = ["🚀 launch", "日本語", "e\u0301", "é", "Ω≈ç√", " spaced  "]
    question = {"type": "choice", "instructions": "Which label?", "criteria": dict.fromkeys(names)}
    response = ask(s1, {"ü-qid 🔑": question})
    answer = strict_json(response.content)["answers"]["ü-qid 🔑"]
    assert list(answer["probabilities"]) == names
    check_answer(answer, question)
    for name in names:
        assert name.encode("utf-8") in response.content  # raw UTF-8, no normalisation (e + ◌́ stays)


def test_option_and_level_count_bounds(s1):
    two = {"type": "choice", "criteria": {"yes": None, "no": None}}
    many = {
        "type": "choice",
        "instructions": "Pick one.",
        "criteria": {f"option {i}": None for i in range(255)},
    }
    levels2 = {"type": "score", "criteria": ["low", "high"]}
    levels10 = {"type": "score", "criteria": [f"level {i}" for i in range(10)]}
    got = answers(s1, {"two": two, "many": many, "l2": levels2, "l10": levels10})
    for qid, question in {"two": two, "many": many, "l2": levels2, "l10": levels10}.items():
        check_answer(got[qid], question)
    assert len(got["many"]["probabilities"]) == 255
    too_many = {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}
    locs = detail_locs(
        ask(
            s1,
            {
                "one": {"type": "choice", "criteria": {"a": None}},
                "big": too_many,
                "l1": {"type": "score", "criteria": ["x"]},
                "l11": {"type": "score", "criteria": list("abcdefghijk")},
            },
        )
    )
    for qid, kind in [("one", "choice"), ("big", "choice"), ("l1", "score"), ("l11", "score")]:
        assert ["body", "questions", qid, kind, "criteria"] in locs


def test_noul_criteria_variants(s1):
    variants = {
        "none": {"type": "noul", "instructions": "Is this about billing?"},
        "null": {"type": "noul", "instructions": "Is this about billing?", "criteria": None},
        "nulls": {
            "type": "noul",
            "instructions": "Is this about billing?",
            "criteria": {"true": None, "false": None},
        },
        "true_only": {"type": "noul", "criteria": {"true": "about money"}},
        "false_only": {"type": "noul", "instructions": "Billing?", "criteria": {"false": "not about money"}},
        "spelled": {
            "type": "noul",
            "criteria": {"true": "about money", "false": "Anything other than: about money"},
        },
        "bare": {"type": "noul"},
    }
    got = answers(s1, variants)
    for qid, question in variants.items():
        check_answer(got[qid], question)
    assert got["none"] == got["null"] == got["nulls"]
    # The missing side of a one-sided criterion reads as the complement of the given side.
    assert got["true_only"] == got["spelled"]


def test_structured_instructions_and_criteria_read_as_compact_json(s1):
    structured = {
        "type": "score",
        "instructions": {"task": "Rate urgency", "scale": [0, 1, 2]},
        "criteria": [{"level": "low"}, ["medium", None], "high"],
    }
    as_text = {
        "type": "score",
        "instructions": '{"task":"Rate urgency","scale":[0,1,2]}',
        "criteria": ['{"level":"low"}', '["medium",null]', "high"],
    }
    got = answers(s1, {"s": structured, "t": as_text}, state={"ticket": STATE, "plan": "Business"})
    check_answer(got["s"], structured)
    assert got["s"]["legend"] == {"0": {"level": "low"}, "1": ["medium", None], "2": "high"}
    assert got["s"]["probabilities"] == got["t"]["probabilities"]


def test_aliases_models_list_and_unknown_model(s1):
    listing = s1.get("/v1/models")
    assert listing.status_code == 200
    cards = listing.json()["models"]
    names = [card["name"] for card in cards]
    assert names[1:] == ["jev-latest", "jev-preview"]
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", c["release_date"]) and c["description"] for c in cards)
    bodies = [strict_json(ask(s1, {"b": NOUL}, model=name).content) for name in names]
    assert all(body == bodies[0] for body in bodies) and bodies[0]["model"] == names[0]
    assert detail_locs(ask(s1, {"b": NOUL}, model="gpt-4")) == [["body", "model"]]


def test_unknown_fields_are_ignored(s1):
    plain = answers(s1, {"b": NOUL})
    noisy = answers(
        s1, {"b": {**NOUL, "weight": 2, "x_hint": "ignored"}}, temperature=0.2, metadata={"k": [1]}
    )
    assert noisy == plain


def test_any_authorization_header_is_ignored_without_a_key(s1):
    body = {"model": "jev-latest", "state": STATE, "questions": {"b": NOUL}}
    for header in ("Bearer whatever", "Basic Zm9vOmJhcg=="):
        assert s1.post("/v1/systemone", json=body, headers={"Authorization": header}).status_code == 200


def test_gzip_and_zstd_bodies(s1):
    body = json.dumps({"model": "jev-latest", "state": STATE, "questions": ALL}).encode()
    plain = s1.post("/v1/systemone", content=body, headers={"Content-Type": "application/json"}).json()
    for encoding, data in (
        ("gzip", gzip.compress(body)),
        ("zstd", zstandard.ZstdCompressor().compress(body)),
    ):
        response = s1.post(
            "/v1/systemone",
            content=data,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 200 and response.json() == plain
    broken = s1.post("/v1/systemone", content=b"\x1f\x8bnot gzip", headers={"Content-Encoding": "gzip"})
    assert broken.status_code == 400 and broken.json()["detail"]["error_type"] == "invalid_request"
    brotli = s1.post("/v1/systemone", content=body, headers={"Content-Encoding": "br"})
    assert (
        brotli.status_code == 415 and brotli.json()["detail"]["error_type"] == "unsupported_content_encoding"
    )


def test_bad_requests_are_422_with_a_loc_and_leave_the_server_healthy(s1):
    head = b'{"model": "jev-latest", "state": "s", '
    cases = {
        head + b'"questions": {': ["body", len(head) + 14],
        # The shared JSON reader names the raw JSON path of a value it refuses.
        b'{"model": "jev-latest", "state": NaN, "questions": {"a": {"type": "noul"}}}': ["body", "state"],
        head + b'"questions": {"a": {"type": "noul", "instructions": "\\ud800"}}}': [
            *("body", "questions", "a", "instructions")
        ],
        head + b'"questions": {"a": {"type": "box", "instructions": "dog"}}}': [
            "body",
            "questions",
            "a",
            "type",
        ],
        head + b'"assets": {"i": {"type": "image"}}, "questions": {"a": {"type": "noul"}}}': [
            "body",
            "assets",
        ],
        head + b'"questions": {"a": {"instructions": "no type"}}}': ["body", "questions", "a"],
        b"[1, 2]": ["body"],
        b"": ["body", 0],
    }
    for raw, loc in cases.items():
        response = s1.post("/v1/systemone", content=raw, headers={"Content-Type": "application/json"})
        assert loc in detail_locs(response), (raw, response.text)
    assert s1.get("/ping").status_code == 200


def test_over_budget_is_413_never_truncated(s1):
    long_state = "The customer wrote a very long message about many unrelated things. " * 600
    response = ask(s1, {"b": NOUL}, state=long_state)
    assert response.status_code == 413
    assert response.json()["detail"]["error_type"] == "token_budget_exceeded"
    huge = s1.post(
        "/v1/systemone", content=b"x" * (6 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"}
    )
    assert huge.status_code == 413 and huge.json()["detail"]["error_type"] == "payload_too_large"
    assert answers(s1, {"b": NOUL})["b"]["type"] == "noul"  # still serving


def test_invocations_serves_systemone_bodies_identically(s1):
    direct = ask(s1, ALL)
    via_sagemaker = ask(s1, ALL, path="/invocations")
    assert via_sagemaker.status_code == 200 and via_sagemaker.json() == direct.json()
    bad = ask(s1, {"a": {"type": "score", "criteria": ["only one"]}}, path="/invocations")
    assert detail_locs(bad) == [["body", "questions", "a", "score", "criteria"]]
