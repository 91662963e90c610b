"""Requests that arrive together are handed to the engine together (``Admission.run_batched``), at most
``max_batch_requests`` at a time; ``max_batch_requests + SEMIF_MAX_QUEUE`` are admitted and one more gets
the fast 503; each request keeps its own outcome. A fake engine records the batches (which requests
wait together cannot be arranged with a real model's timing); the real engine's answers in shared
batches are tests/engine/test_shared_calls.py and, over HTTP, the last test here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from semif_adapter.app import create_app
from semif_adapter.engine import DecisionEngine
from semif_adapter.errors import DecisionValidationError, SemifError
from semif_adapter.protocol import BatchResult, Decision
from tests.helpers.support import engine_settings, fake_model_info, stand_in_batch


def decision(i: int, state: str = "A customer was charged twice.") -> dict:
    return {
        "id": f"d{i}",
        "state": state,
        "question": "Which queue?",
        "options": [{"id": "billing"}, {"id": "tech"}],
    }


class BatchingEngine:
    """Scores batches of requests; the first batch blocks until released so that others queue behind it."""

    def __init__(self, max_batch_requests: int) -> None:
        self.max_batch_requests = max_batch_requests
        self.model_info = fake_model_info()
        self.max_options = 255
        self.batches: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def score(self, decisions: Sequence[Decision], cancel: object = None) -> BatchResult:
        return stand_in_batch(decisions)

    def score_many(self, jobs: Sequence[tuple[Sequence[Decision], object]]) -> list[BatchResult | SemifError]:
        self.batches.append([decisions[0].id for decisions, _ in jobs])
        if len(self.batches) == 1:  # the first batch holds (the warm-up goes through score)
            self.entered.set()
            self.release.wait(10)
        return [
            DecisionValidationError("this one is refused", loc=("decision", "state"))
            if d[0].id == "d-bad"
            else stand_in_batch(d)
            for d, _ in jobs
        ]

    def reset_prefix_cache(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture()
def batching() -> Iterator[tuple[TestClient, BatchingEngine]]:
    engine = BatchingEngine(max_batch_requests=3)
    with TestClient(create_app(engine_settings(max_queue=2), lambda: engine)) as client:
        deadline = time.monotonic() + 30
        while client.get("/ping").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        yield client, engine


def test_requests_waiting_together_run_in_one_batch_and_the_overflow_gets_503(batching) -> None:
    client, engine = batching
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(client.post, "/invocations", json={"decision": decision(0)})
        assert engine.entered.wait(10)
        waiting = [
            pool.submit(client.post, "/invocations", json={"decision": decision(i)}) for i in range(1, 5)
        ]
        deadline = time.monotonic() + 10
        while engine_admitted(client) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        # capacity: 3 in a batch + 2 waiting; one running and four waiting fill it
        refused = client.post("/invocations", json={"decision": decision(9)})
        assert refused.status_code == 503 and refused.json()["type"] == "model_busy"
        engine.release.set()
        assert first.result(10).status_code == 200
        assert [w.result(10).status_code for w in waiting] == [200] * 4
    # the first alone (it found the engine idle), then the four that waited, 3 at a time (arrival order)
    assert engine.batches[0] == ["d0"] and [len(b) for b in engine.batches] == [1, 3, 1]
    assert sorted(engine.batches[1] + engine.batches[2]) == ["d1", "d2", "d3", "d4"]


def engine_admitted(client: TestClient) -> int:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("semif_engine_admitted "):
            return int(float(line.split()[1]))
    raise AssertionError("no in-flight gauge")


def test_each_request_in_a_batch_keeps_its_own_outcome(batching) -> None:
    client, engine = batching
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(client.post, "/invocations", json={"decision": decision(0)})
        assert engine.entered.wait(10)
        bad = pool.submit(client.post, "/invocations", json={"decision": {**decision(0), "id": "d-bad"}})
        good = pool.submit(client.post, "/invocations", json={"decision": decision(7)})
        deadline = time.monotonic() + 10
        while engine_admitted(client) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.release.set()
        assert first.result(10).status_code == 200
        refused, answered = bad.result(10), good.result(10)
    assert refused.status_code == 400 and "decision.state" in refused.json()["error"]
    assert answered.status_code == 200 and answered.json()["result"]["id"] == "d7"
    assert sorted(engine.batches[-1]) == ["d-bad", "d7"]  # in one batch, arrival order either way
    assert client.get("/ping").status_code == 200


def test_concurrent_requests_on_the_real_engine_answer_as_alone(gemma_gguf: Path) -> None:
    """Over HTTP on the real engine: requests sent at once (batched as they queue) answer bit for bit as
    each alone on an idle server; once they have come in company, the batching window holds the first
    arrival for the others (a wide window here: the test client's threads are slow to start)."""
    settings = engine_settings(max_queue=8, batch_wait_ms=1000)
    states = [
        "A customer was charged twice.",
        "The nightly export timed out again.",
        "A login failed.",
        "x " * 300,
    ]
    bodies = [{"decisions": [decision(i * 10 + j, states[i]) for j in range(1 + i % 2)]} for i in range(4)]
    app = create_app(settings, lambda: DecisionEngine.load(settings, gemma_gguf))
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/ping").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.app.state.service.model_info.max_batch_requests == 4  # type: ignore[attr-defined]
        alone = []
        for body in bodies:
            client.app.state.service.engine.reset_prefix_cache()  # type: ignore[attr-defined]
            alone.append(client.post("/invocations", json=body).json()["results"])
        barrier = threading.Barrier(len(bodies))

        def send(body: dict) -> httpx.Response:
            barrier.wait()
            return client.post("/invocations", json=body)

        for _ in range(2):
            with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
                together = [r.json()["results"] for r in pool.map(send, bodies)]
            strip = lambda rs: [(r["id"], r["probabilities"], r["option_logits"]) for r in rs]  # noqa: E731
            assert [strip(r) for r in together] == [strip(r) for r in alone]
        metrics = client.get("/metrics").text
        assert "semif_max_batch_requests 4.0" in metrics

        def value(name: str) -> float:
            return float(next(ln for ln in metrics.splitlines() if ln.startswith(name)).split()[1])

        total = value("semif_batch_requests_count")
        assert value('semif_batch_requests_bucket{le="1.0"}') < total  # some batch held 2+ requests
        assert value('semif_batch_requests_bucket{le="3.0"}') < total  # the second round: all four at once
