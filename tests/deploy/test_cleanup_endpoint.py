"""semif-ops endpoint cleanup against moto: delete order, waiting, tolerance of missing pieces."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from semif_ops.endpoint import cleanup as cleanup_endpoint
from semif_ops.endpoint import deploy as deploy_endpoint
from tests.helpers.deploy import IMAGE

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


def deploy(name: str) -> None:
    rc = deploy_endpoint.main(
        [
            "--name",
            name,
            "--role-arn",
            ROLE,
            "--image",
            IMAGE,
            "--model-data",
            "s3://models/x/model.tar.gz",
            "--instance-type",
            "ml.c5.xlarge",
        ]
    )
    assert rc == 0


def test_deletes_endpoint_then_config_then_model(
    moto_aws: None, calls: list[tuple[str, str, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    deploy("semif-clean")
    created = {op: params for _, op, params in calls}  # the semif-clean resources
    deploy("other-endpoint")
    calls.clear()

    assert cleanup_endpoint.main(["--endpoint", "semif-clean", "--poll", "0"]) == 0

    deletes = [(op, params) for _, op, params in calls if op.startswith("Delete")]
    assert deletes == [
        ("DeleteEndpoint", {"EndpointName": "semif-clean"}),
        (
            "DeleteEndpointConfig",
            {"EndpointConfigName": created["CreateEndpointConfig"]["EndpointConfigName"]},
        ),
        ("DeleteModel", {"ModelName": created["CreateModel"]["ModelName"]}),
    ]
    ops = [op for _, op, _ in calls]
    # the endpoint is confirmed gone (a DescribeEndpoint after the delete) before its config is deleted
    assert ops.index("DeleteEndpoint") < max(i for i, op in enumerate(ops) if op == "DescribeEndpoint")
    assert max(i for i, op in enumerate(ops) if op == "DescribeEndpoint") < ops.index("DeleteEndpointConfig")

    sm = boto3.client("sagemaker", region_name="us-east-1")
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["other-endpoint"]
    assert all(m["ModelName"].startswith("other-endpoint-") for m in sm.list_models()["Models"])
    out = capsys.readouterr().out
    assert "remaining: nothing named *semif-clean*" in out


def test_rerun_tolerates_already_deleted_pieces(moto_aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    deploy("semif-clean")
    sm = boto3.client("sagemaker", region_name="us-east-1")
    config = sm.describe_endpoint(EndpointName="semif-clean")["EndpointConfigName"]
    model = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]["ModelName"]
    sm.delete_model(ModelName=model)  # someone removed the model by hand already
    assert cleanup_endpoint.main(["--endpoint", "semif-clean", "--poll", "0"]) == 0
    out = capsys.readouterr().out
    assert f"already gone: model {model}" in out
    assert (
        cleanup_endpoint.main(["--endpoint", "semif-clean", "--endpoint-config", config, "--poll", "0"]) == 0
    )
    out = capsys.readouterr().out
    assert "endpoint semif-clean already gone" in out
    assert f"already gone: endpoint config {config}" in out


def test_models_of_includes_pool_overrides() -> None:
    config = {
        "ProductionVariants": [
            {
                "ModelName": "m1",
                "InstancePools": [
                    {"InstanceType": "ml.g6.xlarge", "Priority": 1},
                    {"InstanceType": "ml.g5.xlarge", "Priority": 2, "ModelNameOverride": "m2"},
                ],
            }
        ]
    }
    assert cleanup_endpoint.models_of(config) == ["m1", "m2"]
