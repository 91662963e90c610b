"""Deadlines, disconnects and refusals through a real server (``python -m semif_adapter serve``, gemma).

The issue's scenario, scaled down: a valid request of ~63,000 tokens (it would hold the engine for about
two minutes on two cores) with a 6 s deadline must stop with ``deadline_exceeded`` after a fraction of
its tokens, and the next caller is served at once with unchanged answers. Tests in this module run in
order on one server: the throughput measure starts cold and is warm by the refusal test.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from semif_adapter.request_scope import InvalidTimeout, requested_limit
from tests.helpers.support import LiveServer

DECISION = {
    "id": "route",
    "state": "A customer was charged twice for the same seat this month.",
    "question": "Which queue should own this ticket?",
    "options": [{"id": "billing", "description": "charges and refunds"}, {"id": "technical"}],
}
SYSTEMONE_QUESTION = {"type": "noul", "instructions": "Is this about billing?"}


def _big(
    n_decisions: int, state: str = "An inventory of every open item in the warehouse."
) -> dict[str, Any]:
    """The issue's shape: decisions with 255 options each (~3,000 tokens), all about one state."""
    return {
        "decisions": [
            {
                "id": f"d{k}",
                "state": state,
                "question": f"Which option fits item {k} best?",
                "options": [{"id": f"o{j}", "description": f"bin {j} in aisle {j % 12}"} for j in range(255)],
            }
            for k in range(n_decisions)
        ]
    }


def _metric(server: LiveServer, name: str, labels: str = "") -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def server(server_factory: Any, gemma_gguf: Path) -> Iterator[LiveServer]:
    yield server_factory(None, {"SEMIF_GGUF_PATH": str(gemma_gguf)})


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as http_client:
        yield http_client


def test_timeout_header_parsing() -> None:
    assert requested_limit({}, 55.0) == 55.0
    assert requested_limit({}, 0.0) is None
    assert requested_limit({"x-semif-timeout-s": "2.5"}, 55.0) == 2.5
    assert requested_limit({"x-semif-timeout-s": "90"}, 55.0) == 55.0  # shortens, never extends
    assert requested_limit({"x-semif-timeout-s": "90"}, 0.0) == 90.0
    assert requested_limit({"x-amzn-sagemaker-custom-attributes": "trace=1; timeout_s=3"}, 55.0) == 3.0
    for bad in ("soon", "0", "-1", "nan", "inf"):
        with pytest.raises(InvalidTimeout):
            requested_limit({"x-semif-timeout-s": bad}, 55.0)


def test_big_request_stops_at_its_deadline_and_the_next_caller_is_served_unchanged(
    server: LiveServer, client: httpx.Client
) -> None:
    before = client.post("/invocations", json={"decision": DECISION})
    assert before.status_code == 200, before.text
    started = time.monotonic()
    response = client.post("/invocations", json=_big(21), headers={"X-Semif-Timeout-S": "6"})
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    body = response.json()
    assert body["type"] == "deadline_exceeded" and "retryable" not in body
    assert body["limit_s"] == 6
    assert 50_000 < body["tokens_needed"] <= 65_536  # the size, under SEMIF_MAX_REQUEST_TOKENS
    assert 0 < body["tokens_done"] < body["tokens_needed"] / 4  # aborted, not run to completion
    assert f"{body['tokens_done']} of {body['tokens_needed']} tokens" in body["error"]
    # the full request takes ~2 minutes here; the abort lands within the deadline plus one decode call
    assert elapsed < 6 + 10.0, elapsed
    after = client.post("/invocations", json={"decision": DECISION})  # no 503: the engine is free
    assert after.status_code == 200, after.text
    assert after.json()["result"]["probabilities"] == before.json()["result"]["probabilities"]
    assert after.json()["result"]["option_logits"] == before.json()["result"]["option_logits"]
    assert _metric(server, "semif_deadline_exceeded_total", '{stage="aborted"}') == 1.0
    assert _metric(server, "semif_requests_total", '{route="/invocations",status="504"}') == 1.0
    # an abort that was asked for is not an engine error: nothing is logged at error level
    assert not [line for line in server.log_text().splitlines() if '"level": "error"' in line]


def test_systemone_keeps_its_detail_shape(client: httpx.Client) -> None:
    questions = {
        f"q{k}": {**SYSTEMONE_QUESTION, "instructions": f"Is item {k} about billing? " * 40} for k in range(8)
    }
    state = "Ledger lines: " + " ".join(f"line {i} charged {i * 7} euros." for i in range(250))
    response = client.post(
        "/v1/systemone",
        json={"model": "jev-latest", "state": state, "questions": questions},
        headers={"X-Semif-Timeout-S": "0.2"},
    )
    assert response.status_code == 504, response.text
    detail = response.json()["detail"]
    assert detail["error_type"] == "deadline_exceeded"
    assert detail["limit_s"] == 0.2 and detail["tokens_done"] < detail["tokens_needed"]
    assert "deadline" in detail["message"]


