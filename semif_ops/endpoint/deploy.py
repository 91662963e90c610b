"""Deploy semif-adapter to a SageMaker endpoint, real-time or (--async) asynchronous: model, config, endpoint.

Only digest-pinned images are accepted (<repo>@sha256:<64 hex>, as printed by build_image.py): a tag could
point at a different image tomorrow. Give one --instance-type, or an ordered --instance-pool list that
SageMaker tries in priority order when capacity is short (ProductionVariant.InstancePools).

With --async the endpoint is asynchronous (AsyncInferenceConfig): requests are read from S3, queued, run
one at a time per instance for up to --invocation-timeout seconds (SageMaker allows 3600), and the answers are
written to --output-s3; invoke it with semif-ops endpoint invoke --async. The container's own request deadline
(SEMIF_REQUEST_TIMEOUT_S) is set 5 s short of the invocation timeout unless --request-timeout-s says
otherwise (0 = no deadline of its own).

Endpoints bill per instance-hour until deleted: run semif-ops endpoint cleanup when done.

    semif-ops endpoint deploy --name semif-qwen \
        --role-arn arn:aws:iam::123456789012:role/SageMakerRole \
        --image 123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-gpu@sha256:<64 hex> \
        --model-data s3://my-bucket/semif/qwen/model.tar.gz --instance-pool ml.g6.xlarge,ml.g5.xlarge --wait

    semif-ops endpoint deploy --name semif-qwen-async ... --instance-type ml.c7i.2xlarge \
        --async --output-s3 s3://my-bucket/semif/async-out --invocation-timeout 1800
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from semif_ops import aws
from semif_ops.endpoint.sagemaker import ROLE_ARN, VARIANT, create_model
from semif_ops.errors import OperationFailed
from semif_ops.exits import command

NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,40}$")
MAX_POOLS = 5
SETTING_FLAGS = {  # option dest -> container environment variable
    "threads": "SEMIF_N_THREADS",
    "gpu_layers": "SEMIF_N_GPU_LAYERS",
    "n_ctx": "SEMIF_N_CTX",
    "max_decisions": "SEMIF_MAX_DECISIONS",
    "max_options": "SEMIF_MAX_OPTIONS",
    "max_request_tokens": "SEMIF_MAX_REQUEST_TOKENS",
    "max_queue": "SEMIF_MAX_QUEUE",
    "max_body_bytes": "SEMIF_MAX_BODY_BYTES",
    "request_timeout_s": "SEMIF_REQUEST_TIMEOUT_S",
}
REALTIME_LIMIT_S = 60  # SageMaker ends a real-time invocation after 60 s
ASYNC_MAX_TIMEOUT_S = 3600  # InvokeEndpointAsync's InvocationTimeoutSeconds maximum
ASYNC_DEFAULT_TIMEOUT_S = 900  # SageMaker's own default for InvocationTimeoutSeconds
ASYNC_FLAGS = ("output_s3", "failure_s3", "notify_sns", "notify_error_sns", "invocation_timeout")


def parse_pool(value: str) -> list[str]:
    """``ml.g6.xlarge,ml.g5.xlarge`` -> ordered list (first = priority 1)."""
    types = [t.strip() for t in value.split(",") if t.strip()]
    if not 1 <= len(types) <= MAX_POOLS:
        raise argparse.ArgumentTypeError(f"takes 1 to {MAX_POOLS} instance types, got {len(types)}")
    if len(set(types)) != len(types):
        raise argparse.ArgumentTypeError(f"--instance-pool lists an instance type twice: {value}")
    for t in types:
        if not t.startswith("ml."):
            raise argparse.ArgumentTypeError(f"instance type {t!r} must look like ml.<family>.<size>")
    return types


def production_variant(
    *,
    model_name: str,
    instance_type: str | None,
    instance_pool: list[str] | None,
    instance_count: int,
    startup_timeout_s: int,
    download_timeout_s: int,
    provision_timeout_s: int | None,
) -> dict[str, Any]:
    """One ProductionVariant. With a pool, InstanceType is replaced by InstancePools (priority 1 = first)."""
    variant: dict[str, Any] = {
        "VariantName": VARIANT,
        "ModelName": model_name,
        "InitialInstanceCount": instance_count,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": startup_timeout_s,
        "ModelDataDownloadTimeoutInSeconds": download_timeout_s,
    }
    if instance_pool:
        variant["InstancePools"] = [
            {"InstanceType": t, "Priority": i} for i, t in enumerate(instance_pool, start=1)
        ]
        if provision_timeout_s:
            variant["VariantInstanceProvisionTimeoutInSeconds"] = provision_timeout_s
    else:
        variant["InstanceType"] = instance_type
    return variant


def async_inference_config(
    *, output_s3: str, failure_s3: str | None, success_topic: str | None, error_topic: str | None
) -> dict[str, Any]:
    """AsyncInferenceConfig for a one-at-a-time container: one invocation per instance, the rest queue."""
    output: dict[str, Any] = {
        "S3OutputPath": output_s3,
        "S3FailurePath": failure_s3 or output_s3.rstrip("/") + "/failures",
    }
    notify = {k: v for k, v in (("SuccessTopic", success_topic), ("ErrorTopic", error_topic)) if v}
    if notify:
        output["NotificationConfig"] = notify
    return {"ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1}, "OutputConfig": output}


def deploy(
    sm: Any,
    *,
    endpoint: str,
    image: aws.ImageRef,
    model_data: str,
    role_arn: str,
    environment: dict[str, str],
    variant: dict[str, Any],
    stamp: str,
    network_isolation: bool = True,
    async_config: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Create model, endpoint config and endpoint in that order; returns (model, config) names."""
    model_name = f"{endpoint}-{stamp}"
    config_name = f"{endpoint}-{stamp}"
    tags = [{"Key": "project", "Value": "semif-adapter"}, {"Key": "endpoint", "Value": endpoint}]
    create_model(
        sm,
        name=model_name,
        image=image,
        model_data=model_data,
        role_arn=role_arn,
        environment=environment,
        tags=tags,
        network_isolation=network_isolation,
    )
    extra: dict[str, Any] = {"AsyncInferenceConfig": async_config} if async_config else {}
    sm.create_endpoint_config(
        EndpointConfigName=config_name,
        ProductionVariants=[{**variant, "ModelName": model_name}],
        Tags=tags,
        **extra,
    )
    sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config_name, Tags=tags)
    return model_name, config_name


