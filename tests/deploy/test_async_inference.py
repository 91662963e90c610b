"""Asynchronous inference: endpoint deploy --async and endpoint invoke --async, against moto.

moto stores AsyncInferenceConfig, implements InvokeEndpointAsync (it writes a queued answer, or a failure,
to S3 at once; the answers are set through moto's documented async-endpoint-results API) and S3, so every
call here runs against moto; the call recorder shows the exact parameters sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from semif_ops.endpoint import deploy as deploy_endpoint
from semif_ops.endpoint import invoke as invoke_endpoint
from tests.helpers.deploy import IMAGE

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
TOPIC = "arn:aws:sns:us-east-1:123456789012:semif-answers"
BASE = ["--name", "semif-async", "--role-arn", ROLE, "--image", IMAGE]
BASE += ["--model-data", "s3://models/x/model.tar.gz", "--instance-type", "ml.c5.xlarge"]
DECISION = {
    "id": "d1",
    "state": "It is raining.",
    "question": "Take an umbrella?",
    "options": [{"id": "yes", "description": "Yes"}, {"id": "no", "description": "No"}],
}
Calls = list[tuple[str, str, dict[str, Any]]]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def created(calls: Calls, op: str) -> dict[str, Any]:
    (params,) = [p for _, o, p in calls if o == op]
    return params


def queue_async_result(data: str, *, failure: bool = False) -> None:
    """moto's documented way to choose what the next InvokeEndpointAsync writes."""
    requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/sagemaker/async-endpoint-results",
        json={"results": [{"data": data, "is_failure": failure}]},
        timeout=5,
    ).raise_for_status()


def test_async_deploy_sends_one_invocation_per_instance_and_the_deadline(
    moto_aws: None, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = deploy_endpoint.main(
        [
            *BASE,
            "--async",
            "--output-s3",
            "s3://answers/semif",
            "--notify-sns",
            TOPIC,
            "--invocation-timeout",
            "1800",
        ]
    )
    assert rc == 0
    config = created(calls, "CreateEndpointConfig")
    assert config["AsyncInferenceConfig"] == {
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1},
        "OutputConfig": {
            "S3OutputPath": "s3://answers/semif",
            "S3FailurePath": "s3://answers/semif/failures",
            "NotificationConfig": {"SuccessTopic": TOPIC, "ErrorTopic": TOPIC},
        },
    }
    # the container may work almost as long as SageMaker lets the invocation run, and answers first
    environment = created(calls, "CreateModel")["PrimaryContainer"]["Environment"]
    assert environment == {"SEMIF_REQUEST_TIMEOUT_S": "1795"}
    sm = boto3.client("sagemaker", region_name="us-east-1")
    stored = sm.describe_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
    assert stored["AsyncInferenceConfig"]["ClientConfig"] == {"MaxConcurrentInvocationsPerInstance": 1}
    assert "--invocation-timeout 1800" in capsys.readouterr().out


def test_async_deploy_defaults_and_explicit_request_deadline(moto_aws: None, calls: Calls) -> None:
    rc = deploy_endpoint.main(
        [
            *BASE,
            "--async",
            "--output-s3",
            "s3://answers/semif/",
            "--failure-s3",
            "s3://answers/errors",
            "--request-timeout-s",
            "600",
            "--max-body-bytes",
            "67108864",
        ]
    )
    assert rc == 0
    output = created(calls, "CreateEndpointConfig")["AsyncInferenceConfig"]["OutputConfig"]
    assert output == {"S3OutputPath": "s3://answers/semif/", "S3FailurePath": "s3://answers/errors"}
    environment = created(calls, "CreateModel")["PrimaryContainer"]["Environment"]
    assert environment == {"SEMIF_REQUEST_TIMEOUT_S": "600", "SEMIF_MAX_BODY_BYTES": "67108864"}


def test_async_deploy_may_switch_the_container_deadline_off(moto_aws: None, calls: Calls) -> None:
    args = ["--async", "--output-s3", "s3://answers/semif", "--request-timeout-s", "0"]
    assert deploy_endpoint.main([*BASE, *args]) == 0
    environment = created(calls, "CreateModel")["PrimaryContainer"]["Environment"]
    assert environment == {"SEMIF_REQUEST_TIMEOUT_S": "0"}


