"""Run a SageMaker Batch Transform job over JSON Lines decisions in S3, wait, and report the outcome.

Each input line is one decision. SageMaker splits the files at line ends (SplitType=Line), packs whole
lines into requests of at most --max-payload-mb (BatchStrategy=MultiRecord) and sends them to the
container as application/jsonlines, one request at a time per instance (MaxConcurrentTransforms=1, the
container's own limit). The container answers one result line per input line, in order, and lines about
the same state share one prefill. Results land at <output-s3>/<input file name>.out, one line per input
line (AssembleWith=Line); --join-input puts each result next to its input under "SageMakerOutput".

Use an existing SageMaker model (--model, e.g. one `endpoint deploy` created) or let the job create
one from --image/--model-data/--role-arn. The job stops billing when it ends; --stop ends one early.

    semif-ops endpoint batch --model semif-qwen-20250101-120000 \
        --input-s3 s3://my-bucket/semif/decisions/ --output-s3 s3://my-bucket/semif/results/ \
        --instance-type ml.c7i.2xlarge --instance-count 2 --join-input
    semif-ops endpoint batch --stop semif-transform-20250101-120000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from semif_ops import aws
from semif_ops.endpoint import sagemaker
from semif_ops.errors import OperationFailed
from semif_ops.exits import command

MIB = 1024 * 1024
CONTAINER_BODY_LIMIT = 6 * MIB  # SEMIF_MAX_BODY_BYTES default
JSONLINES = "application/jsonlines"
MAX_TIMEOUT_S = 3600  # ModelClientConfig.InvocationsTimeoutInSeconds maximum
MAX_ENVIRONMENT = 16  # CreateTransformJob Environment entries
MAX_DECISIONS_LIMIT = 4096  # SEMIF_MAX_DECISIONS upper bound
MAX_FILTER = 63  # InputFilter / OutputFilter length
DONE = {"Completed", "Failed", "Stopped"}


def transform_request(
    *,
    job_name: str,
    model_name: str,
    input_s3: str,
    output_s3: str,
    instance_type: str,
    instance_count: int,
    max_payload_mb: int,
    invocation_timeout_s: int,
    max_retries: int,
    environment: dict[str, str],
    join_input: bool,
    input_filter: str | None,
    output_filter: str | None,
    tags: list[dict[str, str]],
) -> dict[str, Any]:
    """CreateTransformJob parameters for JSON Lines in, JSON Lines out, one request per instance at a time."""
    request: dict[str, Any] = {
        "TransformJobName": job_name,
        "ModelName": model_name,
        "MaxConcurrentTransforms": 1,
        "MaxPayloadInMB": max_payload_mb,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {
            "InvocationsTimeoutInSeconds": invocation_timeout_s,
            "InvocationsMaxRetries": max_retries,
        },
        "Environment": environment,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": input_s3}},
            "ContentType": JSONLINES,
            "CompressionType": "None",
            "SplitType": "Line",
        },
        "TransformOutput": {"S3OutputPath": output_s3, "Accept": JSONLINES, "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": instance_type, "InstanceCount": instance_count},
        "Tags": tags,
    }
    processing = {
        key: value
        for key, value in (
            ("InputFilter", input_filter),
            ("OutputFilter", output_filter),
            ("JoinSource", "Input" if join_input else None),
        )
        if value
    }
    if processing:
        request["DataProcessing"] = processing
    return request


def wait_done(
    sm: Any,
    job_name: str,
    *,
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Follow the job until Completed, Failed or Stopped; returns the last description."""
    described: dict[str, Any] = {}

    def poll() -> tuple[bool, str]:
        nonlocal described
        described = sm.describe_transform_job(TransformJobName=job_name)
        status = str(described["TransformJobStatus"])
        return status in DONE, status

    aws.wait_until(
        poll, timeout_s=timeout_s, interval_s=interval_s, describe=f"transform {job_name}", sleep=sleep
    )
    return described


def output_objects(s3: Any, output_s3: str, limit: int = 20) -> list[str]:
    """The result files (``*.out``) under the output prefix, as s3:// URIs."""
    bucket, prefix = aws.parse_s3_uri(output_s3, "--output-s3")
    found: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []) if o["Key"].endswith(".out")]
        if len(found) >= limit:
            break
    return found[:limit]


