"""Fuzzing the request schema: no body, however malformed, may produce a 5xx or hurt the server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import engine_settings

from semif_adapter.app import create_app
from semif_adapter.engine import DecisionEngine

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
        for _ in range(500):
            if test_client.get("/ping").status_code == 200:
                break
            import time

            time.sleep(0.02)
        yield test_client


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
    assert client.get("/ping").status_code == 200


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
