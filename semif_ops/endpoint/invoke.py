"""Call a semif-adapter endpoint with a JSON request file and print the JSON answer.

The file holds one body: {"decision": {...}} (single), {"decisions": [...]} (shared state) or a Jev-style
body with "questions"; a .jsonl/.ndjson file holds one decision per line and is sent as
application/jsonlines (one result line per input line comes back). A busy endpoint answers 503 (fast, by
design); those calls are retried with capped exponential backoff and full jitter. Other errors are printed
once and end the script.

With --async (an endpoint made by `endpoint deploy --async`) the file is uploaded under --input-s3,
InvokeEndpointAsync queues it, and the script polls the output and failure locations until one appears,
then prints the answer (or the failure, exit non-zero).

    semif-ops endpoint invoke --endpoint semif-qwen --request examples/request.json
    semif-ops endpoint invoke --async --endpoint semif-qwen-async --request batch.jsonl \
        --input-s3 s3://my-bucket/semif/async-in --invocation-timeout 1800
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from semif_ops import aws
from semif_ops.errors import OperationFailed
from semif_ops.exits import command

BODY_KEYS = ("decision", "decisions", "questions")
JSONLINES_SUFFIXES = (".jsonl", ".ndjson")
JSONLINES = "application/jsonlines"
ASYNC_MAX_TIMEOUT_S = 3600  # InvokeEndpointAsync InvocationTimeoutSeconds
ASYNC_DEFAULT_TIMEOUT_S = 900
TTL_RANGE_S = (60, 21600)  # InvokeEndpointAsync RequestTTLSeconds
RETRYABLE_CODES = {"ServiceUnavailable", "ServiceUnavailableException", "ThrottlingException"}


def is_retryable(exc: ClientError) -> bool:
    """503 from SageMaker itself, throttling, or the container's own 503 wrapped in a ModelError."""
    if aws.http_status(exc) == 503 or aws.error_code(exc) in RETRYABLE_CODES:
        return True
    return aws.error_code(exc) == "ModelError" and exc.response.get("OriginalStatusCode") == 503


def backoff(attempt: int, *, base_s: float, cap_s: float, rng: Callable[[float, float], float]) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return rng(0.0, min(cap_s, base_s * (2**attempt)))


def invoke_with_retry(
    runtime: Any,
    *,
    endpoint: str,
    body: bytes,
    content_type: str = "application/json",
    accept: str = "application/json",
    max_attempts: int = 6,
    base_s: float = 0.5,
    cap_s: float = 8.0,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[float, float], float] = random.uniform,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> dict[str, Any]:
    """InvokeEndpoint, retrying retryable 503s; returns the response with Body already read."""
    for attempt in range(max_attempts):
        try:
            response = runtime.invoke_endpoint(
                EndpointName=endpoint, Body=body, ContentType=content_type, Accept=accept
            )
        except ClientError as exc:
            if not is_retryable(exc) or attempt == max_attempts - 1:
                raise
            delay = backoff(attempt, base_s=base_s, cap_s=cap_s, rng=rng)
            log(f"attempt {attempt + 1}: {aws.error_code(exc)} (503), retrying in {delay:.2f}s")
            sleep(delay)
            continue
        response["Body"] = response["Body"].read()
        answered: dict[str, Any] = response
        return answered
    raise AssertionError("unreachable")  # pragma: no cover


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise aws.UsageError(f"request file not found: {path}") from None
    except IsADirectoryError:
        raise aws.UsageError(f"request path is a directory: {path}") from None