def test_invalid_timeout_header_is_the_callers_mistake(client: httpx.Client) -> None:
    bad = {"X-Semif-Timeout-S": "soon"}
    response = client.post("/invocations", json={"decision": DECISION}, headers=bad)
    assert response.status_code == 400
    assert response.json()["type"] == "invalid_request" and "x-semif-timeout-s" in response.json()["error"]
    s1 = client.post(
        "/v1/systemone",
        json={"model": "jev-latest", "state": "s", "questions": {"a": SYSTEMONE_QUESTION}},
        headers=bad,
    )
    assert s1.status_code == 422
    assert s1.json()["detail"][0]["loc"] == ["header", "x-semif-timeout-s"]
    assert client.get("/ping").status_code == 200


def test_disconnect_aborts_the_engine_and_frees_the_slot(server: LiveServer, client: httpx.Client) -> None:
    aborted_before = _metric(server, "semif_client_disconnects_total")
    body = json.dumps(_big(2, state="Stock levels of every shelf in the second warehouse.")).encode()
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
    time.sleep(1.0)  # the engine is working on ~6,000 tokens (several seconds here)
    connection.close()  # the caller leaves without reading the answer
    until = time.monotonic() + 60
    while time.monotonic() < until:
        if _metric(server, "semif_client_disconnects_total") > aborted_before:
            break
        time.sleep(0.1)
    assert _metric(server, "semif_client_disconnects_total") == aborted_before + 1
    assert _metric(server, "semif_requests_total", '{route="/invocations",status="499"}') >= 1.0
    # the slot is released only once the engine is idle, and then the next caller gets in at once
    assert _metric(server, "semif_engine_admitted") == 0.0
    assert client.post("/invocations", json={"decision": DECISION}).status_code == 200


def test_refuses_at_once_what_cannot_finish(server: LiveServer, client: httpx.Client) -> None:
    for k in range(10):  # requests big enough to count, until the throughput is measured
        if _metric(server, "semif_decode_tokens_per_second") > 0:
            break
        warm = client.post("/invocations", json=_big(1, state=f"Warm-up inventory number {k}."))
        assert warm.status_code == 200, warm.text
    rate = _metric(server, "semif_decode_tokens_per_second")
    assert rate > 0
    refused_before = _metric(server, "semif_deadline_exceeded_total", '{stage="refused"}')
    response = client.post("/invocations", json=_big(21), headers={"X-Semif-Timeout-S": "2"})
    assert response.status_code == 504, response.text
    body = response.json()
    assert body["type"] == "deadline_exceeded" and body["tokens_done"] == 0
    assert "refused before decoding" in body["error"] and "tokens/s" in body["error"]
    assert _metric(server, "semif_deadline_exceeded_total", '{stage="refused"}') == refused_before + 1
    assert client.post("/invocations", json={"decision": DECISION}).status_code == 200


def test_requests_waiting_together_keep_their_own_deadlines_and_answers(
    server: LiveServer, client: httpx.Client
) -> None:
    """A request past its deadline in a batch with two others (they queue behind one that holds the
    engine): it alone gets the 504; the others answer bit for bit as they did alone."""
    small = [
        {"decision": {**DECISION, "id": f"s{i}", "question": q}}
        for i, q in enumerate(
            ["Which queue should own this ticket?", "Who should reply to the customer first?"]
        )
    ]
    before = [client.post("/invocations", json=body).json()["result"] for body in small]
    holder = {"decision": {**DECISION, "id": "holder", "state": "A long support transcript. " * 300}}
    batches_before = _metric(server, "semif_batch_requests_count")
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(client.post, "/invocations", json=holder)
        until = time.monotonic() + 30
        while _metric(server, "semif_engine_admitted") < 1 and time.monotonic() < until:
            time.sleep(0.02)
        late = pool.submit(
            client.post,
            "/invocations",
            json=_big(21, state="A third warehouse."),
            headers={"X-Semif-Timeout-S": "4"},
        )
        answers = [pool.submit(client.post, "/invocations", json=body) for body in small]
        assert first.result(120).status_code == 200
        response = late.result(120)
        got = [a.result(120) for a in answers]
    assert response.status_code == 504 and response.json()["type"] == "deadline_exceeded", response.text
    for reply, alone in zip(got, before, strict=True):
        assert reply.status_code == 200, reply.text
        result = reply.json()["result"]
        assert (result["probabilities"], result["option_logits"]) == (
            alone["probabilities"],
            alone["option_logits"],
        )
    # the holder ran alone and the three that waited behind it went to the engine in fewer batches
    assert _metric(server, "semif_batch_requests_count") - batches_before < 1 + 3
