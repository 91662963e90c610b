"""Delete an endpoint's autoscaling, the endpoint, its endpoint config and its model(s); list what is left.

Autoscaling goes first (the step policies' alarms, the scaling policies, then the scalable target), so
nothing tries to scale an endpoint that is being deleted and no stale target or alarm outlives it. AWS wants
it gone before DeleteEndpoint, so without the rights to remove it the command stops, naming the missing
permission, and deletes nothing more. Already-deleted pieces are skipped, so the command can be re-run
after a partial failure. The endpoint is deleted and waited for
before its config and models, because a config or model still in use cannot be removed.

    semif-ops endpoint cleanup --endpoint semif-qwen
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from semif_ops import aws
from semif_ops.endpoint.autoscaling import remove_scaling
from semif_ops.endpoint.sagemaker import VARIANT
from semif_ops.exits import command

ACCESS_DENIED = {"AccessDenied", "AccessDeniedException"}
# The IAM action prefix of each autoscaling call cleanup makes; the rest are application-autoscaling's.
CLOUDWATCH_CALLS = {"DescribeAlarms", "DeleteAlarms"}
SCALING_PERMISSIONS = (
    "application-autoscaling:DescribeScalingPolicies, DeleteScalingPolicy, DescribeScalableTargets, "
    "DeregisterScalableTarget and cloudwatch:DescribeAlarms, DeleteAlarms"
)


def missing_permission(exc: ClientError, endpoint: str) -> aws.UsageError:
    """The refusal of an autoscaling call as one line naming the IAM action to grant."""
    operation = exc.operation_name
    action = f"{'cloudwatch' if operation in CLOUDWATCH_CALLS else 'application-autoscaling'}:{operation}"
    return aws.UsageError(
        f"not allowed to call {action} ({aws.error_code(exc)}), so {endpoint} was not deleted: AWS "
        f"requires an endpoint's autoscaling removed before DeleteEndpoint; grant {action} (cleanup uses "
        f"{SCALING_PERMISSIONS}) and re-run"
    )


def _missing_ok(call: Callable[[], Any]) -> Any | None:
    try:
        return call()
    except ClientError as exc:
        if aws.is_not_found(exc):
            return None
        raise


def models_of(config: dict[str, Any]) -> list[str]:
    """Every model a config references, including instance-pool overrides."""
    names: list[str] = []
    for variant in config.get("ProductionVariants", []):
        names.append(variant["ModelName"])
        names += [
            p["ModelNameOverride"] for p in variant.get("InstancePools", []) if p.get("ModelNameOverride")
        ]
    return list(dict.fromkeys(names))


def variants_of(described: dict[str, Any] | None, config: dict[str, Any] | None) -> list[str]:
    """Variant names to deregister: the live endpoint's, else its config's, else the deploy default."""
    for source in (described, config):
        names = [v["VariantName"] for v in (source or {}).get("ProductionVariants", [])]
        if names:
            return list(dict.fromkeys(names))
    return [VARIANT]


def cleanup(
    sm: Any,
    endpoint: str,
    *,
    config_name: str | None,
    models: list[str],
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
    autoscaling: Any = None,
    cloudwatch: Any = None,
) -> list[str]:
    """Delete autoscaling -> endpoint -> config -> models; returns a line per action for the operator."""
    done: list[str] = []
    described = _missing_ok(lambda: sm.describe_endpoint(EndpointName=endpoint))
    config: dict[str, Any] | None = None
    if described:
        config_name = config_name or described["EndpointConfigName"]
    if config_name:
        config = _missing_ok(lambda: sm.describe_endpoint_config(EndpointConfigName=config_name))
        if config:
            models = models + [m for m in models_of(config) if m not in models]
    if autoscaling is not None:
        for variant in variants_of(described, config):
            try:
                done += remove_scaling(autoscaling, cloudwatch, endpoint=endpoint, variant=variant)
            except ClientError as exc:
                if aws.error_code(exc) in ACCESS_DENIED:
                    raise missing_permission(exc, endpoint) from exc
                raise
    if described:
        sm.delete_endpoint(EndpointName=endpoint)

        def gone() -> tuple[bool, str]:
            current = _missing_ok(lambda: sm.describe_endpoint(EndpointName=endpoint))
            return current is None, "deleted" if current is None else str(current["EndpointStatus"])

        aws.wait_until(
            gone, timeout_s=timeout_s, interval_s=interval_s, describe=f"delete {endpoint}", sleep=sleep
        )
        done.append(f"deleted endpoint {endpoint}")
    else:
        done.append(f"endpoint {endpoint} already gone")
    if config_name:
        deleted = _missing_ok(lambda: sm.delete_endpoint_config(EndpointConfigName=config_name))
        done.append(f"{'deleted' if deleted is not None else 'already gone:'} endpoint config {config_name}")
    for model in models:
        deleted = _missing_ok(functools.partial(sm.delete_model, ModelName=model))
        done.append(f"{'deleted' if deleted is not None else 'already gone:'} model {model}")
    return done


def remaining(sm: Any, name: str) -> list[str]:
    """Endpoints, configs and models whose names contain ``name`` (leftovers of earlier deploys)."""
    left = [
        f"endpoint {e['EndpointName']} ({e['EndpointStatus']})"
        for e in sm.list_endpoints(NameContains=name)["Endpoints"]
    ]
    left += [
        f"endpoint config {c['EndpointConfigName']}"
        for c in sm.list_endpoint_configs(NameContains=name)["EndpointConfigs"]
    ]
    left += [
        f"model {m['ModelName']}"
        for m in sm.list_models(NameContains=name)["Models"]
        if name in m["ModelName"]
    ]
    return left


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--endpoint-config", help="config to delete if the endpoint is already gone")
    parser.add_argument("--model", action="append", default=[], help="model(s) to delete as well")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--poll", type=float, default=15)
    aws.add_session_args(parser)
    args = parser.parse_args(argv)
    sm = aws.client("sagemaker", region=args.region, profile=args.profile)
    for line in cleanup(
        sm,
        args.endpoint,
        config_name=args.endpoint_config,
        models=list(args.model),
        timeout_s=args.timeout,
        interval_s=args.poll,
        autoscaling=aws.client("application-autoscaling", region=args.region, profile=args.profile),
        cloudwatch=aws.client("cloudwatch", region=args.region, profile=args.profile),
    ):
        print(line)
    left = remaining(sm, args.endpoint)
    print("remaining: " + ("; ".join(left) if left else f"nothing named *{args.endpoint}*"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
