"""Shared AWS helpers for the operator commands: sessions, clients, digest-pinned image URIs, waiting.

Every command obtains boto3 clients through :func:`client`, so tests can record or stub calls in one place.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError

from semif_ops.errors import UsageError as UsageError  # raised here, caught as aws.UsageError

DIGEST_URI = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/-]*[a-z0-9])@sha256:(?P<digest>[0-9a-f]{64})$")
S3_MODEL_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.+\.tar\.gz)$")
S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")
SNS_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")
ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def new_session(region: str | None = None, profile: str | None = None) -> boto3.session.Session:
    """A boto3 session (tests replace this to attach recorders)."""
    return boto3.session.Session(region_name=region, profile_name=profile)


def client(
    service: str, *, region: str | None = None, profile: str | None = None, retries: int | None = None
) -> BaseClient:
    """A client for ``service``; ``retries`` sets botocore's total attempts (1 = we retry ourselves)."""
    config = Config(retries={"total_max_attempts": retries, "mode": "standard"}) if retries else None
    return new_session(region, profile).client(service, config=config)


@dataclass(frozen=True)
class ImageRef:
    repository: str
    digest: str

    @property
    def uri(self) -> str:
        return f"{self.repository}@sha256:{self.digest}"


def parse_digest_uri(uri: str) -> ImageRef:
    """Accept only ``repo@sha256:<64 hex>``; a tag (mutable) or malformed digest is a UsageError."""
    match = DIGEST_URI.fullmatch(uri.strip())
    if match:
        return ImageRef(match["repo"], match["digest"])
    name, _, tail = uri.partition("@")
    if tail and ":" in name.rsplit("/", 1)[-1]:
        raise UsageError(
            f"image {uri!r} names a tag and a digest; drop the tag and keep '<repository>@sha256:...'"
        )
    if "@sha256:" in uri:
        raise UsageError(
            f"image {uri!r} has a malformed digest: expected '@sha256:' and 64 lower-case hex characters"
        )
    raise UsageError(
        f"image {uri!r} is not pinned by digest: tags are mutable, so deployments take only "
        "'<repository>@sha256:<64 hex>' (semif-ops image build prints it)"
    )


def parse_model_data(uri: str) -> tuple[str, str]:
    """``s3://bucket/key.tar.gz`` -> (bucket, key); anything else is a UsageError."""
    match = S3_MODEL_URI.fullmatch(uri)
    if not match:
        raise UsageError(f"model data {uri!r} must be an s3://<bucket>/<key>.tar.gz URI (model.tar.gz)")
    return match["bucket"], match["key"]


def parse_s3_uri(uri: str, flag: str) -> tuple[str, str]:
    """``s3://bucket[/key]`` -> (bucket, key or ""); anything else is a UsageError naming ``flag``."""
    match = S3_URI.fullmatch(uri)
    if not match:
        raise UsageError(f"{flag} {uri!r} is not an s3://<bucket>/<prefix> URI")
    return match["bucket"], match["key"] or ""


def check_sns_topic(arn: str, flag: str) -> str:
    if not SNS_TOPIC_ARN.fullmatch(arn):
        raise UsageError(f"{flag} {arn!r} is not an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)")
    return arn


def check_endpoint_name(name: str, flag: str = "--endpoint") -> str:
    if not ENDPOINT_NAME.fullmatch(name):
        raise UsageError(f"{flag} {name!r}: letters, digits and hyphens, at most 63 characters")
    return name


def check_range(flag: str, value: float | None, low: float, high: float, unit: str = "") -> None:
    """A UsageError unless ``low <= value <= high`` (``None`` = not given, accepted)."""
    if value is not None and not low <= value <= high:
        raise UsageError(f"{flag} must be between {low:g} and {high:g}{unit}, got {value:g}")


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def describe(exc: ClientError) -> str:
    """``Code: message``, preferring the container's own message that InvokeEndpoint passes through."""
    detail = exc.response.get("OriginalMessage") or exc.response.get("Error", {}).get("Message", "")
    return f"{error_code(exc)}: {detail}"


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_not_found(exc: ClientError) -> bool:
    """SageMaker reports missing resources as ValidationException 'Could not find ...'."""
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return error_code(exc) in {"ResourceNotFound", "ResourceNotFoundException", "NoSuchEntity"} or (
        error_code(exc) == "ValidationException" and "could not find" in message.lower()
    )


def region_of(c: BaseClient) -> str:
    return str(c.meta.region_name)


def ensure_bucket(s3: BaseClient, bucket: str) -> None:
    """Create ``bucket`` in the client's region if it does not exist (or is not ours to see)."""
    try:
        s3.head_bucket(Bucket=bucket)
        return
    except ClientError as exc:
        if http_status(exc) not in (404,) and error_code(exc) not in {"404", "NoSuchBucket"}:
            raise
    region = region_of(s3)
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    s3.create_bucket(**kwargs)


