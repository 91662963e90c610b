"""SageMaker container contract, against a live server.

By default the session starts ``python -m semif_adapter serve`` on a model directory laid out like
``/opt/ml/model``. With ``SEMIF_TEST_URL=http://host:port`` the same tests run unchanged against any
running container (``docker run -p 8080:8080 -v $PWD/model:/opt/ml/model IMAGE serve``).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support import LiveServer

STATE = (
    "At 09:12 the checkout page started returning HTTP 500 for every customer. The error rate on "
    "/checkout is 100%, everywhere else 0%. No deploy happened in the last 24 hours."
)
ROUTING = {
    "id": "route",
    "state": STATE,
    "question": "Which team owns this incident?",
    "options": [
        {"id": "billing", "description": "payments, invoices and refunds"},
        {"id": "technical", "description": "api, infrastructure and deploys"},
        {"id": "sales", "description": "contracts and pricing"},
    ],
}
SEVERITY = {
    "id": "severity",
    "state": STATE,
    "question": "How severe is this incident?",
    "options": [{"id": "low"}, {"id": "medium"}, {"id": "high"}],
}


@pytest.fixture(scope="module")
def http(live_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        yield client


def test_ping_goes_from_503_to_200(live_server: LiveServer, http: httpx.Client) -> None:
    history = live_server.ping_history
    assert history[-1] == 200
    assert set(history[:-1]) <= {503}
    if not os.environ.get("SEMIF_TEST_URL"):
        assert history[0] == 503, "a fresh server must answer 503 while it loads"
    assert http.get("/ping").status_code == 200


def test_single_decision(http: httpx.Client) -> None:
    response = http.post("/invocations", json={"decision": ROUTING})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    result = response.json()["result"]
    assert result["id"] == "route"
    assert result["option_ids"] == ["billing", "technical", "sales"]
    assert len(result["probabilities"]) == len(result["option_logits"]) == 3
    assert abs(sum(result["probabilities"]) - 1) < 1e-9
    for key in ("input_tokens", "allowed_token_mass", "prompt_sha256", "prompt_version", "timing", "model"):
        assert key in result


def test_shared_state_decisions(http: httpx.Client) -> None:
    response = http.post("/invocations", json={"decisions": [ROUTING, SEVERITY]})
    assert response.status_code == 200
    body = response.json()
    assert [r["id"] for r in body["results"]] == ["route", "severity"]
    assert body["timing"]["decisions"] == 2
    single = http.post("/invocations", json={"decision": SEVERITY}).json()["result"]
    assert single["probabilities"] == body["results"][1]["probabilities"]


def test_jsonlines_batch_transform(http: httpx.Client) -> None:
    other = {**ROUTING, "id": "other-state", "state": "The VPN drops every ten minutes for one office."}
    lines = [ROUTING, other, SEVERITY]
    response = http.post(
        "/invocations",
        content="".join(json.dumps(line) + "\n" for line in lines),
        headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/jsonlines")
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert [row["id"] for row in rows] == ["route", "other-state", "severity"]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "kind"),
    [
        (
            "POST",
            "/invocations",
            {"content": b"{oops", "headers": {"Content-Type": "application/json"}},
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/invocations",
            {"json": {"decision": {**ROUTING, "options": [{"id": "only"}]}}},
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/invocations",
            {"json": {"decisions": [ROUTING, {**SEVERITY, "state": "different"}]}},
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/invocations",
            {"json": {"decision": {**ROUTING, "state": "token " * 60000}}},
            413,
            "token_budget_exceeded",
        ),
        (
            "POST",
            "/invocations",
            {"content": b"x" * (6 * 1024 * 1024 + 10), "headers": {"Content-Type": "application/json"}},
            413,
            "payload_too_large",
        ),
        (
            "POST",
            "/invocations",
            {"content": b"a,b", "headers": {"Content-Type": "text/csv"}},
            415,
            "unsupported_media_type",
        ),
        ("GET", "/no-such-route", {}, 404, "not_found"),
        ("DELETE", "/invocations", {}, 405, "method_not_allowed"),
    ],
)
def test_error_statuses(
    http: httpx.Client, method: str, path: str, kwargs: dict, status: int, kind: str
) -> None:
    response = http.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == kind and body["error"]
    assert http.get("/ping").status_code == 200


def test_field_errors_name_the_field(http: httpx.Client) -> None:
    response = http.post("/invocations", json={"decision": {**ROUTING, "question": None}})
    assert response.status_code == 400
    assert "decision.question" in response.json()["error"]


def test_burst_gets_only_200s_and_fast_503s(http: httpx.Client, live_server: LiveServer) -> None:
    long_state = STATE + " " + " ".join(f"Log line {i}: request failed with status 500." for i in range(120))
    decision = {**ROUTING, "state": long_state}
    barrier = threading.Barrier(10)

    def call(i: int) -> tuple[int, float, str | None]:
        with httpx.Client(base_url=live_server.url, timeout=120) as client:
            barrier.wait()
            response = client.post("/invocations", json={"decision": {**decision, "id": f"burst-{i}"}})
            return response.status_code, response.elapsed.total_seconds(), response.headers.get("retry-after")

    with ThreadPoolExecutor(max_workers=10) as pool:
        outcomes = list(pool.map(call, range(10)))
    statuses = [status for status, _, _ in outcomes]
    assert set(statuses) <= {200, 503}
    assert 200 in statuses and 503 in statuses
    ok_times = [t for status, t, _ in outcomes if status == 200]
    busy_times = [t for status, t, _ in outcomes if status == 503]
    assert all(retry is not None for status, _, retry in outcomes if status == 503)
    assert max(busy_times) < min(ok_times), "a refused request must not wait for the engine"
    assert http.get("/ping").status_code == 200


def test_ping_answers_while_the_engine_is_busy(http: httpx.Client, live_server: LiveServer) -> None:
    long_state = STATE + " " + " ".join(f"Metric {i} crossed its threshold again." for i in range(300))
    finished = threading.Event()

    def slow() -> int:
        with httpx.Client(base_url=live_server.url, timeout=120) as client:
            status = client.post(
                "/invocations", json={"decision": {**ROUTING, "state": long_state}}
            ).status_code
        finished.set()
        return status

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(slow)
        pings = []
        while not finished.is_set() and len(pings) < 200:
            pings.append(http.get("/ping").status_code)
        assert future.result() == 200
    assert pings and set(pings) == {200}
    assert not finished.is_set() or len(pings) >= 1
