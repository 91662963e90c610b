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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.hostile import (
    DECISION,
    POISONS,
    check_decision_refusal,
    check_every_part_read,
    check_systemone_refusal,
    decision_body,
    encoded_bodies,
    exchange,
    framing_cases,
    jsonlines_body,
    multi_part_jsonlines,
    poisoned_documents,
    request,
    systemone_body,
    systemone_whole_bodies,
    whole_bodies,
)
from tests.helpers.support import LiveServer

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


def test_every_answer_names_its_scoring_version_and_model(http: httpx.Client) -> None:
    """The same scoring version and model sha256 on /ping, every result (single, shared, JSON Lines), the
    System One answer and /metrics; the sha256 is a real hash, never null, in the container too."""
    ping = http.get("/ping").json()
    version, sha256 = ping["scoring_version"], ping["model_sha256"]
    assert version.startswith("sv1-") and len(sha256) == 64 and int(sha256, 16) >= 0
    single = http.post("/invocations", json={"decision": ROUTING}).json()["result"]
    shared = http.post("/invocations", json={"decisions": [ROUTING, SEVERITY]}).json()["results"]
    lines = http.post(
        "/invocations",
        content=json.dumps(SEVERITY) + "\n",
        headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"},
    ).text.splitlines()
    results = [single, *shared, *(json.loads(line) for line in lines)]
    assert {r["scoring_version"] for r in results} == {version}
    assert {r["model"]["sha256"] for r in results} == {sha256}
    assert {r["model"]["scoring"]["version"] for r in results} == {version}
    assert single["model"]["scoring"]["model"] == sha256[:16]
    question = {"type": "noul", "instructions": "Is the charge a duplicate?"}
    answer = http.post(
        "/v1/systemone",
        json={"model": "jev-latest", "state": ROUTING["state"], "questions": {"dup": question}},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["answers"]["dup"]["x_scoring_version"] == version
    metrics = http.get("/metrics").text
    assert "semif_scoring_version{" in metrics and f'version="{version}"' in metrics


def test_the_cpu_kernels_are_reported_and_never_the_amx_buffer_type(http: httpx.Client) -> None:
    """model.kernels names the kernels llama.cpp runs (the scoring version's llama_cpp part carries the
    same variant), the CPU backend's library and the weights' buffer types, which are never AMX by
    default; /metrics says the same."""
    model = http.post("/invocations", json={"decision": ROUTING}).json()["result"]["model"]
    kernels = model["kernels"]
    assert kernels["variant"] and f"-{kernels['variant']}." in model["scoring"]["llama_cpp"]
    assert kernels["features"] and kernels["library"].startswith("libggml-cpu"), kernels
    assert kernels["weight_buffers"] and "AMX" not in kernels["weight_buffers"], kernels
    if model["numerics"] == "invariant":
        assert not kernels["extra_buffers"] and "CPU_REPACK" not in kernels["weight_buffers"]
    lines = [x for x in http.get("/metrics").text.splitlines() if x.startswith("semif_cpu_kernels{")]
    assert len(lines) == 1 and lines[0].endswith(" 1.0"), lines
    for label, value in (("variant", kernels["variant"]), ("features", " ".join(kernels["features"]))):
        assert f'{label}="{value}"' in lines[0], lines


def test_the_numerics_and_the_kv_layout_are_reported(http: httpx.Client) -> None:
    """model.numerics and model.kv_layout say how answers are made invariant; /metrics says the same."""
    model = http.post("/invocations", json={"decision": ROUTING}).json()["result"]["model"]
    assert model["numerics"] in ("invariant", "fixed-split") and model["kv_layout"] in ("streams", "tiled")
    lines = [x for x in http.get("/metrics").text.splitlines() if x.startswith("semif_numerics{")]
    assert len(lines) == 1 and lines[0].endswith(" 1.0"), lines
    for label in ("numerics", "kv_layout"):
        name = "mode" if label == "numerics" else label
        assert f'{name}="{model[label]}"' in lines[0], lines


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
    long_state = STATE + " " + " ".join(f"Metric {i} crossed its threshold again." for i in range(120))
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


# --- hostile input against the real process (cases shared with tests/http/test_fuzz.py) ----------------
#
# What answers each framing case, as seen with uvicorn's h11 parser: conflicting or non-numeric
# Content-Length, bad chunk sizes, headers over h11's 16 KiB incomplete-event limit, header lines
# without a colon or with NUL, and a garbage request line get h11's own plain-text 400 and the
# connection is closed. Transfer-Encoding together with Content-Length is accepted by h11, so the app
# refuses it (semif_adapter/http/framing.py: JSON 400 and Connection: close). 5,000 small headers that
# arrive in one read pass h11 and reach the app, which answers the (deliberately bad) body with a 400.

JSON = {"Content-Type": "application/json"}
JSONL = {"Content-Type": "application/jsonlines"}


@pytest.fixture(scope="module")
def fixed_probabilities(http: httpx.Client) -> list[float]:
    response = http.post("/invocations", json={"decision": DECISION})
    assert response.status_code == 200, response.text
    return response.json()["result"]["probabilities"]


@pytest.mark.parametrize("name", sorted(POISONS))
def test_live_hostile_json_is_4xx_on_every_path(
    http: httpx.Client, fixed_probabilities: list[float], name: str
) -> None:
    poison = POISONS[name]
    response = http.post("/invocations", content=decision_body(poison), headers=JSON)
    check_decision_refusal(response.status_code, response.json(), 400)
    response = http.post("/invocations", content=jsonlines_body(poison), headers=JSONL)
    check_decision_refusal(response.status_code, response.json(), 400)
    assert response.json()["error"].startswith("line 3"), response.json()
    response = http.post("/v1/systemone", content=systemone_body(poison), headers=JSON)
    check_systemone_refusal(response.status_code, response.json())
    assert response.status_code == 422


@pytest.mark.parametrize("name", sorted(whole_bodies()))
def test_live_hostile_decision_bodies_are_4xx(http: httpx.Client, name: str) -> None:
    response = http.post("/invocations", content=whole_bodies()[name], headers=JSON)
    check_decision_refusal(response.status_code, response.json())


@pytest.mark.parametrize("name", sorted(systemone_whole_bodies()))
def test_live_hostile_systemone_bodies_are_422(http: httpx.Client, name: str) -> None:
    response = http.post("/v1/systemone", content=systemone_whole_bodies()[name], headers=JSON)
    check_systemone_refusal(response.status_code, response.json())
    assert response.status_code == 422


@pytest.mark.parametrize("name", sorted(encoded_bodies()))
def test_live_hostile_encodings_are_4xx(http: httpx.Client, name: str) -> None:
    case = encoded_bodies()[name]
    response = http.post(
        "/invocations", content=case.body, headers={**JSON, "Content-Encoding": case.encoding}
    )
    check_decision_refusal(response.status_code, response.json(), case.status)
    assert case.needle in response.json()["error"]


@pytest.mark.parametrize("name", sorted(multi_part_jsonlines()))
def test_live_every_gzip_member_and_zstd_frame_is_read(http: httpx.Client, name: str) -> None:
    check_every_part_read(http, name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=poisoned_documents(), path=st.sampled_from(["decision", "jsonlines", "systemone"]))
def test_live_poison_anywhere_is_4xx(live_server: LiveServer, case: tuple[bytes, str], path: str) -> None:
    document, _ = case
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        if path == "systemone":
            response = client.post("/v1/systemone", content=systemone_body(document), headers=JSON)
            check_systemone_refusal(response.status_code, response.json())
            return
        build, headers = (decision_body, JSON) if path == "decision" else (jsonlines_body, JSONL)
        response = client.post("/invocations", content=build(document), headers=headers)
        check_decision_refusal(response.status_code, response.json(), 400)


@pytest.mark.parametrize("name", sorted(framing_cases()))
def test_live_broken_framing_is_4xx_or_closed(live_server: LiveServer, name: str) -> None:
    answer = exchange(live_server.url, framing_cases()[name], wait_close_s=1)
    assert answer.responses or answer.closed, answer.raw[:300]
    assert all(400 <= status < 500 for status, _ in answer.responses), answer.raw[:300]


def test_live_transfer_encoding_with_content_length_is_refused_and_closed(live_server: LiveServer) -> None:
    answer = exchange(
        live_server.url, framing_cases()["Content-Length and Transfer-Encoding"], wait_close_s=5
    )
    [(status, body)] = answer.responses
    assert status == 400 and "Transfer-Encoding" in json.loads(body)["error"]
    assert answer.closed, "the connection must close after an ambiguously framed request"


def test_live_pipelined_requests_are_answered_in_order(live_server: LiveServer) -> None:
    good = request("POST", "/invocations", json.dumps({"decision": DECISION}).encode())
    bad = request("POST", "/invocations", b'{"decision": {"id": "x", "id": "y"}}')
    ping = request("GET", "/ping")
    answer = exchange(live_server.url, bad + ping + good + bad, expect=4, timeout=120)
    assert [status for status, _ in answer.responses] == [400, 200, 200, 400]
    assert "duplicate key 'id'" in json.loads(answer.responses[0][1])["error"]
    assert json.loads(answer.responses[2][1])["result"]["id"] == "fixed"


def test_live_body_that_stops_halfway(live_server: LiveServer) -> None:
    body = json.dumps({"decision": DECISION}).encode()
    half = request("POST", "/invocations", body)[: -len(body) // 2]
    gave_up = exchange(live_server.url, half, shutdown_write=True, wait_close_s=5)
    assert gave_up.closed and all(400 <= status < 500 for status, _ in gave_up.responses)
    # A client that stalls: 408 once SEMIF_BODY_TIMEOUT_S (10 s by default) has passed.
    stalled = exchange(live_server.url, half, timeout=90)
    [(status, answer)] = stalled.responses
    assert status == 408 and json.loads(answer)["type"] == "request_timeout"


def test_live_same_answer_after_hostile_input(
    http: httpx.Client, live_server: LiveServer, fixed_probabilities: list[float]
) -> None:
    assert http.get("/ping").status_code == 200
    response = http.post("/invocations", json={"decision": DECISION})
    assert response.json()["result"]["probabilities"] == fixed_probabilities
    if live_server.process is not None:  # our own process: nothing above may have logged an error
        errors = [line for line in live_server.log_text().splitlines() if '"level": "error"' in line]
        assert not errors, errors[:3]
