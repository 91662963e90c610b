"""semif-ops endpoint batch: the exact CreateTransformJob request (moto), waiting, failures, --stop.

moto implements CreateTransformJob/DescribeTransformJob (every job is Completed at once) and S3. A failed
job and StopTransformJob are beyond it (moto has no failing jobs and no StopTransformJob), so those two
cases use botocore's Stubber, which checks each request against the installed SageMaker service model.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from semif_ops.endpoint import batch as batch_transform
from tests.helpers.deploy import IMAGE

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
DATA = "s3://models/x/model.tar.gz"
IO = [
    "--input-s3",
    "s3://decisions/in/",
    "--output-s3",
    "s3://results/out/",
    "--instance-type",
    "ml.c5.xlarge",
]
BASE = ["--job-name", "semif-batch", "--model", "semif-model", *IO]
REASON = "ClientError: See job logs for more information"
Calls = list[tuple[str, str, dict[str, Any]]]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def make_model(environment: dict[str, str] | None = None, name: str = "semif-model") -> None:
    """The existing model --model names, with the environment a deploy gave it."""
    boto3.client("sagemaker", region_name="us-east-1").create_model(
        ModelName=name,
        ExecutionRoleArn=ROLE,
        PrimaryContainer={"Image": IMAGE, "ModelDataUrl": DATA, "Environment": environment or {}},
    )


DESCRIBED_MODEL = {
    "ModelName": "semif-model",
    "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/semif-model",
    "ExecutionRoleArn": ROLE,
    "PrimaryContainer": {"Image": IMAGE, "Environment": {}},
    "CreationTime": "2024-01-01T00:00:00Z",
}


def test_job_request_is_json_lines_multi_record_one_at_a_time(
    moto_aws: None, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="results")
    s3.put_object(Bucket="results", Key="out/part-1.jsonl.out", Body=b"{}\n")  # what SageMaker would write
    make_model()
    rc = batch_transform.main(
        [
            *BASE,
            "--instance-count",
            "2",
            "--max-payload-mb",
            "4",
            "--invocation-timeout",
            "1200",
            "--poll",
            "0",
        ]
    )
    assert rc == 0
    sent = [(service, op) for service, op, _ in calls]
    assert sent[:3] == [
        ("sagemaker", "DescribeModel"),  # the model's own environment must suit the job
        ("sagemaker", "CreateTransformJob"),
        ("sagemaker", "DescribeTransformJob"),
    ]
    request = calls[1][2]
    assert request == {
        "TransformJobName": "semif-batch",
        "ModelName": "semif-model",
        "MaxConcurrentTransforms": 1,
        "MaxPayloadInMB": 4,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {"InvocationsTimeoutInSeconds": 1200, "InvocationsMaxRetries": 0},
        "Environment": {"SEMIF_MAX_DECISIONS": "4096", "SEMIF_REQUEST_TIMEOUT_S": "1195"},
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://decisions/in/"}},
            "ContentType": "application/jsonlines",
            "CompressionType": "None",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": "s3://results/out/",
            "Accept": "application/jsonlines",
            "AssembleWith": "Line",
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 2},
        "Tags": [
            {"Key": "project", "Value": "semif-adapter"},
            {"Key": "transform-job", "Value": "semif-batch"},
        ],
    }
    out = capsys.readouterr().out
    assert "transform job semif-batch Completed; results under s3://results/out/" in out
    assert "s3://results/out/part-1.jsonl.out" in out
    stored = boto3.client("sagemaker", region_name="us-east-1").describe_transform_job(
        TransformJobName="semif-batch"
    )
    assert stored["BatchStrategy"] == "MultiRecord" and stored["MaxPayloadInMB"] == 4


def test_join_filters_env_and_a_created_model(moto_aws: None, calls: Calls) -> None:
    rc = batch_transform.main(
        [
            "--job-name",
            "semif-batch",
            "--image",
            IMAGE,
            "--model-data",
            DATA,
            "--role-arn",
            ROLE,
            *IO,
            "--join-input",
            "--output-filter",
            "$['id','SageMakerOutput']",
            "--request-timeout-s",
            "3000",
            "--max-decisions",
            "512",
            "--env",
            "SEMIF_N_THREADS=8",
            "--no-wait",
        ]
    )
    assert rc == 0
    assert [op for _, op, _ in calls] == ["CreateModel", "CreateTransformJob"]
    model, job = calls[0][2], calls[1][2]
    assert model["ModelName"] == job["ModelName"] == "semif-batch"
    assert model["PrimaryContainer"]["Image"] == IMAGE
    assert model["EnableNetworkIsolation"] is True
    assert job["DataProcessing"] == {"OutputFilter": "$['id','SageMakerOutput']", "JoinSource": "Input"}
    assert job["Environment"] == {
        "SEMIF_MAX_DECISIONS": "512",
        "SEMIF_REQUEST_TIMEOUT_S": "3000",
        "SEMIF_N_THREADS": "8",
    }
    assert job["ModelClientConfig"]["InvocationsTimeoutInSeconds"] == 3600


def test_failed_job_prints_its_failure_reason(use_clients: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Stubber: moto's transform jobs always complete, so a failure and its reason cannot happen there."""
    sm = boto3.client("sagemaker", region_name="us-east-1")
    stub = Stubber(sm)
    stub.add_response("describe_model", DESCRIBED_MODEL, {"ModelName": "semif-model"})
    stub.add_response(
        "create_transform_job",
        {"TransformJobArn": "arn:aws:sagemaker:us-east-1:123456789012:transform-job/semif-batch"},
        {
            "TransformJobName": "semif-batch",
            "ModelName": "semif-model",
            "MaxConcurrentTransforms": 1,
            "MaxPayloadInMB": 1,
            "BatchStrategy": "MultiRecord",
            "ModelClientConfig": ANY,
            "Environment": ANY,
            "TransformInput": ANY,
            "TransformOutput": ANY,
            "TransformResources": ANY,
            "Tags": ANY,
        },
    )
    described = {
        "TransformJobName": "semif-batch",
        "TransformJobArn": "arn:aws:sagemaker:us-east-1:123456789012:transform-job/semif-batch",
        "ModelName": "semif-model",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://decisions/in/"}}
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
        "CreationTime": "2024-01-01T00:00:00Z",
    }
    stub.add_response("describe_transform_job", {**described, "TransformJobStatus": "InProgress"})
    stub.add_response(
        "describe_transform_job", {**described, "TransformJobStatus": "Failed", "FailureReason": REASON}
    )
    use_clients(sagemaker=sm)
    with stub:
        rc = batch_transform.main([*BASE, "--poll", "0"])
        stub.assert_no_pending_responses()
    assert rc != 0
    assert error_lines(capsys) == [f"error: transform job semif-batch is Failed: {REASON}"]