def wait_until(
    poll: Callable[[], tuple[bool, str]],
    *,
    timeout_s: float,
    interval_s: float,
    describe: str,
    sleep: Callable[[float], None] = time.sleep,
    out: Any = sys.stderr,
) -> str:
    """Poll until ``poll()`` says done; shows a live status line (tqdm) and returns the last status."""
    from tqdm import tqdm

    deadline = time.monotonic() + timeout_s
    status = ""
    with tqdm(desc=describe, bar_format="{desc}: {postfix} [{elapsed}]", file=out) as bar:
        while True:
            done, status = poll()
            bar.set_postfix_str(status)
            bar.update(0)
            if done:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"{describe}: still {status!r} after {timeout_s:.0f}s")
            sleep(interval_s)


def env_pairs(items: Iterable[str]) -> dict[str, str]:
    """Parse repeated ``KEY=VALUE`` options."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def container_deadline(
    requested: float | None, invocation_timeout_s: int, flag: str = "--request-timeout-s"
) -> float:
    """SEMIF_REQUEST_TIMEOUT_S for an invocation SageMaker allows ``invocation_timeout_s`` seconds.

    Default: 5 s short of it (as 55 s is of the real-time 60 s), so the container's own deadline error, which
    says how far it got, reaches the caller before SageMaker's generic timeout. 0 means no deadline.
    """
    if requested is None:
        return float(invocation_timeout_s - 5 if invocation_timeout_s > 10 else invocation_timeout_s)
    if requested != 0:
        check_range(flag, requested, 1, invocation_timeout_s, " seconds (or 0: no deadline)")
    return float(requested)


def env_value(value: object) -> str:
    """A setting as an environment string; ``3600.0`` -> ``"3600"`` so int and float fields both read it."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


CODEBUILD_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "codebuild.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def ensure_codebuild_role(iam: BaseClient, name: str, policy: dict[str, Any]) -> str:
    """Return the ARN of role ``name``, creating it (trusting CodeBuild) with ``policy`` inline if missing."""
    import json

    try:
        arn = str(iam.get_role(RoleName=name)["Role"]["Arn"])
    except ClientError as exc:
        if error_code(exc) != "NoSuchEntity":
            raise
        arn = str(
            iam.create_role(
                RoleName=name,
                AssumeRolePolicyDocument=json.dumps(CODEBUILD_TRUST),
                Description="CodeBuild service role for semif-adapter builds",
            )["Role"]["Arn"]
        )
    iam.put_role_policy(RoleName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
    return arn


def ensure_codebuild_project(cb: BaseClient, spec: dict[str, Any], *, attempts: int = 6) -> None:
    """Create the CodeBuild project ``spec['name']`` unless it exists (then update it to ``spec``).

    A role created seconds ago may not be assumable yet; CodeBuild then answers InvalidInputException, so
    creation is retried a few times.
    """
    if cb.batch_get_projects(names=[spec["name"]]).get("projects"):
        cb.update_project(**spec)
        return
    for attempt in range(attempts):
        try:
            cb.create_project(**spec)
            return
        except ClientError as exc:
            role_not_ready = error_code(exc) == "InvalidInputException" and "role" in str(exc).lower()
            if not role_not_ready or attempt == attempts - 1:
                raise
            time.sleep(10)


def run_codebuild(
    cb: BaseClient,
    *,
    project: str,
    overrides: dict[str, Any],
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Start a build, follow its phase on a status line, and return the finished build record."""
    build_id = cb.start_build(projectName=project, **overrides)["build"]["id"]
    record: dict[str, Any] = {}

    def poll() -> tuple[bool, str]:
        nonlocal record
        record = cb.batch_get_builds(ids=[build_id])["builds"][0]
        status = str(record.get("buildStatus", "IN_PROGRESS"))
        return status != "IN_PROGRESS", f"{status} ({record.get('currentPhase', '?')})"

    wait_until(
        poll, timeout_s=timeout_s, interval_s=interval_s, describe=f"CodeBuild {build_id}", sleep=sleep
    )
    return record


def codebuild_base_statements(source_bucket: str) -> list[dict[str, Any]]:
    """What every CodeBuild role here needs: write its logs and read its zipped source from S3."""
    return [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": "*",
        },
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:GetObjectVersion"],
            "Resource": f"arn:aws:s3:::{source_bucket}/*",
        },
    ]


def add_session_args(parser: argparse.ArgumentParser) -> None:
    """``--region`` / ``--profile``, the same for every script (default: the AWS SDK's own chain)."""
    parser.add_argument("--region", help="AWS region (default: AWS_REGION / the profile's region)")
    parser.add_argument("--profile", help="AWS named profile (default: the SDK's credential chain)")