def load_jsonlines(path: Path) -> bytes:
    """A JSON Lines body: every non-blank line a JSON object (one decision), at least one line."""
    raw = _read(path)
    count = 0
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise aws.UsageError(f"{path} line {number} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise aws.UsageError(f"{path} line {number} must be a JSON object (one decision)")
        count += 1
    if not count:
        raise aws.UsageError(f"{path} has no decision lines")
    return raw


def load_body(path: Path) -> tuple[bytes, str]:
    """(body, content type): JSON Lines for .jsonl/.ndjson files, one JSON body otherwise."""
    if path.suffix.lower() in JSONLINES_SUFFIXES:
        return load_jsonlines(path), JSONLINES
    return load_request(path), "application/json"


def load_request(path: Path) -> bytes:
    """Read and sanity-check a request body; a clear UsageError instead of a remote 400."""
    raw = _read(path)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise aws.UsageError(f"{path} is not JSON: {exc}") from None
    present = [k for k in BODY_KEYS if isinstance(body, dict) and k in body]
    if len(present) != 1:
        raise aws.UsageError(f"{path} must be an object with exactly one of {', '.join(BODY_KEYS)}")
    if present[0] in ("decisions", "questions") and not (
        isinstance(body[present[0]], list) and body[present[0]]
    ):
        raise aws.UsageError(f"{path}: '{present[0]}' must be a non-empty list")
    return raw


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--max-attempts", type=int, default=6, help="attempts in all, for 503s")
    parser.add_argument("--base-delay", type=float, default=0.5, help="first backoff ceiling, seconds")
    parser.add_argument("--max-delay", type=float, default=8.0, help="backoff cap, seconds")
    aws.add_session_args(parser)


def runtime_client(args: argparse.Namespace) -> Any:
    # botocore's own retries off (1 attempt): this script owns the retry policy and its jitter.
    return aws.client("sagemaker-runtime", region=args.region, profile=args.profile, retries=1)


def print_answer(raw: bytes, content_type: str = "application/json") -> None:
    """Pretty JSON when it is one JSON document; JSON Lines and anything else as they are."""
    text = raw.decode("utf-8", errors="replace")
    if content_type == JSONLINES:
        print(text, end="" if text.endswith("\n") else "\n")
        return
    try:
        print(json.dumps(json.loads(text), indent=2))
    except json.JSONDecodeError:
        print(text, end="" if text.endswith("\n") else "\n")


def _s3_object(s3: Any, uri: str) -> bytes | None:
    """The object's bytes, or None while it does not exist yet."""
    bucket, key = aws.parse_s3_uri(uri, "location")
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as exc:
        if aws.error_code(exc) in {"NoSuchKey", "404", "NotFound"}:
            return None
        raise


def invoke_async(
    runtime: Any,
    s3: Any,
    *,
    endpoint: str,
    body: bytes,
    content_type: str,
    input_s3: str,
    invocation_timeout_s: int,
    ttl_s: int,
) -> dict[str, Any]:
    """Upload the body under ``input_s3`` and queue it; returns InvokeEndpointAsync's answer."""
    bucket, prefix = aws.parse_s3_uri(input_s3, "--input-s3")
    inference_id = str(uuid.uuid4())
    suffix = ".jsonl" if content_type == JSONLINES else ".json"
    key = f"{prefix.rstrip('/')}/{inference_id}{suffix}".lstrip("/")
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
    return dict(
        runtime.invoke_endpoint_async(
            EndpointName=endpoint,
            InputLocation=f"s3://{bucket}/{key}",
            ContentType=content_type,
            Accept=content_type,
            InferenceId=inference_id,
            InvocationTimeoutSeconds=invocation_timeout_s,
            RequestTTLSeconds=ttl_s,
        )
    )


def wait_for_result(
    s3: Any,
    *,
    output: str,
    failure: str | None,
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, bytes]:
    """Poll the output (and failure) location; (succeeded, content) once one of them exists."""
    found: tuple[bool, bytes] | None = None

    def poll() -> tuple[bool, str]:
        nonlocal found
        answer = _s3_object(s3, output)
        if answer is not None:
            found = (True, answer)
            return True, "answered"
        problem = _s3_object(s3, failure) if failure else None
        if problem is not None:
            found = (False, problem)
            return True, "failed"
        return False, "queued or running"

    aws.wait_until(poll, timeout_s=timeout_s, interval_s=interval_s, describe="async inference", sleep=sleep)
    assert found is not None
    return found


def validate_async(args: argparse.Namespace) -> None:
    if not args.async_mode:
        given = [
            flag
            for flag, value in (
                ("--input-s3", args.input_s3),
                ("--invocation-timeout", args.invocation_timeout),
            )
            if value is not None
        ]
        if given:
            raise aws.UsageError(f"{', '.join(given)} apply to --async only")
        return
    if not args.input_s3:
        raise aws.UsageError("--async needs --input-s3 s3://<bucket>/<prefix> to upload the request to")
    aws.parse_s3_uri(args.input_s3, "--input-s3")
    if args.invocation_timeout is None:
        args.invocation_timeout = ASYNC_DEFAULT_TIMEOUT_S
    aws.check_range("--invocation-timeout", args.invocation_timeout, 1, ASYNC_MAX_TIMEOUT_S, " seconds")
    aws.check_range("--ttl", args.ttl, *TTL_RANGE_S, " seconds")
    if args.wait_timeout is not None and args.wait_timeout <= 0:
        raise aws.UsageError(f"--wait-timeout must be above 0, got {args.wait_timeout:g}")
    if args.poll <= 0:
        raise aws.UsageError(f"--poll must be above 0, got {args.poll:g}")


def add_async_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("asynchronous endpoints (--async)")
    group.add_argument("--async", dest="async_mode", action="store_true", help="use InvokeEndpointAsync")
    group.add_argument("--input-s3", help="s3://bucket/prefix the request is uploaded under (required)")
    group.add_argument(
        "--invocation-timeout",
        type=int,
        help=f"seconds the container may work on it, 1-{ASYNC_MAX_TIMEOUT_S} "
        f"(default {ASYNC_DEFAULT_TIMEOUT_S}); as given to semif-ops endpoint deploy --async",
    )
    group.add_argument(
        "--ttl", type=int, default=TTL_RANGE_S[1], help="seconds it may wait in the queue (60-21600)"
    )
    group.add_argument(
        "--wait-timeout",
        type=float,
        help="seconds to poll for the answer (default: --ttl + --invocation-timeout)",
    )
    group.add_argument("--poll", type=float, default=5.0, help="seconds between checks of the output (5)")
    group.add_argument("--no-wait", action="store_true", help="print the output location and exit")


def run_async(args: argparse.Namespace, body: bytes, content_type: str) -> int:
    s3 = aws.client("s3", region=args.region, profile=args.profile)
    runtime = aws.client("sagemaker-runtime", region=args.region, profile=args.profile)
    try:
        queued = invoke_async(
            runtime,
            s3,
            endpoint=args.endpoint,
            body=body,
            content_type=content_type,
            input_s3=args.input_s3,
            invocation_timeout_s=args.invocation_timeout,
            ttl_s=args.ttl,
        )
        output, failure = queued["OutputLocation"], queued.get("FailureLocation")
        print(f"queued {queued.get('InferenceId', '')}: output {output}", file=sys.stderr)
        if args.no_wait:
            print(output)
            return 0
        wait_s = args.wait_timeout or float(args.ttl + args.invocation_timeout)
        succeeded, content = wait_for_result(
            s3, output=output, failure=failure, timeout_s=wait_s, interval_s=args.poll
        )
    except TimeoutError as exc:
        raise OperationFailed(f"{exc}; the answer will appear at {output}") from None
    if not succeeded:
        detail = content.decode("utf-8", errors="replace").strip().replace("\n", " ")
        raise OperationFailed(f"async inference failed ({failure}): {detail}")
    print_answer(content, content_type)
    return 0


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_arguments(parser)
    parser.add_argument(
        "--request", type=Path, required=True, help="JSON request body file (.jsonl/.ndjson: JSON Lines)"
    )
    add_async_arguments(parser)
    args = parser.parse_args(argv)
    validate_async(args)
    body, content_type = load_body(args.request)
    if args.async_mode:
        return run_async(args, body, content_type)
    response = invoke_with_retry(
        runtime_client(args),
        endpoint=args.endpoint,
        body=body,
        content_type=content_type,
        accept=content_type,
        max_attempts=args.max_attempts,
        base_s=args.base_delay,
        cap_s=args.max_delay,
    )
    print_answer(response["Body"], content_type)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