def test_stop_ends_a_running_job(use_clients: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Stubber: moto does not implement StopTransformJob."""
    sm = boto3.client("sagemaker", region_name="us-east-1")
    stub = Stubber(sm)
    stub.add_response(
        "describe_transform_job",
        {
            "TransformJobName": "semif-batch",
            "TransformJobArn": "arn:aws:sagemaker:us-east-1:123456789012:transform-job/semif-batch",
            "TransformJobStatus": "InProgress",
            "ModelName": "semif-model",
            "TransformInput": {
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://d/in/"}}
            },
            "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
            "CreationTime": "2024-01-01T00:00:00Z",
        },
        {"TransformJobName": "semif-batch"},
    )
    stub.add_response("stop_transform_job", {}, {"TransformJobName": "semif-batch"})
    use_clients(sagemaker=sm)
    with stub:
        assert batch_transform.main(["--stop", "semif-batch"]) == 0
        stub.assert_no_pending_responses()
    assert "stopping transform job semif-batch (was InProgress)" in capsys.readouterr().out


def test_stop_leaves_a_finished_job_alone(
    moto_aws: None, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    make_model()
    assert batch_transform.main([*BASE, "--no-wait"]) == 0
    calls.clear()
    assert batch_transform.main(["--stop", "semif-batch"]) == 0
    assert [op for _, op, _ in calls] == ["DescribeTransformJob"]
    assert "already Completed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([*BASE, "--max-payload-mb", "7"], "between 1 and 6"),
        ([*BASE, "--max-payload-mb", "0"], "between 1 and 6"),
        ([*BASE, "--max-payload-mb", "2", "--env", "SEMIF_MAX_BODY_BYTES=1048576"], "between 1 and 1 "),
        ([*BASE, "--env", "SEMIF_MAX_BODY_BYTES=lots"], "not a whole number"),
        (["--job-name", "semif-batch", *IO], "give --model NAME, or --image"),
        ([*BASE, "--image", IMAGE], "drop --image"),
        (
            ["--image", IMAGE.split("@")[0] + ":latest", "--model-data", DATA, "--role-arn", ROLE, *IO],
            "not pinned by digest",
        ),
        ([*BASE, "--invocation-timeout", "4000"], "between 1 and 3600"),
        ([*BASE, "--max-retries", "4"], "between 0 and 3"),
        ([*BASE, "--max-decisions", "5000"], "between 1 and 4096"),
        ([*BASE, "--invocation-timeout", "60", "--request-timeout-s", "90"], "between 1 and 60"),
        ([*BASE, "--output-filter", "$.id"], "add --join-input"),
        ([*BASE, "--input-filter", "id"], "JSONPath starting with '$'"),
        ([*BASE, *[f"--env=K{i}=v" for i in range(15)]], "at most 16 environment variables"),
        (["--job-name", "semif-batch", "--model", "m", "--output-s3", "s3://results/o"], "--input-s3"),
        ([*BASE, "--input-s3", "decisions/in"], "is not an s3://"),
        ([*BASE, "--instance-type", "c5.xlarge"], "ml.<family>.<size>"),
        ([*BASE, "--job-name", "semif_batch"], "letters, digits and hyphens"),
        (["--stop", "bad_name"], "letters, digits and hyphens"),
    ],
)
def test_bad_input_is_refused_before_any_aws_call(
    args: list[str], fragment: str, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    assert batch_transform.main(args) != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert calls == []


@pytest.mark.parametrize(
    ("environment", "args", "fragment"),
    [
        (  # deployed with --max-body-bytes 524288: no payload of 1 MB or more fits
            {"SEMIF_MAX_BODY_BYTES": "524288"},
            [],
            "SEMIF_MAX_BODY_BYTES=524288 (deployed with --max-body-bytes), below --max-payload-mb 1 (1048576 "
            "bytes): use a model made without --max-body-bytes",
        ),
        (
            {"SEMIF_MAX_BODY_BYTES": str(2 * 1024 * 1024)},
            ["--max-payload-mb", "4"],
            "pass --max-payload-mb 2 or less",
        ),
        (  # deployed --async with --invocation-timeout 1800
            {"SEMIF_REQUEST_TIMEOUT_S": "1795"},
            ["--invocation-timeout", "600"],
            "SEMIF_REQUEST_TIMEOUT_S=1795 (a 1795 s deadline, e.g. from an --async deploy), beyond "
            "--invocation-timeout 600: SageMaker would end requests first; pass --invocation-timeout 1800",
        ),
        ({"SEMIF_REQUEST_TIMEOUT_S": "0"}, [], "(no deadline, e.g. from an --async deploy)"),
        (None, ["--model", "semif-other"], "--model semif-other: no such SageMaker model in this region"),
    ],
)
def test_the_models_own_environment_is_checked_before_the_job_starts(
    moto_aws: None,
    calls: Calls,
    capsys: pytest.CaptureFixture[str],
    environment: dict[str, str] | None,
    args: list[str],
    fragment: str,
) -> None:
    make_model(environment)
    assert batch_transform.main([*BASE, *args, "--no-wait"]) != 0
    (line,) = error_lines(capsys)
    assert f"model {BASE[3]} carries " in line or "no such" in line
    assert fragment in line
    assert [op for _, op, _ in calls] == ["DescribeModel"]  # no job started


def test_a_model_whose_limits_fit_the_job_runs_it(moto_aws: None, calls: Calls) -> None:
    make_model({"SEMIF_MAX_BODY_BYTES": str(2 * 1024 * 1024), "SEMIF_REQUEST_TIMEOUT_S": "595"})
    args = [*BASE, "--max-payload-mb", "2", "--invocation-timeout", "600", "--no-wait"]
    assert batch_transform.main(args) == 0
    assert [op for _, op, _ in calls] == ["DescribeModel", "CreateTransformJob"]


def test_installed_botocore_knows_the_transform_fields_used() -> None:
    """The request above is only meaningful if this botocore's SageMaker model has these members."""
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    members = model.operation_model("CreateTransformJob").input_shape.members
    assert {"ModelClientConfig", "DataProcessing", "Environment", "BatchStrategy"} <= set(members)
    assert model.shape_for("JoinSource").enum == ["Input", "None"]
