"""HTTP targets against a real local server (tests/eval/conftest.py) speaking each protocol."""

from __future__ import annotations

import numpy as np
import pytest

from semif_adapter.eval.runner import RetryPolicy, run_benchmark
from semif_adapter.eval.targets import ChatTarget, HttpTarget
from semif_adapter.eval.tasks import Task
from tests.helpers.evalserver import LocalServer, softmax

FAST_RETRY = RetryPolicy(max_attempts=4, base_s=0.01, cap_s=0.05)


def _expected_correct(tasks: list[Task], server: LocalServer) -> int:
    return sum(int(np.argmax(server.state.logits[t.id])) == t.expected_index for t in tasks)


@pytest.mark.parametrize("protocol", ["semif", "systemone"])
def test_protocols_give_the_same_answers(devset: list[Task], server: LocalServer, protocol: str) -> None:
    target = HttpTarget(server.url, protocol, name=protocol)
    try:
        run = run_benchmark(devset, target, retry=FAST_RETRY)
    finally:
        target.close()
    totals = run.totals
    assert totals["valid"] == 60 and totals["invalid"] == 0
    assert totals["correct"] == _expected_correct(devset, server)
    assert 0 < totals["correct"] < 60  # the table mixes right and wrong answers
    # per-row probabilities are the server's softmax, aligned with labels although it reversed them
    row = run.rows[0]
    np.testing.assert_allclose(row.probabilities, softmax(np.asarray(server.state.logits[row.id])), rtol=1e-9)
    assert row.option_logits == pytest.approx(server.state.logits[row.id])
    assert [r.id for r in run.rows] == [t.id for t in devset]
    assert totals["latency_s"]["p50"] > 0 and totals["retries_503"] == 0
    assert totals["by_type"]["noul"]["total"] == 18
    if protocol == "semif":
        assert row.prompt_version == "test-v1" and row.model_sha256 == "ab" * 32


def test_503_is_retried_counted_and_kept_out_of_latency(devset: list[Task], server: LocalServer) -> None:
    tasks = devset[:6]
    server.state.busy_first = {tasks[1].id, tasks[4].id}
    server.state.busy_delay_s = 0.3  # a slow 503: would dominate latency if it were counted
    server.state.ok_delay_s = 0.01
    target = HttpTarget(server.url, "semif")
    try:
        run = run_benchmark(tasks, target, retry=FAST_RETRY)
    finally:
        target.close()
    assert run.totals["retries_503"] == 2
    assert run.totals["valid"] == 6
    retried = {r.id: r for r in run.rows if r.retries_503}
    assert set(retried) == {tasks[1].id, tasks[4].id}
    for row in retried.values():
        assert row.attempts == 2
        assert row.retry_wait_s >= 0.3
        assert row.latency_s is not None and row.latency_s < 0.25
    assert run.totals["latency_s"]["p99"] < 0.25
    assert run.totals["retry_wait_s"] >= 0.6
    assert server.state.attempts[tasks[1].id] == 2


def test_persistent_503_gives_up_as_invalid(devset: list[Task], server: LocalServer) -> None:
    task = devset[0]
    server.state.always_busy = {task.id}
    target = HttpTarget(server.url, "semif")
    try:
        run = run_benchmark([task], target, retry=RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.002))
    finally:
        target.close()
    row = run.rows[0]
    assert not row.valid and row.retries_503 == 3 and row.attempts == 3
    assert "still 503 after 3 attempts" in (row.error or "")
    assert server.state.attempts[task.id] == 3
    assert run.totals["correct"] == 0 and run.totals["latency_s"]["p50"] is None


def test_http_errors_are_invalid_rows_not_crashes(devset: list[Task], server: LocalServer) -> None:
    unknown = devset[0].model_copy(update={"id": "not-on-server"})
    target = HttpTarget(server.url, "semif")
    try:
        run = run_benchmark([unknown, devset[1]], target, retry=FAST_RETRY)
    finally:
        target.close()
    bad, good = run.rows
    assert not bad.valid and bad.status == 400 and "HTTP 400" in (bad.error or "")
    assert good.valid
    assert run.totals["valid"] == 1


def test_unreachable_server_is_invalid(devset: list[Task]) -> None:
    target = HttpTarget("http://127.0.0.1:9", "semif", timeout_s=2)
    try:
        run = run_benchmark(devset[:1], target, retry=FAST_RETRY)
    finally:
        target.close()
    assert run.rows[0].valid is False and run.rows[0].error


def test_concurrency_keeps_task_order_and_results(devset: list[Task], server: LocalServer) -> None:
    server.state.ok_delay_s = 0.01
    target = HttpTarget(server.url, "semif")
    try:
        run = run_benchmark(devset, target, concurrency=4, retry=FAST_RETRY)
    finally:
        target.close()
    assert [r.id for r in run.rows] == [t.id for t in devset]
    assert run.totals["correct"] == _expected_correct(devset, server)
    assert run.config["concurrency"] == 4
    assert run.totals["decisions_per_s"] > 0


def test_chat_target_parses_generated_labels(devset: list[Task], server: LocalServer) -> None:
    choice = next(t for t in devset if t.type == "choice")
    noul = next(t for t in devset if t.type == "noul")
    score = next(t for t in devset if t.type == "score")
    server.state.chat_replies = {
        choice.id: f" {choice.expected_label.upper()}.",  # exact label, case and punctuation aside
        noul.id: "Yes or no, hard to say",  # names two labels: invalid
        score.id: f"Level {score.expected_index} fits best",  # one label inside a sentence
    }
    target = ChatTarget(server.url + "/v1", model="local")
    try:
        run = run_benchmark([choice, noul, score], target, retry=FAST_RETRY)
    finally:
        target.close()
    by_id = {r.id: r for r in run.rows}
    assert by_id[choice.id].correct and by_id[choice.id].probabilities == [
        1.0 if label == choice.expected_label else 0.0 for label in choice.labels
    ]
    assert not by_id[noul.id].valid and by_id[noul.id].reply == "Yes or no, hard to say"
    assert by_id[score.id].correct and by_id[score.id].option_logits is None
    assert run.totals["valid"] == 2 and run.totals["correct"] == 2
    assert target.endpoint.endswith("/v1/chat/completions")
