"""Fuzzing and hostile input, in-process: no body, however malformed, may produce a 5xx or hurt the server.

The hostile cases (tests/helpers/hostile.py) also feed the live-server suite (tests/contract), which adds
what only a real socket can send: broken HTTP framing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semif_adapter.app import create_app
from semif_adapter.decisions.json_body import numbered_lines
from semif_adapter.engine import DecisionEngine
from semif_adapter.http.error_handlers import renderer_for
from semif_adapter.http.framing import AmbiguousFramingGuard
from tests.helpers.hostile import (
    DECISION,
    POISONS,
    check_decision_refusal,
    check_every_part_read,
    check_systemone_refusal,
    decision_body,
    encoded_bodies,
    jsonlines_body,
    multi_part_jsonlines,
    poisoned_documents,
    systemone_body,
    systemone_whole_bodies,
    whole_bodies,
)
from tests.helpers.support import engine_settings

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
surrogates = st.text(
    alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3
)
texts = st.one_of(
    st.text(max_size=40), surrogates, st.sampled_from(["", " ", "<|im_start|>", "<bos>", "\x00", "é😀"])
)
options = st.lists(
    st.fixed_dictionaries(
        {"id": st.one_of(texts, json_values)},
        optional={"description": st.one_of(texts, st.none(), json_values)},
    ),
    max_size=5,
)
decision_like = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(texts, json_values),
        "state": st.one_of(texts, json_values),
        "question": st.one_of(texts, json_values),
        "options": st.one_of(options, json_values),
        "type": st.one_of(st.sampled_from(["choice", "noul", "score", "other"]), json_values),
    },
)
requests = st.one_of(
    json_values,
    st.builds(lambda d: {"decision": d}, decision_like),
    st.builds(lambda ds: {"decisions": ds}, st.lists(decision_like, max_size=3)),
    st.builds(lambda d: {"decision": d, "decisions": [d]}, decision_like),
)


@pytest.fixture(scope="module")
def client(gemma_gguf: Path) -> Iterator[TestClient]:
    config = engine_settings(n_ctx=1024)
    with TestClient(create_app(config, lambda: DecisionEngine.load(config, gemma_gguf))) as test_client:
        deadline = time.monotonic() + 180  # a loaded machine can take a while; never fuzz a loading app
        while test_client.get("/ping").status_code != 200:
            assert time.monotonic() < deadline, "app did not become ready"
            time.sleep(0.05)
        yield test_client


JSON = {"Content-Type": "application/json"}
JSONL = {"Content-Type": "application/jsonlines"}


@pytest.fixture(scope="module")
def baseline(client: TestClient) -> list[float]:
    """The fixed decision's probabilities before any hostile input."""
    response = client.post("/invocations", json={"decision": DECISION})
    assert response.status_code == 200, response.text
    return response.json()["result"]["probabilities"]


def _check(response) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        body = response.json()
        assert set(body) >= {"error", "type"} or "detail" in body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=requests)
def test_json_bodies_never_cause_5xx(client: TestClient, payload: object) -> None:
    _check(
        client.post("/invocations", content=json.dumps(payload), headers={"Content-Type": "application/json"})
    )


@settings(max_examples=60, deadline=None)
@given(
    body=st.binary(max_size=200),
    content_type=st.sampled_from(
        ["application/json", "application/jsonlines", "text/plain", "", "application/json; charset=latin-1"]
    ),
    encoding=st.sampled_from([None, "gzip", "zstd", "identity", "deflate"]),
)
def test_raw_bodies_never_cause_5xx(
    client: TestClient, body: bytes, content_type: str, encoding: str | None
) -> None:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    _check(client.post("/invocations", content=body, headers=headers))


def test_server_is_healthy_after_fuzzing(client: TestClient) -> None:
    ping = client.get("/ping")
    assert ping.status_code == 200, ping.text


