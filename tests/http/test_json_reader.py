"""The shared JSON reader on its own: every limit, where it reports a violation, and what it still accepts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from semif_adapter.http.json_reader import INT_MAX, INT_MIN, JsonError, read_json
from tests.helpers.hostile import POISONS, clean_documents, decision_body, poisoned_documents

# Where each poison is reported inside decision_body(): a path for values that parsed, else a position.
BY_PATH = {
    "nesting over the limit": ("decision", "state", *[0] * 62),
    "nesting in objects": ("decision", "state", *["a"] * 62),
    "5000-digit integer": ("decision", "state"),
    "integer over 64 bits": ("decision", "state"),
    "negative integer under 64 bits": ("decision", "state"),
    "float overflow": ("decision", "state"),
    "NaN": ("decision", "state"),
    "Infinity": ("decision", "state", 1),
    "-Infinity": ("decision", "state", "x"),
    "duplicate key": ("decision", "state"),
    "duplicate key nested": ("decision", "state", 0, "k", 0),
    "lone high surrogate": ("decision", "state"),
    "lone low surrogate": ("decision", "state"),
    "lone surrogate in a key": ("decision", "state"),
    "escaped NUL": ("decision", "state"),
    "escaped NUL in a key": ("decision", "state"),
}
STATE_COLUMN = decision_body(b"X").index(b"X") + 1
# Poisons that stop the parse: the offset, inside the poison, of the column reported.
BY_POSITION = {
    "nesting 100k": 62,  # the 65th opening bracket: 2 levels outside the state, the 63rd inside
    "surrogate as UTF-8 bytes": 1,
    "invalid UTF-8": 1,
    "overlong UTF-8": 1,
    "truncated UTF-8": 1,
    "raw NUL": 2,
    "broken string": 10,  # the string ends at the next quote; the parse fails just after it
}
MESSAGES = {  # the first key found in a poison's name says what its message must hold
    "UTF-8": "not valid UTF-8",
    "nesting": "nested deeper than 64 levels",
    "integer": "outside the 64-bit range",
    "float overflow": "too large for a double",
    "NaN": "NaN is not JSON",
    "Infinity": "Infinity is not JSON",
    "duplicate key": "duplicate key",
    "surrogate": "surrogate",
    "raw NUL": "malformed JSON",
    "escaped NUL": "NUL character",
    "broken": "malformed JSON",
}


def test_every_poison_has_an_expected_location() -> None:
    assert set(BY_PATH) | set(BY_POSITION) == set(POISONS)


@pytest.mark.parametrize("name", sorted(POISONS))
def test_each_limit_is_refused_where_it_is_broken(name: str) -> None:
    with pytest.raises(JsonError) as info:
        read_json(decision_body(POISONS[name]))
    error = info.value
    if name in BY_PATH:
        assert error.path == BY_PATH[name] and error.line is None
    else:
        assert (error.line, error.column) == (1, STATE_COLUMN + BY_POSITION[name]) and error.path == ()
    needle = next(text for key, text in MESSAGES.items() if key in name)
    assert needle in error.message, error.message


def test_duplicate_key_names_the_key_and_a_long_key_is_cut() -> None:
    with pytest.raises(JsonError) as info:
        read_json(b'{"decision": {"id": "a", "id": "b"}}')
    assert info.value.path == ("decision",) and "'id'" in info.value.message
    long_key = "k" * 100_000
    with pytest.raises(JsonError) as info:
        read_json(json.dumps({long_key: {"x": 1}}).replace('"x": 1', '"x": 1, "x": 2').encode())
    assert len(str(info.value)) < 200 and info.value.path == ("k" * 40 + "…",)


def test_depth_limit_is_exact_and_configurable() -> None:
    assert read_json(b"[" * 64 + b"]" * 64) == read_json(b"[" * 64 + b"]" * 64)
    with pytest.raises(JsonError, match="deeper than 64"):
        read_json(b"[" * 65 + b"]" * 65)
    assert read_json(b'{"a": {"b": 1}}', max_depth=2) == {"a": {"b": 1}}
    with pytest.raises(JsonError, match="deeper than 2") as info:
        read_json(b'{"a": {"b": [1]}}', max_depth=2)
    assert info.value.path == ("a", "b")
    # Brackets inside strings do not count.
    assert read_json(json.dumps(["[" * 500, "{" * 500]).encode()) == ["[" * 500, "{" * 500]


def test_number_range_edges() -> None:
    assert read_json(f"[{INT_MIN}, {INT_MAX}, 1e308, -1e308, 1e-400]".encode()) == [
        INT_MIN,
        INT_MAX,
        1e308,
        -1e308,
        0.0,
    ]
    for literal in (str(INT_MIN - 1), str(INT_MAX + 1), "2e308", "-1E+309"):
        with pytest.raises(JsonError) as info:
            read_json(f"[{literal}]".encode())
        assert info.value.path == (0,)


def test_encoding_rules() -> None:
    assert read_json(b'\xef\xbb\xbf{"a": "\xc3\xa9\\ud83d\\ude00"}') == {"a": "é😀"}
    assert read_json(b'"\\\\u0000"') == "\\u0000"  # an escaped backslash, not a NUL
    with pytest.raises(JsonError, match="byte 8") as info:  # counted from the start, BOM included
        read_json(b'\xef\xbb\xbf[1,\n"\xff"]')
    assert (info.value.line, info.value.column) == (2, 2)
    with pytest.raises(JsonError, match="UTF-8 BOM"):
        read_json(b"\xef\xbb\xbf\xef\xbb\xbf[]")
    with pytest.raises(JsonError, match="not valid UTF-8") as info:
        read_json('{"a": "é"}'.encode("utf-16-le"))
    assert info.value.pos == 14
    with pytest.raises(JsonError, match="malformed JSON"):  # ASCII as UTF-16: NUL bytes between
        read_json('{"a": 1}'.encode("utf-16-le"))


def test_error_text_names_its_location() -> None:
    with pytest.raises(JsonError) as info:
        read_json(b'{"a": [1, NaN]}')
    assert str(info.value) == "a.1: NaN is not JSON (numbers must be finite)"
    with pytest.raises(JsonError) as info:
        read_json(b'{\n  "a": tru}')
    assert str(info.value).startswith("line 2 column 8: malformed JSON")


@settings(max_examples=150, deadline=None)
@given(document=clean_documents)
def test_clean_documents_read_as_the_standard_parser_reads_them(document: bytes) -> None:
    assert read_json(document) == json.loads(document)


@settings(max_examples=150, deadline=None)
@given(case=poisoned_documents())
def test_a_poison_anywhere_is_refused(case: tuple[bytes, str]) -> None:
    document, name = case
    with pytest.raises(JsonError) as info:
        read_json(document)
    assert next(text for key, text in MESSAGES.items() if key in name) in info.value.message