def container_environment(args: argparse.Namespace) -> dict[str, str]:
    """SEMIF_* settings for the transform: many lines per request, a deadline as long as the invocation."""
    environment = {
        "SEMIF_MAX_DECISIONS": str(args.max_decisions),
        "SEMIF_REQUEST_TIMEOUT_S": aws.env_value(float(args.request_timeout_s)),
    }
    environment.update(aws.env_pairs(args.env))
    if len(environment) > MAX_ENVIRONMENT:
        raise aws.UsageError(
            f"a transform job takes at most {MAX_ENVIRONMENT} environment variables, got {len(environment)}"
        )
    return environment


def body_limit(environment: dict[str, str], where: str = "--env") -> int:
    raw = environment.get("SEMIF_MAX_BODY_BYTES")
    if raw is None:
        return CONTAINER_BODY_LIMIT
    try:
        return int(raw)
    except ValueError:
        raise aws.UsageError(f"{where} SEMIF_MAX_BODY_BYTES={raw!r} is not a whole number of bytes") from None


def model_environment(sm: Any, name: str) -> dict[str, str]:
    """The container environment an existing model was created with (a deploy's --max-body-bytes or
    --async deadline live there, not in the job's environment)."""
    try:
        described = sm.describe_model(ModelName=name)
    except ClientError as exc:
        if aws.error_code(exc) == "ValidationException" and "not find" in aws.describe(exc).lower():
            raise aws.UsageError(f"--model {name}: no such SageMaker model in this region") from exc
        raise
    containers = [described.get("PrimaryContainer") or {}, *described.get("Containers", [])]
    environment: dict[str, str] = {}
    for container in containers:
        environment.update(container.get("Environment") or {})
    return environment


def check_model_environment(args: argparse.Namespace, model_env: dict[str, str]) -> None:
    """The model's own SEMIF_* settings must suit the job too. Which of the model's and the job's
    environment wins a clash is not documented, so both must fit: the payload under the smaller body limit,
    and a model's deadline that ends before SageMaker's invocation timeout."""
    where = f"model {args.model} carries"
    limit = body_limit(model_env, where)
    if "SEMIF_MAX_BODY_BYTES" in model_env and args.max_payload_mb * MIB > limit:
        fix = (
            f"pass --max-payload-mb {limit // MIB} or less"
            if limit >= MIB
            else "use a model made without --max-body-bytes (or --image/--model-data/--role-arn)"
        )
        raise aws.UsageError(
            f"{where} SEMIF_MAX_BODY_BYTES={limit} (deployed with --max-body-bytes), below "
            f"--max-payload-mb {args.max_payload_mb} ({args.max_payload_mb * MIB} bytes): {fix}"
        )
    raw = model_env.get("SEMIF_REQUEST_TIMEOUT_S")
    if raw is None:
        return
    try:
        deadline = float(raw)
    except ValueError:
        raise aws.UsageError(f"{where} SEMIF_REQUEST_TIMEOUT_S={raw!r}, not a number of seconds") from None
    if deadline == 0 or deadline > args.invocation_timeout:
        told = "no deadline" if deadline == 0 else f"a {deadline:g} s deadline"
        needed = MAX_TIMEOUT_S if deadline == 0 else min(MAX_TIMEOUT_S, int(deadline) + 5)
        raise aws.UsageError(
            f"{where} SEMIF_REQUEST_TIMEOUT_S={raw} ({told}, e.g. from an --async deploy), beyond "
            f"--invocation-timeout {args.invocation_timeout}: SageMaker would end requests first; pass "
            f"--invocation-timeout {needed} or use a model made without --async"
        )


