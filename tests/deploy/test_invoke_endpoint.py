"""semif-ops endpoint invoke and semif-ops endpoint invoke --stock.

moto's sagemaker-runtime always answers 200 with canned data and cannot produce a 503 ModelError, so the
retry behaviour is checked with botocore's Stubber (responses validated against the service model).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from botocore.stub import Stubber

from semif_ops.endpoint import invoke as invoke_endpoint
from semif_ops.endpoint import invoke_stock as invoke_standard_endpoint

DECISION = {
    "decision": {
        "id": "d1",
        "state": "It is raining.",
        "question": "Take an umbrella?",
        "options": [{"id": "yes", "description": "Yes"}, {"id": "no", "description": "No"}],
    }
}


def body(payload: dict[str, Any]) -> StreamingBody:
    raw = json.dumps(payload).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


def add_busy(stub: Stubber, code: str = "ModelError", original: int = 503) -> None:
    stub.add_client_error(
        "invoke_endpoint",
        service_error_code=code,
        service_message="busy",
        http_status_code=424 if code == "ModelError" else 503,
        modeled_fields={"OriginalStatusCode": original, "OriginalMessage": '{"error":"busy"}'}
        if code == "ModelError"
        else None,
    )


def test_503_is_retried_with_capped_full_jitter_backoff() -> None:
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1")
    stub = Stubber(runtime)
    add_busy(stub)  # the container's own 503, wrapped by SageMaker as ModelError
    add_busy(stub, code="ServiceUnavailable")  # SageMaker itself overloaded
    add_busy(stub)
    add_busy(stub)
    stub.add_response(
        "invoke_endpoint", {"Body": body({"result": {"id": "d1"}}), "ContentType": "application/json"}
    )
    sleeps: list[float] = []
    ceilings: list[float] = []

    def rng(low: float, high: float) -> float:
        assert low == 0.0
        ceilings.append(high)
        return high / 2

    with stub:
        response = invoke_endpoint.invoke_with_retry(
            runtime,
            endpoint="semif",
            body=b"{}",
            base_s=0.5,
            cap_s=2.0,
            sleep=sleeps.append,
            rng=rng,
            log=lambda _m: None,
        )
        stub.assert_no_pending_responses()
    assert json.loads(response["Body"]) == {"result": {"id": "d1"}}
    assert ceilings == [0.5, 1.0, 2.0, 2.0]  # doubles, then capped
    assert sleeps == [0.25, 0.5, 1.0, 1.0]


def test_non_retryable_errors_and_exhaustion_raise() -> None:
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1")
    stub = Stubber(runtime)
    add_busy(stub, original=400)  # the caller's mistake: never retried
    add_busy(stub)
    add_busy(stub)
    sleeps: list[float] = []
    with stub:
        with pytest.raises(ClientError) as first:
            invoke_endpoint.invoke_with_retry(
                runtime, endpoint="e", body=b"{}", sleep=sleeps.append, log=lambda _m: None
            )
        assert first.value.response["OriginalStatusCode"] == 400 and sleeps == []
        with pytest.raises(ClientError):
            invoke_endpoint.invoke_with_retry(
                runtime, endpoint="e", body=b"{}", max_attempts=2, sleep=sleeps.append, log=lambda _m: None
            )
        stub.assert_no_pending_responses()
    assert len(sleeps) == 1


def test_main_sends_the_request_file(
    tmp_path: Path, use_clients: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(DECISION))
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1")
    stub = Stubber(runtime)
    stub.add_response(
        "invoke_endpoint",
        {"Body": body({"result": {"id": "d1", "option_ids": ["yes", "no"]}})},
        {
            "EndpointName": "semif",
            "Body": request.read_bytes(),
            "ContentType": "application/json",
            "Accept": "application/json",
        },
    )
    use_clients(sagemaker_runtime=runtime)
    with stub:
        assert invoke_endpoint.main(["--endpoint", "semif", "--request", str(request)]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["option_ids"] == ["yes", "no"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"decision": {}, "decisions": []}), "exactly one of"),
        (json.dumps({"decisions": []}), "non-empty list"),
        (json.dumps([1, 2]), "exactly one of"),
    ],
)
def test_bad_request_files_stop_before_calling(
    tmp_path: Path, content: str, fragment: str, calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "request.json"
    request.write_text(content)
    assert invoke_endpoint.main(["--endpoint", "semif", "--request", str(request)]) != 0
    assert fragment in capsys.readouterr().err
    assert calls == []


def test_jev_style_body_is_accepted(tmp_path: Path) -> None:
    request = tmp_path / "jev.json"
    request.write_text(json.dumps({"model": "jev-latest", "questions": [{"id": "q1"}]}))
    assert invoke_endpoint.load_request(request) == request.read_bytes()


def test_standard_endpoint_gets_an_openai_chat_payload(
    use_clients: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1")
    stub = Stubber(runtime)
    payload = {"messages": [{"role": "user", "content": "A or B?"}], "max_tokens": 8, "temperature": 0.0}
    stub.add_response(
        "invoke_endpoint",
        {"Body": body({"choices": [{"message": {"role": "assistant", "content": "A"}}]})},
        {
            "EndpointName": "llamacpp",
            "Body": json.dumps(payload).encode(),
            "ContentType": "application/json",
            "Accept": "application/json",
        },
    )
    use_clients(sagemaker_runtime=runtime)
    with stub:
        rc = invoke_standard_endpoint.main(
            ["--endpoint", "llamacpp", "--prompt", "A or B?", "--max-tokens", "8"]
        )
    assert rc == 0
    assert capsys.readouterr().out.strip() == "A"