def wait_in_service(
    sm: Any,
    endpoint: str,
    *,
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, str]:
    """Follow the endpoint until InService or Failed; returns (status, failure reason)."""
    reason = ""

    def poll() -> tuple[bool, str]:
        nonlocal reason
        described = sm.describe_endpoint(EndpointName=endpoint)
        status = str(described["EndpointStatus"])
        reason = str(described.get("FailureReason", ""))
        return status in {"InService", "Failed", "OutOfService"}, status

    status = aws.wait_until(
        poll, timeout_s=timeout_s, interval_s=interval_s, describe=f"endpoint {endpoint}", sleep=sleep
    )
    return status, reason


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with semif-ops endpoint deploy --stock."""
    parser.add_argument("--name", required=True, help="endpoint name (model/config get a time suffix)")
    parser.add_argument("--image", required=True, help="<repo>@sha256:<64 hex> (tags are refused)")
    parser.add_argument("--model-data", required=True, help="s3://bucket/key/model.tar.gz")
    parser.add_argument("--role-arn", required=True, help="SageMaker execution role ARN")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--instance-type", help="one instance type, e.g. ml.c7i.2xlarge")
    where.add_argument(
        "--instance-pool", type=parse_pool, help="ordered fallbacks, e.g. ml.g6.xlarge,ml.g5.xlarge"
    )
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--startup-timeout", type=int, default=900, help="health-check timeout, 60-3600 s")
    parser.add_argument("--download-timeout", type=int, default=900, help="model download timeout, 60-3600 s")
    parser.add_argument(
        "--provision-timeout", type=int, help="instance-pool provisioning timeout, 300-3600 s"
    )
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra container env")
    parser.add_argument("--wait", action="store_true", help="follow the endpoint until InService/Failed")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait with --wait")
    parser.add_argument("--poll", type=float, default=30, help="seconds between status checks")
    aws.add_session_args(parser)


def validate_common(args: argparse.Namespace) -> tuple[aws.ImageRef, dict[str, str]]:
    """Every check that needs no AWS call; raises UsageError."""
    image = aws.parse_digest_uri(args.image)
    aws.parse_model_data(args.model_data)
    if not ROLE_ARN.fullmatch(args.role_arn):
        raise aws.UsageError(f"--role-arn {args.role_arn!r} is not an IAM role ARN")
    if not NAME.fullmatch(args.name):
        raise aws.UsageError(f"--name {args.name!r}: letters, digits and hyphens, at most 41 characters")
    for flag, value, low, high in (
        ("--startup-timeout", args.startup_timeout, 60, 3600),
        ("--download-timeout", args.download_timeout, 60, 3600),
        ("--provision-timeout", args.provision_timeout, 300, 3600),
    ):
        aws.check_range(flag, value, low, high, " seconds")
    if args.provision_timeout and not args.instance_pool:
        raise aws.UsageError("--provision-timeout applies to --instance-pool only")
    if args.instance_count < 1:
        raise aws.UsageError("--instance-count must be at least 1")
    if getattr(args, "max_body_bytes", None) is not None and args.max_body_bytes < 1024:
        raise aws.UsageError(f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}")
    return image, aws.env_pairs(args.env)


def run(
    args: argparse.Namespace,
    environment: dict[str, str],
    image: aws.ImageRef,
    async_config: dict[str, Any] | None = None,
) -> int:
    """Deploy (and optionally wait); shared by both deploy scripts."""
    variant = production_variant(
        model_name="",
        instance_type=args.instance_type,
        instance_pool=args.instance_pool,
        instance_count=args.instance_count,
        startup_timeout_s=args.startup_timeout,
        download_timeout_s=args.download_timeout,
        provision_timeout_s=args.provision_timeout,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    sm = aws.client("sagemaker", region=args.region, profile=args.profile)
    model_name, config_name = deploy(
        sm,
        endpoint=args.name,
        image=image,
        model_data=args.model_data,
        role_arn=args.role_arn,
        environment=environment,
        variant=variant,
        stamp=stamp,
        async_config=async_config,
    )
    print(f"creating endpoint {args.name} (model {model_name}, config {config_name})")
    if async_config:
        print(
            f"asynchronous: answers go to {async_config['OutputConfig']['S3OutputPath']}; invoke with "
            f"semif-ops endpoint invoke --async --endpoint {args.name} "
            f"--input-s3 s3://<bucket>/<prefix> --invocation-timeout {args.invocation_timeout} "
            "--request <file>"
        )
    print("billing runs until deleted: semif-ops endpoint cleanup --endpoint " + args.name)
    if not args.wait:
        return 0
    status, reason = wait_in_service(sm, args.name, timeout_s=args.timeout, interval_s=args.poll)
    if status != "InService":
        raise OperationFailed(f"endpoint {args.name} is {status}: {reason or 'no failure reason given'}")
    print(f"endpoint {args.name} is InService")
    return 0


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser)
    parser.add_argument("--threads", type=int, help="SEMIF_N_THREADS (default: all cores)")
    parser.add_argument("--gpu-layers", type=int, help="SEMIF_N_GPU_LAYERS (GPU image default -1 = all)")
    parser.add_argument("--n-ctx", type=int, help="SEMIF_N_CTX")
    parser.add_argument("--max-decisions", type=int, help="SEMIF_MAX_DECISIONS")
    parser.add_argument("--max-options", type=int, help="SEMIF_MAX_OPTIONS")
    parser.add_argument("--max-request-tokens", type=int, help="SEMIF_MAX_REQUEST_TOKENS")
    parser.add_argument("--max-queue", type=int, help="SEMIF_MAX_QUEUE")
    parser.add_argument("--max-body-bytes", type=int, help="SEMIF_MAX_BODY_BYTES (container default 6 MiB)")
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        help="SEMIF_REQUEST_TIMEOUT_S, the container's per-request deadline "
        "(real-time: 1-60; --async: default --invocation-timeout minus 5 s, 0 = none)",
    )
    add_async_arguments(parser)
    args = parser.parse_args(argv)
    image, extra = validate_common(args)
    async_config = validate_async(args)
    environment = {
        env: aws.env_value(getattr(args, dest))
        for dest, env in SETTING_FLAGS.items()
        if getattr(args, dest) is not None
    }
    environment.update(extra)
    return run(args, environment, image, async_config)


def add_async_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("asynchronous inference (--async)")
    group.add_argument(
        "--async", dest="async_mode", action="store_true", help="deploy an asynchronous endpoint"
    )
    group.add_argument("--output-s3", help="s3://bucket/prefix for answers (required with --async)")
    group.add_argument("--failure-s3", help="s3://bucket/prefix for failures (default: <output-s3>/failures)")
    group.add_argument("--notify-sns", help="SNS topic ARN told of each answer (and of failures, by default)")
    group.add_argument("--notify-error-sns", help="SNS topic ARN told of failures (default: --notify-sns)")
    group.add_argument(
        "--invocation-timeout",
        type=int,
        help=f"seconds one async request may run, 1-{ASYNC_MAX_TIMEOUT_S} "
        f"(default {ASYNC_DEFAULT_TIMEOUT_S}); pass the same value to semif-ops endpoint invoke --async",
    )


def validate_async(args: argparse.Namespace) -> dict[str, Any] | None:
    """The AsyncInferenceConfig for --async (None for real-time); fills in the request deadline."""
    if not args.async_mode:
        given = [f"--{name.replace('_', '-')}" for name in ASYNC_FLAGS if getattr(args, name) is not None]
        if given:
            raise aws.UsageError(f"{', '.join(given)} apply to --async only")
        if args.request_timeout_s is not None:
            aws.check_range("--request-timeout-s", args.request_timeout_s, 1, REALTIME_LIMIT_S, " seconds")
        return None
    if not args.output_s3:
        raise aws.UsageError("--async needs --output-s3 s3://<bucket>/<prefix> for the answers")
    aws.parse_s3_uri(args.output_s3, "--output-s3")
    if args.failure_s3:
        aws.parse_s3_uri(args.failure_s3, "--failure-s3")
    for flag, arn in (("--notify-sns", args.notify_sns), ("--notify-error-sns", args.notify_error_sns)):
        if arn:
            aws.check_sns_topic(arn, flag)
    if args.invocation_timeout is None:
        args.invocation_timeout = ASYNC_DEFAULT_TIMEOUT_S
    aws.check_range("--invocation-timeout", args.invocation_timeout, 1, ASYNC_MAX_TIMEOUT_S, " seconds")
    args.request_timeout_s = aws.container_deadline(args.request_timeout_s, args.invocation_timeout)
    return async_inference_config(
        output_s3=args.output_s3,
        failure_s3=args.failure_s3,
        success_topic=args.notify_sns,
        error_topic=args.notify_error_sns or args.notify_sns,
    )


if __name__ == "__main__":
    raise SystemExit(main())