def validate(args: argparse.Namespace) -> tuple[aws.ImageRef | None, dict[str, str]]:
    """Every check that needs no AWS call; returns (image to create a model from, container environment)."""
    if args.stop:
        aws.check_endpoint_name(args.stop, "--stop")
        return None, {}
    missing = [
        f
        for f, v in (
            ("--input-s3", args.input_s3),
            ("--output-s3", args.output_s3),
            ("--instance-type", args.instance_type),
        )
        if not v
    ]
    if missing:
        raise aws.UsageError(f"{', '.join(missing)} required (or --stop JOB)")
    aws.check_endpoint_name(args.job_name, "--job-name")
    aws.parse_s3_uri(args.input_s3, "--input-s3")
    aws.parse_s3_uri(args.output_s3, "--output-s3")
    if not args.instance_type.startswith("ml."):
        raise aws.UsageError(f"--instance-type {args.instance_type!r} must look like ml.<family>.<size>")
    if args.instance_count < 1:
        raise aws.UsageError("--instance-count must be at least 1")
    image = None
    create = [
        f
        for f, v in (
            ("--image", args.image),
            ("--model-data", args.model_data),
            ("--role-arn", args.role_arn),
        )
        if v
    ]
    if args.model and create:
        raise aws.UsageError(f"--model names an existing model; drop {', '.join(create)}")
    if not args.model:
        if len(create) != 3:
            raise aws.UsageError("give --model NAME, or --image, --model-data and --role-arn to create one")
        image = aws.parse_digest_uri(args.image)
        aws.parse_model_data(args.model_data)
        if not sagemaker.ROLE_ARN.fullmatch(args.role_arn):
            raise aws.UsageError(f"--role-arn {args.role_arn!r} is not an IAM role ARN")
    aws.check_range("--invocation-timeout", args.invocation_timeout, 1, MAX_TIMEOUT_S, " seconds")
    aws.check_range("--max-retries", args.max_retries, 0, 3)
    aws.check_range("--max-decisions", args.max_decisions, 1, MAX_DECISIONS_LIMIT)
    args.request_timeout_s = aws.container_deadline(args.request_timeout_s, args.invocation_timeout)
    for flag, value in (("--input-filter", args.input_filter), ("--output-filter", args.output_filter)):
        if value is not None and not (value.startswith("$") and len(value) <= MAX_FILTER):
            raise aws.UsageError(
                f"{flag} {value!r} must be a JSONPath starting with '$', at most {MAX_FILTER} characters"
            )
    if args.output_filter and not args.join_input:
        raise aws.UsageError("--output-filter selects from the joined record: add --join-input")
    environment = container_environment(args)
    limit = body_limit(environment)
    if not 1 <= args.max_payload_mb or args.max_payload_mb * MIB > limit:
        raise aws.UsageError(
            f"--max-payload-mb must be between 1 and {limit // MIB} (the container's body limit, "
            f"SEMIF_MAX_BODY_BYTES={limit}), got {args.max_payload_mb}"
        )
    return image, environment


def start(sm: Any, args: argparse.Namespace, image: aws.ImageRef | None, environment: dict[str, str]) -> str:
    """Create the model if asked, then the transform job; returns the model name used."""
    tags = [{"Key": "project", "Value": "semif-adapter"}, {"Key": "transform-job", "Value": args.job_name}]
    model_name: str = args.model or args.job_name
    if args.model:
        check_model_environment(args, model_environment(sm, args.model))
    if image is not None:
        sagemaker.create_model(
            sm,
            name=model_name,
            image=image,
            model_data=args.model_data,
            role_arn=args.role_arn,
            environment={},
            tags=tags,
        )
        print(f"created model {model_name}")
    sm.create_transform_job(
        **transform_request(
            job_name=args.job_name,
            model_name=model_name,
            input_s3=args.input_s3,
            output_s3=args.output_s3,
            instance_type=args.instance_type,
            instance_count=args.instance_count,
            max_payload_mb=args.max_payload_mb,
            invocation_timeout_s=args.invocation_timeout,
            max_retries=args.max_retries,
            environment=environment,
            join_input=args.join_input,
            input_filter=args.input_filter,
            output_filter=args.output_filter,
            tags=tags,
        )
    )
    return model_name


def stop(sm: Any, job_name: str) -> int:
    described = sm.describe_transform_job(TransformJobName=job_name)
    status = described["TransformJobStatus"]
    if status in DONE:
        print(f"transform job {job_name} already {status}")
        return 0
    sm.stop_transform_job(TransformJobName=job_name)
    print(f"stopping transform job {job_name} (was {status})")
    return 0


