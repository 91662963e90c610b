"""semif-ops endpoint scale and the autoscaling part of semif-ops endpoint cleanup, against moto.

moto implements Application Auto Scaling (register/deregister targets, put/describe/delete policies),
CloudWatch alarms and the SageMaker endpoint calls used here, so no Stubber is needed.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from semif_ops.endpoint import cleanup as cleanup_endpoint
from semif_ops.endpoint import deploy as deploy_endpoint
from semif_ops.endpoint import scale as autoscale_endpoint
from tests.helpers.deploy import IMAGE

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
RID = "endpoint/semif-scale/variant/AllTraffic"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
Calls = list[tuple[str, str, dict[str, Any]]]


def deploy(name: str = "semif-scale", *extra: str) -> None:
    args = ["--name", name, "--role-arn", ROLE, "--image", IMAGE]
    args += ["--model-data", "s3://models/x/model.tar.gz", "--instance-type", "ml.c5.xlarge", *extra]
    assert deploy_endpoint.main(args) == 0


def deploy_async(name: str = "semif-scale") -> None:
    deploy(name, "--async", "--output-s3", "s3://answers/semif")


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def aas() -> Any:
    return boto3.client("application-autoscaling", region_name="us-east-1")


def state() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(scalable targets, scaling policies, alarm names) as moto holds them now."""
    targets = aas().describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    policies = aas().describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    alarms = boto3.client("cloudwatch", region_name="us-east-1").describe_alarms()["MetricAlarms"]
    return targets, policies, [a["AlarmName"] for a in alarms]


def test_real_time_endpoint_tracks_concurrency_per_instance(
    moto_aws: None, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy()
    calls.clear()
    assert autoscale_endpoint.main(["--endpoint", "semif-scale", "--max", "4"]) == 0

    sent = [(op, params) for service, op, params in calls if service == "application-autoscaling"]
    assert sent == [
        (
            "RegisterScalableTarget",
            {
                "ServiceNamespace": "sagemaker",
                "ResourceId": RID,
                "ScalableDimension": DIMENSION,
                "MinCapacity": 1,
                "MaxCapacity": 4,
            },
        ),
        (
            "PutScalingPolicy",
            {
                "ServiceNamespace": "sagemaker",
                "ResourceId": RID,
                "ScalableDimension": DIMENSION,
                "PolicyName": "semif-target-tracking",
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingScalingPolicyConfiguration": {
                    "TargetValue": 0.5,
                    "PredefinedMetricSpecification": {
                        "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"
                    },
                    "ScaleOutCooldown": 60,
                    "ScaleInCooldown": 600,
                },
            },
        ),
        # a real-time target never gets the scale-from-zero pieces; the re-run guard only looks
        (
            "DescribeScalingPolicies",
            {"ServiceNamespace": "sagemaker", "ResourceId": RID, "ScalableDimension": DIMENSION},
        ),
    ]
    targets, policies, alarms = state()
    assert [(t["ResourceId"], t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(RID, 1, 4)]
    assert [p["PolicyName"] for p in policies] == ["semif-target-tracking"]
    assert alarms == []
    assert "concurrency target 0.5" in capsys.readouterr().out


def test_invocations_metric_uses_the_given_target_and_cooldowns(moto_aws: None, calls: Calls) -> None:
    deploy()
    calls.clear()
    rc = autoscale_endpoint.main(
        [
            "--endpoint",
            "semif-scale",
            "--metric",
            "invocations",
            "--target",
            "20",
            "--min",
            "2",
            "--max",
            "6",
            "--scale-in-cooldown",
            "900",
            "--scale-out-cooldown",
            "120",
        ]
    )
    assert rc == 0
    (policy,) = [p for _, op, p in calls if op == "PutScalingPolicy"]
    assert policy["TargetTrackingScalingPolicyConfiguration"] == {
        "TargetValue": 20.0,
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleOutCooldown": 120,
        "ScaleInCooldown": 900,
    }
    (register,) = [p for _, op, p in calls if op == "RegisterScalableTarget"]
    assert (register["MinCapacity"], register["MaxCapacity"]) == (2, 6)


def test_remove_deletes_policies_before_the_target(moto_aws: None, calls: Calls) -> None:
    deploy()
    assert autoscale_endpoint.main(["--endpoint", "semif-scale", "--max", "3"]) == 0
    calls.clear()
    assert autoscale_endpoint.main(["--endpoint", "semif-scale", "--remove"]) == 0
    changes = [op for _, op, _ in calls if not op.startswith("Describe")]
    assert changes == ["DeleteScalingPolicy", "DeregisterScalableTarget"]
    assert state() == ([], [], [])
    # the endpoint itself is untouched
    sm = boto3.client("sagemaker", region_name="us-east-1")
    assert sm.describe_endpoint(EndpointName="semif-scale")["EndpointStatus"] == "InService"


def test_remove_with_nothing_registered_says_so(moto_aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert autoscale_endpoint.main(["--endpoint", "semif-scale", "--remove"]) == 0
    assert f"no autoscaling registered for {RID}" in capsys.readouterr().out


def test_async_scale_to_zero_adds_step_policy_and_alarm(moto_aws: None, calls: Calls) -> None:
    deploy_async()
    calls.clear()
    args = ["--endpoint", "semif-scale", "--metric", "backlog", "--min", "0", "--max", "2"]
    assert autoscale_endpoint.main(args) == 0

    tracking, step = [p for _, op, p in calls if op == "PutScalingPolicy"]
    assert tracking["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"] == {
        "MetricName": "ApproximateBacklogSizePerInstance",
        "Namespace": "AWS/SageMaker",
        "Dimensions": [{"Name": "EndpointName", "Value": "semif-scale"}],
        "Statistic": "Average",
    }
    assert step["PolicyType"] == "StepScaling"
    assert step["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}
    ]
    targets, policies, alarms = state()
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(0, 2)]
    step_arn = next(p["PolicyARN"] for p in policies if p["PolicyName"] == "semif-scale-from-zero")
    (alarm,) = boto3.client("cloudwatch", region_name="us-east-1").describe_alarms()["MetricAlarms"]
    assert alarm["MetricName"] == "HasBacklogWithoutCapacity"
    assert alarm["Dimensions"] == [{"Name": "EndpointName", "Value": "semif-scale"}]
    assert alarm["AlarmActions"] == [step_arn]

    # raising the floor to 1 takes the scale-from-zero policy and its alarm away again
    assert autoscale_endpoint.main([*args[:-4], "--min", "1", "--max", "2"]) == 0
    targets, policies, alarms = state()
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(1, 2)]
    assert [p["PolicyName"] for p in policies] == ["semif-target-tracking"]
    assert alarms == []


