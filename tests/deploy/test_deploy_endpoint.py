"""semif-ops endpoint deploy: exact SageMaker calls (moto), digest rule, and instance pools.

moto 5.x rejects a ProductionVariant without InstanceType, so the instance-pool deployment is checked with
botocore's Stubber, which validates every request against the installed SageMaker service model.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from semif_ops.endpoint import deploy as deploy_endpoint
from tests.helpers.deploy import DIGEST, IMAGE

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
DATA = "s3://models/semif/qwen/model.tar.gz"
REASON = "The primary container for production variant AllTraffic did not pass the ping health check."
BASE_ARGS = ["--name", "semif-test", "--role-arn", ROLE, "--model-data", DATA]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_single_instance_deploy_makes_exact_calls_in_order(
    moto_aws: None, calls: list[tuple[str, str, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = deploy_endpoint.main(
        [
            *BASE_ARGS,
            "--image",
            IMAGE,
            "--instance-type",
            "ml.c5.xlarge",
            "--threads",
            "4",
            "--max-decisions",
            "32",
            "--gpu-layers",
            "0",
            "--env",
            "SEMIF_LOG_LEVEL=debug",
            "--startup-timeout",
            "1200",
            "--download-timeout",
            "600",
            "--wait",
            "--poll",
            "0",
        ]
    )
    assert rc == 0
    ops = [(service, op) for service, op, _ in calls]
    assert ops == [
        ("sagemaker", "CreateModel"),
        ("sagemaker", "CreateEndpointConfig"),
        ("sagemaker", "CreateEndpoint"),
        ("sagemaker", "DescribeEndpoint"),
    ]
    model, config, endpoint = (params for _, _, params in calls[:3])
    assert model["EnableNetworkIsolation"] is True
    assert model["ExecutionRoleArn"] == ROLE
    assert model["PrimaryContainer"] == {
        "Image": IMAGE,
        "ModelDataUrl": DATA,
        "Environment": {
            "SEMIF_N_THREADS": "4",
            "SEMIF_N_GPU_LAYERS": "0",
            "SEMIF_MAX_DECISIONS": "32",
            "SEMIF_LOG_LEVEL": "debug",
        },
    }
    (variant,) = config["ProductionVariants"]
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": model["ModelName"],
        "InitialInstanceCount": 1,
        "InitialVariantWeight": 1.0,
        "InstanceType": "ml.c5.xlarge",
        "ContainerStartupHealthCheckTimeoutInSeconds": 1200,
        "ModelDataDownloadTimeoutInSeconds": 600,
    }
    assert endpoint["EndpointName"] == "semif-test"
    assert endpoint["EndpointConfigName"] == config["EndpointConfigName"]
    assert model["ModelName"].startswith("semif-test-")
    sm = boto3.client("sagemaker", region_name="us-east-1")
    assert sm.describe_endpoint(EndpointName="semif-test")["EndpointStatus"] == "InService"
    assert "endpoint semif-test is InService" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("image", "fragment"),
    [
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-cpu:latest", "not pinned by digest"),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-cpu", "not pinned by digest"),
        (IMAGE[:-1], "malformed digest"),
        (IMAGE.replace(DIGEST, DIGEST.upper()), "malformed digest"),
        (IMAGE.replace("@", ":v1@"), "names a tag and a digest"),
    ],
)
def test_mutable_or_wrong_image_is_refused_before_any_aws_call(
    image: str, fragment: str, calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = deploy_endpoint.main([*BASE_ARGS, "--image", image, "--instance-type", "ml.c5.xlarge"])
    assert rc != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert calls == []


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--model-data", "s3://models/model.gguf"], "model.tar.gz"),
        (["--role-arn", "SageMakerRole"], "not an IAM role ARN"),
        (["--startup-timeout", "30"], "between 60 and 3600"),
        (["--provision-timeout", "600"], "--instance-pool only"),
    ],
)
def test_other_bad_input_is_refused_before_any_aws_call(
    extra: list[str], fragment: str, calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = deploy_endpoint.main([*BASE_ARGS, "--image", IMAGE, "--instance-type", "ml.c5.xlarge", *extra])
    assert rc != 0
    assert fragment in error_lines(capsys)[0]
    assert calls == []


def test_pool_with_too_many_types_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    pool = ",".join(f"ml.g{i}.xlarge" for i in range(6))
    with pytest.raises(SystemExit) as exit_:
        deploy_endpoint.main([*BASE_ARGS, "--image", IMAGE, "--instance-pool", pool])
    assert exit_.value.code == 2
    assert "1 to 5 instance types" in capsys.readouterr().err


def test_instance_pool_is_sent_as_prioritised_pools_and_failure_reason_printed(
    use_clients: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sm = boto3.client("sagemaker", region_name="us-east-1")
    stub = Stubber(sm)
    stub.add_response(
        "create_model",
        {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m"},
        {
            "ModelName": ANY,
            "ExecutionRoleArn": ROLE,
            "PrimaryContainer": {
                "Image": IMAGE,
                "ModelDataUrl": DATA,
                "Environment": {"SEMIF_N_GPU_LAYERS": "-1"},
            },
            "EnableNetworkIsolation": True,
            "Tags": ANY,
        },
    )
    stub.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/c"},
        {
            "EndpointConfigName": ANY,
            "Tags": ANY,
            "ProductionVariants": [
                {
                    "VariantName": "AllTraffic",
                    "ModelName": ANY,
                    "InitialInstanceCount": 1,
                    "InitialVariantWeight": 1.0,
                    "InstancePools": [
                        {"InstanceType": "ml.g6.xlarge", "Priority": 1},
                        {"InstanceType": "ml.g5.xlarge", "Priority": 2},
                        {"InstanceType": "ml.g4dn.xlarge", "Priority": 3},
                    ],
                    "VariantInstanceProvisionTimeoutInSeconds": 900,
                    "ContainerStartupHealthCheckTimeoutInSeconds": 900,
                    "ModelDataDownloadTimeoutInSeconds": 900,
                }
            ],
        },
    )
    stub.add_response(
        "create_endpoint",
        {"EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/e"},
        {"EndpointName": "semif-test", "EndpointConfigName": ANY, "Tags": ANY},
    )
    described = {
        "EndpointName": "semif-test",
        "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/semif-test",
        "EndpointConfigName": "c",
        "CreationTime": "2024-01-01T00:00:00Z",
        "LastModifiedTime": "2024-01-01T00:00:00Z",
    }
    stub.add_response(
        "describe_endpoint", {**described, "EndpointStatus": "Creating"}, {"EndpointName": "semif-test"}
    )
    stub.add_response(
        "describe_endpoint",
        {
            **described,
            "EndpointStatus": "Failed",
            "FailureReason": REASON,
        },
        {"EndpointName": "semif-test"},
    )
    use_clients(sagemaker=sm)
    with stub:
        rc = deploy_endpoint.main(
            [
                *BASE_ARGS,
                "--image",
                IMAGE,
                "--instance-pool",
                "ml.g6.xlarge,ml.g5.xlarge,ml.g4dn.xlarge",
                "--gpu-layers",
                "-1",
                "--provision-timeout",
                "900",
                "--wait",
                "--poll",
                "0",
            ]
        )
        stub.assert_no_pending_responses()
    assert rc != 0
    lines = error_lines(capsys)
    assert lines == [f"error: endpoint semif-test is Failed: {REASON}"]


def test_installed_botocore_knows_instance_pools() -> None:
    """The pool shape above is only meaningful if this botocore's SageMaker model has it."""
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    variant = model.shape_for("ProductionVariant")
    pool = variant.members["InstancePools"].member
    assert set(pool.members) >= {"InstanceType", "Priority"}
    assert "VariantInstanceProvisionTimeoutInSeconds" in variant.members