@pytest.mark.parametrize("field", ["state", "question", "option"])
def test_lone_surrogates_are_a_400(client: TestClient, field: str) -> None:
    decision = {"id": "s", "state": "ok", "question": "ok?", "options": [{"id": "a"}, {"id": "b"}]}
    if field == "option":
        decision["options"] = [{"id": "a", "description": "\ud800"}, {"id": "b"}]
    else:
        decision[field] = "bad \udc00 text"
    body = json.dumps({"decision": decision})  # json escapes the surrogate as \udc00
    response = client.post("/invocations", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "surrogate" in error or "unable to parse raw data as a unicode string" in error
    assert client.get("/ping").status_code == 200


@pytest.mark.parametrize("name", sorted(POISONS))
def test_a_poisoned_state_is_refused_on_every_path(
    client: TestClient, baseline: list[float], name: str
) -> None:
    poison = POISONS[name]
    response = client.post("/invocations", content=decision_body(poison), headers=JSON)
    check_decision_refusal(response.status_code, response.json(), 400)
    error = response.json()["error"]
    assert error.startswith(("decision.state", "line 1 column ")), error
    response = client.post("/invocations", content=jsonlines_body(poison), headers=JSONL)
    check_decision_refusal(response.status_code, response.json(), 400)
    assert response.json()["error"].startswith(("line 3.state", "line 3 column ")), response.json()
    response = client.post("/v1/systemone", content=systemone_body(poison), headers=JSON)
    check_systemone_refusal(response.status_code, response.json())
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert item["type"] == "json_invalid" and (item["loc"][:2] == ["body", "state"] or len(item["loc"]) == 2)


def test_duplicate_keys_name_the_key_and_its_place(client: TestClient) -> None:
    body = decision_body(b'"s"').replace(b'"id": "hostile"', b'"id": "a", "id": "b"')
    response = client.post("/invocations", content=body, headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"] == "decision: duplicate key 'id' in one object"
    response = client.post("/v1/systemone", content=systemone_body(b'{"x": 1, "x": 2}'), headers=JSON)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "state"]
    assert "duplicate key 'x'" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("name", sorted(whole_bodies()))
def test_hostile_decision_bodies_are_4xx(client: TestClient, name: str) -> None:
    response = client.post("/invocations", content=whole_bodies()[name], headers=JSON)
    check_decision_refusal(response.status_code, response.json())


@pytest.mark.parametrize("name", sorted(systemone_whole_bodies()))
def test_hostile_systemone_bodies_are_422(client: TestClient, name: str) -> None:
    response = client.post("/v1/systemone", content=systemone_whole_bodies()[name], headers=JSON)
    check_systemone_refusal(response.status_code, response.json())
    assert response.status_code == 422


@pytest.mark.parametrize("name", sorted(encoded_bodies()))
def test_hostile_encodings_get_their_4xx_on_both_apis(client: TestClient, name: str) -> None:
    case = encoded_bodies()[name]
    headers = {**JSON, "Content-Encoding": case.encoding}
    response = client.post("/invocations", content=case.body, headers=headers)
    check_decision_refusal(response.status_code, response.json(), case.status)
    assert case.needle in response.json()["error"]
    response = client.post("/v1/systemone", content=case.body, headers=headers)
    check_systemone_refusal(response.status_code, response.json())
    assert response.status_code == (422 if case.status == 400 and "deep" in name else case.status)


@pytest.mark.parametrize("name", sorted(multi_part_jsonlines()))
def test_every_gzip_member_and_zstd_frame_is_read(client: TestClient, name: str) -> None:
    check_every_part_read(client, name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=poisoned_documents(), path=st.sampled_from(["decision", "jsonlines", "systemone"]))
def test_poison_anywhere_in_a_state_is_a_4xx(client: TestClient, case: tuple[bytes, str], path: str) -> None:
    document, _ = case
    if path == "systemone":
        response = client.post("/v1/systemone", content=systemone_body(document), headers=JSON)
        check_systemone_refusal(response.status_code, response.json())
        return
    build, headers = (decision_body, JSON) if path == "decision" else (jsonlines_body, JSONL)
    response = client.post("/invocations", content=build(document), headers=headers)
    check_decision_refusal(response.status_code, response.json(), 400)


def test_same_answer_after_hostile_input(client: TestClient, baseline: list[float]) -> None:
    assert client.get("/ping").status_code == 200
    response = client.post("/invocations", json={"decision": DECISION})
    assert response.json()["result"]["probabilities"] == baseline


def test_framing_guard_answers_in_each_paths_shape_and_passes_the_rest() -> None:
    reached: list[str] = []

    async def inner(scope: dict, receive: object, send: object) -> None:
        reached.append(scope["path"])

    async def call(path: str, headers: list[tuple[bytes, bytes]]) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
        await AmbiguousFramingGuard(inner, renderer_for)(scope, None, send)  # type: ignore[arg-type]
        return sent

    both = [(b"transfer-encoding", b"chunked"), (b"Content-Length", b"4")]
    for path, shape in (("/invocations", "error"), ("/v1/systemone", "detail")):
        start, body = asyncio.run(call(path, both))
        assert start["status"] == 400 and (b"connection", b"close") in start["headers"]
        assert shape in json.loads(body["body"])
    assert not reached
    asyncio.run(call("/invocations", [(b"content-length", b"4")]))
    assert reached == ["/invocations"]


@settings(max_examples=300, deadline=None)
@given(
    body=st.lists(st.sampled_from([b"a", b"{}", b" ", b"\t", b"\n", b"\r", b"\r\n"]), max_size=30).map(
        b"".join
    )
)
def test_jsonlines_are_numbered_as_splitlines_numbers_them(body: bytes) -> None:
    expected = [(number, line) for number, line in enumerate(body.splitlines(), start=1) if line.strip()]
    assert list(numbered_lines(body)) == expected


def test_many_or_blank_jsonlines_are_refused_before_parsing(client: TestClient) -> None:
    response = client.post("/invocations", content=b"{}\n" * 1_000_000, headers=JSONL)
    assert response.status_code == 400 and "more than 64 lines" in response.json()["error"]
    for blank in (b"\n" * 6_000_000, b"\r\n \t" * 1_000_000):
        response = client.post("/invocations", content=blank, headers=JSONL)
        assert response.status_code == 400 and response.json()["error"] == "jsonlines body has no decisions"
