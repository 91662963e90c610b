"""The front door, in-process: bad requests judged before admission, one key for every door, large bodies
parsed off the event loop, and the shutdown abort. (Slow clients and SIGTERM against a live process are in
tests/contract/test_front_door_live.py.)"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_app import DECISION, FakeEngine, _fake_app, _wait_ready, engine_held

from semif_adapter.app import create_app
from semif_adapter.decisions import parse as decision_parse
from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.deadline import SHUTTING_DOWN, Deadline
from semif_adapter.errors import ShuttingDown, TokenBudgetExceeded
from semif_adapter.http import body
from semif_adapter.http.auth import on_sagemaker, requires_key
from tests.helpers.support import engine_settings

JSONL = {"Content-Type": "application/jsonlines"}
OTHER = {**DECISION, "id": "urgent", "question": "Is it urgent?", "options": [{"id": "yes"}, {"id": "no"}]}


@pytest.mark.parametrize(
    ("body", "loc", "needle"),
    [
        ({"decisions": [DECISION, DECISION]}, "decisions.1.id", "duplicate decision id 'route'"),
        ({"decisions": [DECISION, {**OTHER, "state": "another state"}]}, "decisions.1.state", "same state"),
    ],
)
def test_a_bad_batch_gets_its_400_while_the_engine_is_busy(body: dict, loc: str, needle: str) -> None:
    engine = FakeEngine()
    with _fake_app(engine) as fake:
        _wait_ready(fake)
        with engine_held(fake, engine):
            bad = fake.post("/invocations", json=body)
            assert bad.status_code == 400, bad.text
            assert bad.json()["type"] == "invalid_request"
            assert needle in bad.json()["error"] and bad.json()["error"].startswith(loc)
            lines = "\n".join(json.dumps(d) for d in (DECISION, DECISION))
            jsonl = fake.post("/invocations", content=lines, headers=JSONL)
            assert jsonl.status_code == 400 and "line 2" in jsonl.json()["error"], jsonl.text
        assert engine.calls == 2  # warm-up and the good request: the bad ones never reached the engine
        assert "semif_busy_rejections_total 0.0" in fake.get("/metrics").text


KEY = "s3cret-key"
DOORS = [
    ("post", "/invocations", {"json": {"decision": DECISION}}),
    ("post", "/invocations", {"json": {"decisions": [DECISION, OTHER]}}),
    ("post", "/invocations", {"content": json.dumps(DECISION), "headers": JSONL}),
    ("post", "/invocations", {"json": {"model": "jev-latest", "state": "s", "questions": {
        "q": {"type": "noul", "instructions": "Is it billing?"}}}}),
    ("post", "/v1/systemone", {"json": {"model": "jev-latest", "state": "s", "questions": {
        "q": {"type": "noul", "instructions": "Is it billing?"}}}}),
    ("get", "/v1/models", {}),
    ("get", "/metrics", {}),
]  # fmt: skip


def test_one_key_guards_every_door_but_ping() -> None:
    engine = FakeEngine()
    engine.release.set()
    with _fake_app(engine, api_key=KEY) as fake:
        _wait_ready(fake)
        assert fake.get("/ping").status_code == 200
        assert fake.get("/openapi.json").status_code == 200  # the API's description, no model or data
        for method, path, kwargs in DOORS:
            denied = getattr(fake, method)(path, **kwargs)
            assert denied.status_code == 401, (path, denied.text)
            assert denied.headers["www-authenticate"] == "Bearer"
            kind = denied.json()["detail"]["error_type"] if path.startswith("/v1/") else denied.json()["type"]
            assert kind == "authentication_error"
            kwargs = {k: v for k, v in kwargs.items() if k != "headers"}
            wrong_headers = {"Authorization": "Bearer nope", **({} if "content" not in kwargs else JSONL)}
            wrong = getattr(fake, method)(path, headers=wrong_headers, **kwargs)
            assert wrong.status_code == 401
            allowed_headers = {"Authorization": f"Bearer {KEY}"}
            if "content" in kwargs:
                allowed_headers["Content-Type"] = "application/jsonlines"
            allowed = getattr(fake, method)(path, headers=allowed_headers, **kwargs)
            assert allowed.status_code == 200, (path, allowed.text)
        assert engine.calls == 1 + 5  # warm-up, then only the five authorised scoring requests


def test_metrics_can_be_opened_separately() -> None:
    engine = FakeEngine()
    with _fake_app(engine, api_key=KEY, metrics_open=True) as fake:
        _wait_ready(fake)
        assert fake.get("/metrics").status_code == 200
        assert fake.post("/invocations", json={"decision": DECISION}).status_code == 401
    assert requires_key("/metrics", KEY, metrics_open=False)
    assert not requires_key("/invocations", None, metrics_open=False)


def test_sagemaker_is_recognised_by_its_environment() -> None:
    assert on_sagemaker({"SAGEMAKER_BIND_TO_PORT": "8080"})
    assert not on_sagemaker({"HOME": "/root", "SEMIF_API_KEY": "k"})


def test_large_bodies_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = decision_parse.read_decision_json

    def recording(body: bytes, *args: object) -> object:
        seen.append(threading.current_thread().name)
        return real(body, *args)

    monkeypatch.setattr(decision_parse, "read_decision_json", recording)
    engine = FakeEngine()
    engine.release.set()
    with _fake_app(engine) as fake:
        _wait_ready(fake)
        loop_thread = fake.portal.call(lambda: threading.current_thread().name)  # type: ignore[union-attr]
        assert fake.post("/invocations", json={"decision": DECISION}).status_code == 200
        big = {**DECISION, "state": "x " * body.OFF_LOOP_BYTES}
        assert fake.post("/invocations", json={"decision": big}).status_code == 200
    assert seen[0] == loop_thread  # a small body stays on the loop: a thread hop would cost more
    assert seen[1] != loop_thread


class CheckingEngine(FakeEngine):
    """Consults its token before starting, as the real engine does before every decision."""

    def score(self, decisions, cancel=None):  # type: ignore[no-untyped-def]
        if cancel is not None and decisions[0].id != "warmup":
            cancel.check()
        return super().score(decisions, cancel)


def test_abort_in_flight_cancels_running_and_queued_requests_with_a_retryable_503() -> None:
    engine = CheckingEngine()
    with _fake_app(engine, max_queue=1) as fake:
        _wait_ready(fake)
        service = fake.app.state.service  # type: ignore[attr-defined]
        with ThreadPoolExecutor(max_workers=2) as pool:
            running = pool.submit(fake.post, "/invocations", json={"decision": DECISION})
            assert engine.entered.wait(10)
            queued = pool.submit(fake.post, "/invocations", json={"decision": DECISION})
            while service.admission.admitted < 2:
                threading.Event().wait(0.01)
            service.begin_shutdown()
            assert fake.get("/ping").status_code == 503
            assert fake.portal.call(service.abort_in_flight) == 2  # type: ignore[union-attr]
            tokens = list(service._in_flight)
            engine.release.set()
            statuses = [running.result(10), queued.result(10)]
    assert all(token.reason == SHUTTING_DOWN for token in tokens)
    # the fake checks its token only before starting: the running one finishes, the queued one never starts
    assert statuses[0].status_code == 200
    assert statuses[1].status_code == 503
    assert statuses[1].json()["type"] == "shutting_down" and statuses[1].json()["retryable"] is True


def test_the_shutting_down_error_is_a_retryable_503() -> None:
    token = Deadline(None)
    token.cancel(SHUTTING_DOWN)
    error = token.error()
    assert isinstance(error, ShuttingDown) and error.status == 503 and error.retryable


def test_an_oversized_state_is_refused_after_counting_a_bounded_slice(gemma_gguf: Path) -> None:
    """5 MB of structured state: the refusal tokenizes a few slices, not the 2.6 M tokens of all of it."""
    engine = DecisionEngine.load(engine_settings(n_ctx=8192), gemma_gguf)
    try:
        tokenized: list[int] = []
        real = engine.runtime.tokenize

        def counting(text: str, special: bool) -> list[int]:
            tokenized.append(len(text))
            return real(text, special)

        engine.runtime.tokenize = counting  # type: ignore[method-assign]
        state = [{"id": i, "name": f"item-{i}", "v": i * 3} for i in range(120_000)]
        refused = r"the state alone needs more than \d+ tokens \(counted"
        with pytest.raises(TokenBudgetExceeded, match=refused):
            engine.score([{**DECISION, "state": state}])
        assert sum(tokenized) < 200_000, sum(tokenized)
        # a state that fits is still tokenized whole and scored as before
        fits = {**DECISION, "state": "Charged twice. " * 2_000}
        assert len(engine.score([fits]).results) == 1
    finally:
        engine.close()


def test_every_in_process_door_still_answers_without_a_key(gemma_gguf: Path) -> None:
    settings = engine_settings()
    with TestClient(create_app(settings, lambda: DecisionEngine.load(settings, gemma_gguf))) as client:
        _wait_ready(client)
        assert client.get("/metrics").status_code == 200
        assert client.post("/invocations", json={"decision": DECISION}).status_code == 200
