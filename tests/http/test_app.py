"""In-process HTTP tests: the FastAPI app around the real gemma engine, plus fakes for busy/failure states."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from semif_adapter.app import create_app
from semif_adapter.engine import DecisionEngine
from semif_adapter.errors import EngineFailure, ModelLoadError
from semif_adapter.protocol import BatchResult, Decision
from tests.helpers.support import engine_settings, fake_model_info, stand_in_batch

DECISION = {
    "id": "route",
    "state": "A customer was charged twice for the same seat this month.",
    "question": "Which queue should own this ticket?",
    "options": [{"id": "billing", "description": "charges and refunds"}, {"id": "technical"}],
}


@pytest.fixture(scope="module")
def client(gemma_gguf: Path) -> Iterator[TestClient]:
    settings = engine_settings()
    app = create_app(settings, lambda: DecisionEngine.load(settings, gemma_gguf))
    with TestClient(app) as test_client:
        _wait_ready(test_client)
        yield test_client


def _wait_ready(client: TestClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/ping").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("app did not become ready")


def test_single_and_shared(client: TestClient) -> None:
    single = client.post("/invocations", json={"decision": DECISION})
    assert single.status_code == 200, single.text
    result = single.json()["result"]
    assert result["option_ids"] == ["billing", "technical"]
    assert abs(sum(result["probabilities"]) - 1) < 1e-9
    other = {
        **DECISION,
        "id": "urgent",
        "question": "Is it urgent?",
        "options": [{"id": "yes"}, {"id": "no"}],
    }
    shared = client.post("/invocations", json={"decisions": [DECISION, other]})
    assert shared.status_code == 200
    body = shared.json()
    assert [r["id"] for r in body["results"]] == ["route", "urgent"]
    assert body["results"][0]["probabilities"] == result["probabilities"]
    assert body["timing"]["decisions"] == 2


def test_request_id_is_echoed_or_generated(client: TestClient) -> None:
    echoed = client.post("/invocations", json={"decision": DECISION}, headers={"X-Amzn-RequestId": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    generated = client.get("/nope")
    assert len(generated.headers["x-request-id"]) == 32


@pytest.mark.parametrize(
    ("body", "status", "kind", "needle"),
    [
        (b"{not json", 400, "invalid_request", "malformed JSON"),
        (b"[]", 400, "invalid_request", "valid dictionary"),
        (
            json.dumps({"decision": {**DECISION, "question": ""}}).encode(),
            400,
            "invalid_request",
            "decision.question",
        ),
        (
            json.dumps({"decision": {k: v for k, v in DECISION.items() if k != "state"}}).encode(),
            400,
            "invalid_request",
            "decision.state",
        ),
        (
            json.dumps({"decision": DECISION, "decisions": [DECISION]}).encode(),
            400,
            "invalid_request",
            "exactly one",
        ),
        (json.dumps({"decisions": []}).encode(), 400, "invalid_request", "decisions"),
        (
            json.dumps({"decision": {**DECISION, "options": [{"id": "a"}, {"id": "a"}]}}).encode(),
            400,
            "invalid_request",
            "duplicate option id",
        ),
        (
            json.dumps({"decisions": [DECISION, DECISION]}).encode(),
            400,
            "invalid_request",
            "duplicate decision id",
        ),
        (
            json.dumps({"decisions": [DECISION, {**DECISION, "id": "b", "state": "other"}]}).encode(),
            400,
            "invalid_request",
            "decisions.1.state",
        ),
        (
            json.dumps({"decision": {**DECISION, "state": "word " * 9000}}).encode(),
            413,
            "token_budget_exceeded",
            "context holds",
        ),
    ],
)
def test_invalid_requests_get_clear_4xx(
    client: TestClient, body: bytes, status: int, kind: str, needle: str
) -> None:
    response = client.post("/invocations", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    payload = response.json()
    assert payload["type"] == kind
    assert needle in payload["error"]
    assert client.get("/ping").status_code == 200


def test_too_many_options_and_decisions(client: TestClient) -> None:
    many = {**DECISION, "options": [{"id": str(i)} for i in range(256)]}
    response = client.post("/invocations", json={"decision": many})
    assert response.status_code == 400 and "255" in response.json()["error"]
    decisions = [{**DECISION, "id": str(i)} for i in range(65)]
    response = client.post("/invocations", json={"decisions": decisions})
    assert response.status_code == 400 and "64" in response.json()["error"]


def test_body_limits_and_encodings(client: TestClient) -> None:
    import gzip

    import zstandard

    raw = json.dumps({"decision": DECISION}).encode()
    for encoding, data in (("gzip", gzip.compress(raw)), ("zstd", zstandard.ZstdCompressor().compress(raw))):
        response = client.post(
            "/invocations",
            content=data,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 200, (encoding, response.text)
    bomb = gzip.compress(b" " * (7 * 1024 * 1024))
    response = client.post(
        "/invocations", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert response.status_code == 413
    response = client.post(
        "/invocations", content=b"x" * (6 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413 and response.json()["type"] == "payload_too_large"
    response = client.post(
        "/invocations", content=raw, headers={"Content-Type": "application/json", "Content-Encoding": "br"}
    )
    assert response.status_code == 415
    for generic in ("application/octet-stream", ""):
        response = client.post("/invocations", content=raw, headers={"Content-Type": generic})
        assert response.status_code == 200, (generic, response.text)
    response = client.post("/invocations", content=raw, headers={"Content-Type": "text/csv"})
    assert response.status_code == 415 and response.json()["type"] == "unsupported_media_type"


def test_jsonlines_keeps_order_and_matches_single_scoring(client: TestClient) -> None:
    lines = [
        {**DECISION, "id": "a"},
        {**DECISION, "id": "b", "state": "The VPN drops every ten minutes."},
        {**DECISION, "id": "c", "question": "Who should reply first?"},
    ]
    body = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    response = client.post("/invocations", content=body, headers={"Content-Type": "application/jsonlines"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/jsonlines")
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert [row["id"] for row in rows] == ["a", "b", "c"]
    for line, row in zip(lines, rows, strict=True):
        alone = client.post("/invocations", json={"decision": line}).json()["result"]
        assert alone["probabilities"] == row["probabilities"]
    bad = json.dumps(lines[0]) + '\n{"id": "x"}\n'
    response = client.post("/invocations", content=bad, headers={"Content-Type": "application/jsonlines"})
    assert response.status_code == 400 and "line 2" in response.json()["error"]


def test_jsonlines_engine_refusal_names_the_callers_line(client: TestClient) -> None:
    """Lines are scored grouped by state; an error the engine raises inside a group still names the line."""
    lines = [
        {**DECISION, "id": "a"},
        {**DECISION, "id": "b", "state": "The VPN drops every ten minutes."},
        {**DECISION, "id": "c", "question": "Who should reply first? " * 1500},  # 2nd of the first state
    ]
    body = "\n".join(json.dumps(line) for line in lines)
    response = client.post("/invocations", content=body, headers={"Content-Type": "application/jsonlines"})
    assert response.status_code == 413, response.text
    error = response.json()
    assert error["type"] == "token_budget_exceeded" and error["error"].startswith("line 3: "), error


def test_errors_for_routes_and_methods(client: TestClient) -> None:
    assert client.get("/nope").json() == {"error": "Not Found", "type": "not_found"}
    assert client.get("/invocations").status_code == 405
    assert client.post("/ping").status_code == 405


def test_metrics_and_openapi(client: TestClient) -> None:
    client.post("/invocations", json={"decision": DECISION})
    text = client.get("/metrics").text
    assert 'semif_requests_total{route="/invocations",status="200"}' in text
    assert "semif_decisions_total" in text and "semif_ready 1.0" in text
    schema = client.get("/openapi.json").json()
    assert "InvocationRequest" in schema["components"]["schemas"]
    assert "Decision" in schema["components"]["schemas"]
    body = schema["paths"]["/invocations"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/jsonlines"} <= set(body)
    assert client.get("/docs").status_code == 200


# --- states that need fakes: busy, engine failure, load failure ----------------------------------------


class FakeEngine:
    """Blocks in score() until released, or raises, so admission and failure paths can be driven."""

    def __init__(self, fail_with: Exception | None = None, fail_probe: bool = False) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.fail_with = fail_with
        self.fail_probe = fail_probe
        self.calls = 0
        self.model_info = fake_model_info()
        self.max_options = 255

    def score(self, decisions: Sequence[Decision], cancel: object = None) -> BatchResult:
        self.calls += 1
        if decisions[0].id == "warmup":
            if self.fail_probe and self.calls > 1:
                raise EngineFailure("probe failed")
            return stand_in_batch(decisions)
        self.entered.set()
        if self.fail_with is not None:
            raise self.fail_with
        self.release.wait(10)
        return stand_in_batch(decisions)

    def reset_prefix_cache(self) -> None:
        pass

    def close(self) -> None:
        pass


def _fake_app(engine: FakeEngine, **overrides: object) -> TestClient:
    settings = engine_settings(**overrides)
    return TestClient(create_app(settings, lambda: engine))


@contextmanager
def engine_held(fake: TestClient, engine: FakeEngine) -> Iterator[None]:
    """One good request holds the engine for the block; then it is released and must have succeeded."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(fake.post, "/invocations", json={"decision": DECISION})
        assert engine.entered.wait(10)
        try:
            yield
        finally:
            engine.release.set()  # also when the block fails: the pool would otherwise wait forever
        assert first.result(10).status_code == 200