def test_real_time_deploy_has_no_async_config_and_takes_a_short_deadline(
    moto_aws: None, calls: Calls
) -> None:
    assert deploy_endpoint.main([*BASE, "--request-timeout-s", "45.5"]) == 0
    assert "AsyncInferenceConfig" not in created(calls, "CreateEndpointConfig")
    environment = created(calls, "CreateModel")["PrimaryContainer"]["Environment"]
    assert environment == {"SEMIF_REQUEST_TIMEOUT_S": "45.5"}


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--output-s3", "s3://answers/x"], "--output-s3 apply to --async only"),
        (["--async"], "--async needs --output-s3"),
        (["--async", "--output-s3", "answers/x"], "is not an s3://"),
        (["--async", "--output-s3", "s3://answers/x", "--invocation-timeout", "3601"], "between 1 and 3600"),
        (["--async", "--output-s3", "s3://answers/x", "--notify-sns", "semif-topic"], "not an SNS topic ARN"),
        (
            [
                "--async",
                "--output-s3",
                "s3://answers/x",
                "--invocation-timeout",
                "300",
                "--request-timeout-s",
                "900",
            ],
            "--request-timeout-s must be between 1 and 300 seconds (or 0: no deadline)",
        ),
        (["--request-timeout-s", "120"], "--request-timeout-s must be between 1 and 60"),
        (["--request-timeout-s", "0"], "--request-timeout-s must be between 1 and 60"),
        (["--max-body-bytes", "100"], "--max-body-bytes must be at least 1024"),
    ],
)
def test_bad_async_deploy_input_is_refused_before_any_aws_call(
    extra: list[str], fragment: str, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    assert deploy_endpoint.main([*BASE, *extra]) != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert calls == []


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_async_invoke_uploads_queues_polls_and_prints_the_answer(
    moto_aws: None, calls: Calls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="requests")
    lines = [json.dumps(DECISION), json.dumps({**DECISION, "id": "d2"})]
    request = write(tmp_path, "batch.jsonl", "\n".join(lines) + "\n")
    answer = '{"id":"d1","option_ids":["yes","no"]}\n{"id":"d2","option_ids":["yes","no"]}\n'
    queue_async_result(answer)
    rc = invoke_endpoint.main(
        [
            "--async",
            "--endpoint",
            "semif-async",
            "--request",
            str(request),
            "--input-s3",
            "s3://requests/semif/in/",
            "--invocation-timeout",
            "1800",
            "--poll",
            "0.01",
        ]
    )
    assert rc == 0
    assert capsys.readouterr().out == answer  # JSON Lines printed as they came, one line per decision
    put = created(calls, "PutObject")
    invoked = created(calls, "InvokeEndpointAsync")
    assert (
        put["Bucket"] == "requests" and put["Key"].startswith("semif/in/") and put["Key"].endswith(".jsonl")
    )
    assert invoked == {
        "EndpointName": "semif-async",
        "InputLocation": f"s3://requests/{put['Key']}",
        "ContentType": "application/jsonlines",
        "Accept": "application/jsonlines",
        "InferenceId": put["Key"].removeprefix("semif/in/").removesuffix(".jsonl"),
        "InvocationTimeoutSeconds": 1800,
        "RequestTTLSeconds": 21600,
    }
    uploaded = boto3.client("s3", region_name="us-east-1").get_object(Bucket="requests", Key=put["Key"])
    assert uploaded["Body"].read() == request.read_bytes()


def test_async_invoke_reports_the_failure_location_content(
    moto_aws: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="requests")
    request = write(tmp_path, "one.json", json.dumps({"decision": DECISION}))
    queue_async_result('{"error": "request deadline of 900 s passed"}', failure=True)
    args = ["--async", "--endpoint", "semif-async", "--request", str(request)]
    rc = invoke_endpoint.main([*args, "--input-s3", "s3://requests", "--poll", "0.01"])
    assert rc != 0
    (line,) = error_lines(capsys)
    assert "async inference failed" in line and "request deadline of 900 s passed" in line


def test_waiting_for_an_answer_that_never_comes_times_out(moto_aws: None) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="answers")
    with pytest.raises(TimeoutError, match="async inference"):
        invoke_endpoint.wait_for_result(
            s3,
            output="s3://answers/semif/x.out",
            failure="s3://answers/semif/failures/x-error.out",
            timeout_s=0,
            interval_s=0,
            sleep=lambda _: None,
        )


def test_real_time_invoke_sends_json_lines_files_as_json_lines(
    moto_aws: None, calls: Calls, tmp_path: Path
) -> None:
    request = write(tmp_path, "batch.ndjson", json.dumps(DECISION) + "\n\n")
    assert invoke_endpoint.main(["--endpoint", "semif-rt", "--request", str(request)]) == 0
    invoked = created(calls, "InvokeEndpoint")
    assert (invoked["ContentType"], invoked["Accept"]) == ("application/jsonlines", "application/jsonlines")
    assert invoked["Body"] == request.read_bytes()


@pytest.mark.parametrize(
    ("extra", "text", "fragment"),
    [
        (["--async"], None, "--async needs --input-s3"),
        (["--input-s3", "s3://requests/x"], None, "--input-s3 apply to --async only"),
        (["--async", "--input-s3", "s3://requests", "--invocation-timeout", "0"], None, "between 1 and 3600"),
        (
            ["--async", "--input-s3", "s3://requests", "--ttl", "30"],
            None,
            "--ttl must be between 60 and 21600",
        ),
        (["--async", "--input-s3", "requests"], None, "is not an s3://"),
        (
            ["--async", "--input-s3", "s3://requests"],
            '{"id": "d1"}\n[1, 2]\n',
            "line 2 must be a JSON object",
        ),
        (["--async", "--input-s3", "s3://requests"], '{"id": "d1"}\nnot json\n', "line 2 is not JSON"),
        (["--async", "--input-s3", "s3://requests"], "\n\n", "has no decision lines"),
    ],
)
def test_bad_invoke_input_is_refused_before_any_aws_call(
    extra: list[str],
    text: str | None,
    fragment: str,
    calls: Calls,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    request = write(tmp_path, "batch.jsonl", text if text is not None else json.dumps(DECISION) + "\n")
    assert invoke_endpoint.main(["--endpoint", "semif-async", "--request", str(request), *extra]) != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert calls == []