def test_cleanup_removes_autoscaling_before_deleting_the_endpoint(
    moto_aws: None, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy_async()
    args = ["--endpoint", "semif-scale", "--metric", "backlog", "--min", "0", "--max", "2"]
    assert autoscale_endpoint.main(args) == 0
    calls.clear()

    assert cleanup_endpoint.main(["--endpoint", "semif-scale", "--poll", "0"]) == 0

    changes = [op for _, op, _ in calls if not op.startswith(("Describe", "List"))]
    assert changes[-3:] == ["DeleteEndpoint", "DeleteEndpointConfig", "DeleteModel"]
    before = changes[:-3]
    # the step policy's alarm first (AWS leaves it behind otherwise), then the policies, then the target
    assert before == ["DeleteAlarms", *["DeleteScalingPolicy"] * 2, "DeregisterScalableTarget"]
    assert state() == ([], [], [])
    assert boto3.client("sagemaker", region_name="us-east-1").list_endpoints()["Endpoints"] == []
    out = capsys.readouterr().out
    assert f"deregistered scalable target {RID}" in out
    assert "remaining: nothing named *semif-scale*" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--endpoint", "bad_name", "--max", "2"], "letters, digits and hyphens"),
        (["--endpoint", "semif-scale"], "--max is required"),
        (["--endpoint", "semif-scale", "--min", "0", "--max", "2"], "needs --metric backlog"),
        (["--endpoint", "semif-scale", "--min", "3", "--max", "2"], "at least --min (3)"),
        (["--endpoint", "semif-scale", "--max", "2", "--target", "1.5"], "at most 1"),
        (["--endpoint", "semif-scale", "--max", "2", "--target", "0"], "must be above 0"),
        (["--endpoint", "semif-scale", "--max", "2", "--metric", "invocations"], "needs --target"),
        (["--endpoint", "semif-scale", "--max", "2", "--scale-in-cooldown", "-5"], "between 0 and 86400"),
        (["--endpoint", "semif-scale", "--remove", "--max", "2"], "--remove takes no --max"),
    ],
)
def test_bad_input_is_refused_before_any_aws_call(
    args: list[str], fragment: str, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    assert autoscale_endpoint.main(args) != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert calls == []


@pytest.mark.parametrize(
    ("make", "args", "fragment"),
    [
        (deploy, ["--metric", "backlog", "--max", "2"], "is real-time: --metric backlog needs an async"),
        (deploy_async, ["--max", "2"], "is asynchronous: use --metric backlog"),
        (deploy, ["--variant", "Blue", "--max", "2"], "has no variant 'Blue'"),
    ],
)
def test_endpoint_mismatch_is_refused_before_registering(
    moto_aws: None,
    calls: Calls,
    capsys: pytest.CaptureFixture[str],
    make: Any,
    args: list[str],
    fragment: str,
) -> None:
    make()
    calls.clear()
    assert autoscale_endpoint.main(["--endpoint", "semif-scale", *args]) != 0
    lines = error_lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]
    assert [op for service, op, _ in calls if service != "sagemaker"] == []
    assert state() == ([], [], [])


