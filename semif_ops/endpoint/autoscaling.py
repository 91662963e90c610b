"""Application Auto Scaling pieces that ``endpoint scale`` sets up and both it and ``endpoint cleanup``
take down: the names of what scale creates, and their removal in the order AWS needs."""

from __future__ import annotations

from typing import Any

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
TRACKING_POLICY = "semif-target-tracking"
FROM_ZERO_POLICY = "semif-scale-from-zero"


def resource_id(endpoint: str, variant: str) -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


def alarm_name(endpoint: str, variant: str) -> str:
    return f"semif-{endpoint}-{variant}-backlog-without-capacity"


def delete_policies(aas: Any, cw: Any, endpoint: str, variant: str, *, only: str | None = None) -> list[str]:
    """Delete the alarms that drive the target's step policies, then its policies (or just ``only``).

    Deleting a step policy leaves its CloudWatch alarm behind (target-tracking alarms go with their policy),
    and deleting an endpoint deregisters its scalable target and policies without a word: so the
    scale-from-zero alarm is also looked up by its name, which finds it when its policy is already gone,
    and alarms go first, so a run stopped half-way never leaves an alarm without the policy that names it.
    """
    rid = resource_id(endpoint, variant)
    policies = [
        p
        for p in aas.describe_scaling_policies(
            ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
        )["ScalingPolicies"]
        if not only or p["PolicyName"] == only
    ]
    alarms = [
        a["AlarmName"] for p in policies if p.get("PolicyType") == "StepScaling" for a in p.get("Alarms", [])
    ]
    if only in (None, FROM_ZERO_POLICY):
        alarms.append(alarm_name(endpoint, variant))
    # never an empty AlarmNames: DescribeAlarms would list every alarm in the account
    found = cw.describe_alarms(AlarmNames=list(dict.fromkeys(alarms)))["MetricAlarms"] if alarms else []
    present = [a["AlarmName"] for a in found]
    done: list[str] = []
    if present:
        cw.delete_alarms(AlarmNames=present)
        done += [f"deleted alarm {a}" for a in present]
    for policy in policies:
        aas.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=NAMESPACE,
            ResourceId=rid,
            ScalableDimension=DIMENSION,
        )
        done.append(f"deleted scaling policy {policy['PolicyName']}")
    return done


def remove_scaling(aas: Any, cw: Any, *, endpoint: str, variant: str) -> list[str]:
    """Alarms, policies, then the scalable target; nothing registered (or left) is not an error."""
    rid = resource_id(endpoint, variant)
    done = delete_policies(aas, cw, endpoint, variant)
    targets = aas.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[rid], ScalableDimension=DIMENSION
    )["ScalableTargets"]
    if targets:
        aas.deregister_scalable_target(
            ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
        )
        done.append(f"deregistered scalable target {rid}")
    elif not done:
        done.append(f"no autoscaling registered for {rid}")
    return done