def test_busy_engine_answers_fast_503_with_retry_after() -> None:
    engine = FakeEngine()
    with _fake_app(engine) as fake:
        _wait_ready(fake)
        with engine_held(fake, engine):
            busy = fake.post("/invocations", json={"decision": DECISION})
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "1"
            assert busy.json() == {"error": busy.json()["error"], "type": "model_busy", "retryable": True}
            assert fake.get("/ping").status_code == 200  # the loop keeps answering while the engine works
        metrics = fake.get("/metrics").text
        assert "semif_busy_rejections_total 1.0" in metrics


def test_small_queue_lets_one_request_wait() -> None:
    engine = FakeEngine()
    with _fake_app(engine, max_queue=1) as fake:
        _wait_ready(fake)
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(fake.post, "/invocations", json={"decision": DECISION})
            assert engine.entered.wait(10)
            second = pool.submit(fake.post, "/invocations", json={"decision": DECISION})
            time.sleep(0.2)
            third = fake.post("/invocations", json={"decision": DECISION})
            assert third.status_code == 503
            engine.release.set()
            assert first.result(10).status_code == 200
            assert second.result(10).status_code == 200


def test_engine_failure_is_500_and_a_dead_engine_turns_ping_red() -> None:
    engine = FakeEngine(fail_with=EngineFailure("the model produced non-finite logits"), fail_probe=True)
    with _fake_app(engine) as fake:
        _wait_ready(fake)
        response = fake.post("/invocations", json={"decision": DECISION})
        assert response.status_code == 500
        assert response.json() == {"error": "the model produced non-finite logits", "type": "engine_error"}
        assert "Traceback" not in response.text
        ping = fake.get("/ping")
        assert ping.status_code == 503 and ping.json()["status"] == "failed"
        assert fake.post("/invocations", json={"decision": DECISION}).status_code == 503


def test_engine_failure_with_healthy_probe_stays_ready() -> None:
    engine = FakeEngine(fail_with=EngineFailure("transient"))
    with _fake_app(engine) as fake:
        _wait_ready(fake)
        assert fake.post("/invocations", json={"decision": DECISION}).status_code == 500
        assert fake.get("/ping").status_code == 200


def test_ping_is_503_while_loading_and_after_load_failure() -> None:
    gate = threading.Event()
    fatal: list[str] = []

    def slow_then_fail() -> FakeEngine:
        gate.wait(10)
        raise ModelLoadError("GGUF file not found: /opt/ml/model/x.gguf")

    settings = engine_settings()
    with TestClient(create_app(settings, slow_then_fail, on_fatal=fatal.append)) as fake:
        loading = fake.get("/ping")
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        assert fake.post("/invocations", json={"decision": DECISION}).json()["type"] == "not_ready"
        gate.set()
        deadline = time.monotonic() + 10
        while fake.get("/ping").json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.02)
        failed = fake.get("/ping")
        assert failed.status_code == 503 and "GGUF file not found" in failed.json()["error"]
    assert fatal and "model load failed" in fatal[0]
