"""Scale an endpoint variant's instance count with Application Auto Scaling (target tracking).

One semif-adapter container runs one decision batch at a time and answers 503 at once when busy, so more
traffic needs more instances. The default metric is the variant's concurrency per model copy (one copy per
instance here), sampled every 10 s: --target 0.5 keeps each instance busy about half the time, leaving
headroom before callers start seeing 503s. --metric invocations (invocations per instance per minute) is
the fallback; its target depends on your request latency: 60 / seconds-per-request x utilisation.
Asynchronous endpoints use --metric backlog (queued requests per instance) and may scale to zero with
--min 0, which adds a step policy and an alarm on HasBacklogWithoutCapacity to start the first instance.

    semif-ops endpoint scale --endpoint semif-qwen --min 1 --max 4
    semif-ops endpoint scale --endpoint semif-qwen-async --metric backlog --min 0 --max 4
    semif-ops endpoint scale --endpoint semif-qwen --remove

semif-ops endpoint cleanup removes the policies and the scalable target itself before deleting the endpoint.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from semif_ops import aws
from semif_ops.endpoint.autoscaling import (
    DIMENSION,
    FROM_ZERO_POLICY,
    NAMESPACE,
    TRACKING_POLICY,
    alarm_name,
    delete_policies,
    remove_scaling,
    resource_id,
)
from semif_ops.endpoint.sagemaker import VARIANT
from semif_ops.exits import command

MAX_COOLDOWN_S = 86400


@dataclass(frozen=True)
class Metric:
    default_target: float | None
    max_target: float | None
    help: str


METRICS = {
    "concurrency": Metric(0.5, 1.0, "requests in flight per instance (high resolution); target 0-1"),
    "invocations": Metric(None, None, "invocations per instance per minute; --target required"),
    "backlog": Metric(2.0, None, "async only: queued requests per instance; allows --min 0"),
}


def tracking_configuration(
    metric: str, target: float, endpoint: str, *, scale_in_cooldown: int, scale_out_cooldown: int
) -> dict[str, Any]:
    """TargetTrackingScalingPolicyConfiguration for one of METRICS."""
    config: dict[str, Any] = {
        "TargetValue": target,
        "ScaleInCooldown": scale_in_cooldown,
        "ScaleOutCooldown": scale_out_cooldown,
    }
    if metric == "concurrency":
        config["PredefinedMetricSpecification"] = {
            "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"
        }
    elif metric == "invocations":
        config["PredefinedMetricSpecification"] = {
            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
        }
    else:
        config["CustomizedMetricSpecification"] = {
            "MetricName": "ApproximateBacklogSizePerInstance",
            "Namespace": "AWS/SageMaker",
            "Dimensions": [{"Name": "EndpointName", "Value": endpoint}],
            "Statistic": "Average",
        }
    return config


def check_endpoint(sm: Any, endpoint: str, variant: str, metric: str) -> None:
    """The endpoint must be InService, have the variant, and be async exactly when the metric is backlog."""
    described = sm.describe_endpoint(EndpointName=endpoint)
    status = described["EndpointStatus"]
    if status != "InService":
        raise aws.UsageError(
            f"endpoint {endpoint} is {status}; autoscaling can be set on InService endpoints"
        )
    variants = [v["VariantName"] for v in described.get("ProductionVariants", [])]
    if variants and variant not in variants:
        raise aws.UsageError(f"endpoint {endpoint} has no variant {variant!r} (it has {', '.join(variants)})")
    config = sm.describe_endpoint_config(EndpointConfigName=described["EndpointConfigName"])
    is_async = bool(config.get("AsyncInferenceConfig"))
    if is_async and metric != "backlog":
        raise aws.UsageError(f"endpoint {endpoint} is asynchronous: use --metric backlog")
    if not is_async and metric == "backlog":
        raise aws.UsageError(f"endpoint {endpoint} is real-time: --metric backlog needs an async endpoint")


def apply_scaling(
    aas: Any,
    cw: Any,
    *,
    endpoint: str,
    variant: str,
    min_capacity: int,
    max_capacity: int,
    metric: str,
    target: float,
    scale_in_cooldown: int,
    scale_out_cooldown: int,
) -> list[str]:
    """Register the variant (min/max) and put the tracking policy; scale-from-zero pieces when min is 0."""
    rid = resource_id(endpoint, variant)
    keys = {"ServiceNamespace": NAMESPACE, "ResourceId": rid, "ScalableDimension": DIMENSION}
    aas.register_scalable_target(**keys, MinCapacity=min_capacity, MaxCapacity=max_capacity)
    done = [f"registered {rid}: {min_capacity} to {max_capacity} instances"]
    aas.put_scaling_policy(
        **keys,
        PolicyName=TRACKING_POLICY,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration=tracking_configuration(
            metric,
            target,
            endpoint,
            scale_in_cooldown=scale_in_cooldown,
            scale_out_cooldown=scale_out_cooldown,
        ),
    )
    done.append(
        f"policy {TRACKING_POLICY}: {metric} target {target:g}, "
        f"scale-out cooldown {scale_out_cooldown}s, scale-in cooldown {scale_in_cooldown}s"
    )
    if min_capacity == 0:
        arn = aas.put_scaling_policy(
            **keys,
            PolicyName=FROM_ZERO_POLICY,
            PolicyType="StepScaling",
            StepScalingPolicyConfiguration={
                "AdjustmentType": "ChangeInCapacity",
                "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
                "Cooldown": scale_out_cooldown,
                "MetricAggregationType": "Average",
            },
        )["PolicyARN"]
        cw.put_metric_alarm(
            AlarmName=alarm_name(endpoint, variant),
            AlarmDescription=f"start an instance of {endpoint} when requests wait and none runs",
            Namespace="AWS/SageMaker",
            MetricName="HasBacklogWithoutCapacity",
            Dimensions=[{"Name": "EndpointName", "Value": endpoint}],
            Statistic="Average",
            Period=60,
            EvaluationPeriods=1,
            Threshold=1.0,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            TreatMissingData="missing",
            AlarmActions=[arn],
        )
        done.append(f"policy {FROM_ZERO_POLICY} + alarm {alarm_name(endpoint, variant)}: 0 -> 1 on backlog")
    else:  # a re-run that raised --min above 0 must not leave the scale-from-zero pieces behind
        done += delete_policies(aas, cw, endpoint, variant, only=FROM_ZERO_POLICY)
    return done


def validate(args: argparse.Namespace) -> None:
    """Every check that needs no AWS call; fills in the metric's default target."""
    aws.check_endpoint_name(args.endpoint)
    if not args.variant or len(args.variant) > 63:
        raise aws.UsageError("--variant must be 1 to 63 characters")
    if args.remove:
        given = [
            f
            for f, v in (("--min", args.min), ("--max", args.max), ("--target", args.target))
            if v is not None
        ]
        if given:
            raise aws.UsageError(f"--remove takes no {', '.join(given)}")
        return
    metric = METRICS[args.metric]
    if args.max is None:
        raise aws.UsageError("--max is required (the most instances autoscaling may run)")
    if args.min is None:
        args.min = 1
    floor = 0 if args.metric == "backlog" else 1
    if args.min < floor:
        raise aws.UsageError(
            "--min 0 (scale to zero) needs --metric backlog on an async endpoint; real-time endpoints keep 1"
            if args.min == 0
            else f"--min must be at least {floor}, got {args.min}"
        )
    if args.max < max(1, args.min):
        raise aws.UsageError(f"--max must be at least 1 and at least --min ({args.min}), got {args.max}")
    if args.target is None:
        if metric.default_target is None:
            raise aws.UsageError(
                "--metric invocations needs --target: invocations per instance per minute, "
                "e.g. 60 / seconds-per-request x 0.5"
            )
        args.target = metric.default_target
    if args.target <= 0 or (metric.max_target is not None and args.target > metric.max_target):
        upper = (
            f" and at most {metric.max_target:g} (one request at a time per instance)"
            if metric.max_target
            else ""
        )
        raise aws.UsageError(f"--target for {args.metric} must be above 0{upper}, got {args.target:g}")
    for flag, value in (
        ("--scale-in-cooldown", args.scale_in_cooldown),
        ("--scale-out-cooldown", args.scale_out_cooldown),
    ):
        aws.check_range(flag, value, 0, MAX_COOLDOWN_S, " seconds")


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--variant", default=VARIANT, help=f"production variant (default {VARIANT})")
    parser.add_argument("--min", type=int, help="fewest instances (default 1; 0 only with --metric backlog)")
    parser.add_argument("--max", type=int, help="most instances (required unless --remove)")
    parser.add_argument(
        "--metric",
        choices=sorted(METRICS),
        default="concurrency",
        help="; ".join(f"{name}: {m.help}" for name, m in METRICS.items()),
    )
    parser.add_argument("--target", type=float, help="target value (concurrency: 0.5, backlog: 2)")
    parser.add_argument("--scale-out-cooldown", type=int, default=60, help="seconds between scale-outs (60)")
    parser.add_argument("--scale-in-cooldown", type=int, default=600, help="seconds between scale-ins (600)")
    parser.add_argument("--remove", action="store_true", help="delete the policies and the scalable target")
    aws.add_session_args(parser)
    args = parser.parse_args(argv)
    validate(args)
    aas = aws.client("application-autoscaling", region=args.region, profile=args.profile)
    cw = aws.client("cloudwatch", region=args.region, profile=args.profile)
    if args.remove:
        lines = remove_scaling(aas, cw, endpoint=args.endpoint, variant=args.variant)
    else:
        check_endpoint(
            aws.client("sagemaker", region=args.region, profile=args.profile),
            args.endpoint,
            args.variant,
            args.metric,
        )
        lines = apply_scaling(
            aas,
            cw,
            endpoint=args.endpoint,
            variant=args.variant,
            min_capacity=args.min,
            max_capacity=args.max,
            metric=args.metric,
            target=args.target,
            scale_in_cooldown=args.scale_in_cooldown,
            scale_out_cooldown=args.scale_out_cooldown,
        )
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
