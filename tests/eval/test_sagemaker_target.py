"""SageMaker target through a real botocore sagemaker-runtime client with botocore's Stubber.

moto is not used here: its invoke_endpoint has no model behind it and returns canned text, so it
cannot produce decision answers or a container's 503; the Stubber lets us script exactly the
responses InvokeEndpoint gives (including ModelError carrying the container's OriginalStatusCode).
"""

from __future__ import annotations

import io
import json
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from semif_adapter.eval.mapping import task_to_invocation, task_to_systemone_request
from semif_adapter.eval.runner import RetryPolicy, run_benchmark
from semif_adapter.eval.targets import SageMakerTarget
from semif_adapter.eval.tasks import Task
from tests.helpers.evalserver import softmax


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return boto3.client("sagemaker-runtime", region_name="eu-west-1")


def _body(payload: dict) -> StreamingBody:
    raw = json.dumps(payload).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


def _params(body: dict) -> dict:
    return {
        "EndpointName": "semif-test",
        "ContentType": "application/json",
        "Accept": "application/json",
        "Body": json.dumps(body).encode("utf-8"),
    }


def test_semif_body_with_a_503_retry(client: Any, devset: list[Task]) -> None:
    task = next(t for t in devset if t.type == "choice")
    logits = np.linspace(-1.0, 1.0, len(task.labels))
    probs = softmax(logits)
    answer = {
        "result": {
            "option_ids": task.labels,
            "probabilities": probs.tolist(),
            "option_logits": logits.tolist(),
            "calibration": None,
        }
    }
    with Stubber(client) as stub:
        stub.add_client_error(
            "invoke_endpoint",
            service_error_code="ModelError",
            service_message="Received server error (503) from primary",
            http_status_code=424,
            modeled_fields={"OriginalStatusCode": 503, "OriginalMessage": "busy"},
            expected_params=_params(task_to_invocation(task)),
        )
        stub.add_response(
            "invoke_endpoint",
            {"Body": _body(answer), "ContentType": "application/json"},
            _params(task_to_invocation(task)),
        )
        target = SageMakerTarget("semif-test", protocol="semif", client=client)
        run = run_benchmark([task], target, retry=RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.002))
        stub.assert_no_pending_responses()
    row = run.rows[0]
    assert row.valid and row.retries_503 == 1 and row.attempts == 2
    assert row.probabilities == pytest.approx(probs.tolist())
    assert row.predicted == task.labels[-1]
    assert run.target == {
        "kind": "sagemaker",
        "endpoint_name": "semif-test",
        "region": "eu-west-1",
        "protocol": "semif",
    }


def test_systemone_body_and_a_non_retryable_model_error(client: Any, devset: list[Task]) -> None:
    noul = next(t for t in devset if t.type == "noul")
    other = next(t for t in devset if t.type == "noul" and t.id != noul.id)
    with Stubber(client) as stub:
        stub.add_response(
            "invoke_endpoint",
            {"Body": _body({"answers": {noul.id: {"type": "noul", "noul": 0.8}}})},
            _params(task_to_systemone_request(noul)),
        )
        stub.add_client_error(
            "invoke_endpoint",
            service_error_code="ModelError",
            service_message="Received client error (400)",
            http_status_code=424,
            modeled_fields={"OriginalStatusCode": 400},
            expected_params=_params(task_to_systemone_request(other)),
        )
        target = SageMakerTarget("semif-test", protocol="systemone", client=client)
        run = run_benchmark([noul, other], target, retry=RetryPolicy(max_attempts=3, base_s=0.001))
        stub.assert_no_pending_responses()
    first, second = run.rows
    assert first.valid and first.probabilities == pytest.approx([0.2, 0.8])
    assert not second.valid and second.status == 400 and second.retries_503 == 0