def report(args: argparse.Namespace, described: dict[str, Any]) -> int:
    """The failure reason (exit non-zero), or where the results went."""
    status = described["TransformJobStatus"]
    if status != "Completed":
        reason = described.get("FailureReason") or "no failure reason given"
        raise OperationFailed(f"transform job {args.job_name} is {status}: {reason}")
    print(f"transform job {args.job_name} Completed; results under {args.output_s3}")
    s3 = aws.client("s3", region=args.region, profile=args.profile)
    for uri in output_objects(s3, args.output_s3):
        print(f"  {uri}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    parser.add_argument(
        "--job-name", default=f"semif-transform-{stamp}", help="default semif-transform-<UTC time>"
    )
    parser.add_argument(
        "--input-s3", help="s3:// prefix (or one object) of JSON Lines files, one decision a line"
    )
    parser.add_argument("--output-s3", help="s3:// prefix for <input file>.out results")
    parser.add_argument("--instance-type", help="e.g. ml.c7i.2xlarge or ml.g6.xlarge")
    parser.add_argument("--instance-count", type=int, default=1)
    model = parser.add_argument_group("model: --model, or all three of --image, --model-data, --role-arn")
    model.add_argument("--model", help="an existing SageMaker model")
    model.add_argument("--image", help="<repo>@sha256:<64 hex> (tags are refused)")
    model.add_argument("--model-data", help="s3://bucket/key/model.tar.gz")
    model.add_argument("--role-arn", help="SageMaker execution role ARN")
    parser.add_argument(
        "--max-payload-mb",
        type=int,
        default=1,
        help="lines packed into one request, in MB (1-6; container limit)",
    )
    parser.add_argument(
        "--invocation-timeout",
        type=int,
        default=MAX_TIMEOUT_S,
        help=f"seconds per request, 1-{MAX_TIMEOUT_S}",
    )
    parser.add_argument(
        "--max-retries",
        type=int,
        default=0,
        help="retries of a failed request, 0-3 (0: the container's errors repeat for the same input)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        help="SEMIF_REQUEST_TIMEOUT_S (default: --invocation-timeout minus 5 s; 0 = none)",
    )
    parser.add_argument(
        "--max-decisions",
        type=int,
        default=MAX_DECISIONS_LIMIT,
        help=f"SEMIF_MAX_DECISIONS, lines per request (default {MAX_DECISIONS_LIMIT})",
    )
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra container env")
    parser.add_argument(
        "--join-input", action="store_true", help="JoinSource=Input: result under SageMakerOutput"
    )
    parser.add_argument("--input-filter", help="JSONPath of each line to send (DataProcessing.InputFilter)")
    parser.add_argument(
        "--output-filter", help="JSONPath of the joined line to keep, e.g. \"$['id','SageMakerOutput']\""
    )
    parser.add_argument("--no-wait", action="store_true", help="start the job and exit")
    parser.add_argument("--timeout", type=float, default=2 * 86400, help="seconds to wait for the job")
    parser.add_argument("--poll", type=float, default=30, help="seconds between status checks")
    parser.add_argument("--stop", metavar="JOB", help="stop a running transform job and exit")
    aws.add_session_args(parser)


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    image, environment = validate(args)
    stop_hint = f"semif-ops endpoint batch --stop {args.job_name}"
    try:
        sm = aws.client("sagemaker", region=args.region, profile=args.profile)
        if args.stop:
            return stop(sm, args.stop)
        start(sm, args, image, environment)  # may refuse (UsageError) once it has read the model
        print(f"started transform job {args.job_name}: {args.input_s3} -> {args.output_s3}")
        if args.no_wait:
            print(f"follow it in the console, or end it early: {stop_hint}")
            return 0
        described = wait_done(sm, args.job_name, timeout_s=args.timeout, interval_s=args.poll)
        return report(args, described)
    except TimeoutError as exc:
        raise OperationFailed(f"{exc}; the job keeps running (and billing): {stop_hint}") from None
    except KeyboardInterrupt:
        raise OperationFailed(f"interrupted; the job keeps running (and billing): {stop_hint}") from None


if __name__ == "__main__":
    raise SystemExit(main())