ALARM = "semif-semif-scale-AllTraffic-backlog-without-capacity"


def without_the_endpoint(name: str = "semif-scale") -> None:
    """What DeleteEndpoint does on AWS (moto does not): deregister the variant's scalable target and its
    policies without a word. The step policy's alarm stays, as it does on AWS."""
    keys = {"ServiceNamespace": "sagemaker", "ResourceId": RID, "ScalableDimension": DIMENSION}
    for policy in aas().describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]:
        aas().delete_scaling_policy(PolicyName=policy["PolicyName"], **keys)
    aas().deregister_scalable_target(**keys)
    boto3.client("sagemaker", region_name="us-east-1").delete_endpoint(EndpointName=name)


@pytest.mark.parametrize("command", ["scale --remove", "cleanup"])
def test_an_alarm_left_by_a_deleted_endpoint_is_found_by_its_name(
    moto_aws: None, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy_async()
    args = ["--endpoint", "semif-scale", "--metric", "backlog", "--min", "0", "--max", "2"]
    assert autoscale_endpoint.main(args) == 0
    boto3.client("cloudwatch", region_name="us-east-1").put_metric_alarm(
        AlarmName="someone-elses", MetricName="CPUUtilization", Namespace="AWS/EC2", Statistic="Average",
        Period=60, EvaluationPeriods=1, Threshold=90.0, ComparisonOperator="GreaterThanThreshold",
    )  # fmt: skip
    without_the_endpoint()
    assert state() == ([], [], [ALARM, "someone-elses"])  # a partial cleanup: no policy leads to the alarm

    if command == "cleanup":
        assert cleanup_endpoint.main(["--endpoint", "semif-scale", "--poll", "0"]) == 0
    else:
        assert autoscale_endpoint.main(["--endpoint", "semif-scale", "--remove"]) == 0
    assert state() == ([], [], ["someone-elses"])  # only ours, found by its name
    assert f"deleted alarm {ALARM}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("service", "operation", "action"),
    [
        (
            "application_autoscaling",
            "describe_scaling_policies",
            "application-autoscaling:DescribeScalingPolicies",
        ),
        ("cloudwatch", "describe_alarms", "cloudwatch:DescribeAlarms"),
    ],
)
def test_cleanup_without_autoscaling_rights_stops_before_the_endpoint(
    moto_aws: None,
    use_clients: Any,
    capsys: pytest.CaptureFixture[str],
    service: str,
    operation: str,
    action: str,
) -> None:
    """Stubber for the refused call: moto does not enforce IAM, so it cannot refuse one."""
    deploy()
    clients = {
        name: boto3.client(name.replace("_", "-"), region_name="us-east-1")
        for name in ("sagemaker", "application_autoscaling", "cloudwatch")
    }
    stub = Stubber(clients[service])
    stub.add_client_error(
        operation,
        service_error_code="AccessDeniedException",
        service_message=f"not authorized to perform: {action}",
        http_status_code=400,
    )
    use_clients(**clients)
    with stub:
        assert cleanup_endpoint.main(["--endpoint", "semif-scale", "--poll", "0"]) != 0
        stub.assert_no_pending_responses()
    (line,) = error_lines(capsys)
    assert f"not allowed to call {action} (AccessDeniedException), so semif-scale was not deleted" in line
    assert "before DeleteEndpoint" in line
    # AWS wants autoscaling gone before DeleteEndpoint: the endpoint stays for a re-run with the right
    assert [e["EndpointName"] for e in clients["sagemaker"].list_endpoints()["Endpoints"]] == ["semif-scale"]


def test_cleanup_stops_on_other_autoscaling_errors(
    moto_aws: None, use_clients: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stubber for Application Auto Scaling: moto cannot be made to fail a DescribeScalingPolicies."""
    deploy()
    failing = boto3.client("application-autoscaling", region_name="us-east-1")
    stub = Stubber(failing)
    stub.add_client_error(
        "describe_scaling_policies", service_error_code="InternalServiceException", http_status_code=500
    )
    sm = boto3.client("sagemaker", region_name="us-east-1")
    use_clients(sagemaker=sm, application_autoscaling=failing, cloudwatch=None)
    with stub:
        assert cleanup_endpoint.main(["--endpoint", "semif-scale", "--poll", "0"]) != 0
    assert "InternalServiceException" in error_lines(capsys)[0]
    # the endpoint is left for a re-run rather than deleted with its scaling unknown
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["semif-scale"]
