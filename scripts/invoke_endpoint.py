"""Call a semif-adapter endpoint with a JSON request file and print the JSON answer.

The file holds one body: {"decision": {...}} (single), {"decisions": [...]} (shared state) or a Jev-style
body with "questions". A busy endpoint answers 503 (fast, by design); those calls are retried with capped
exponential backoff and full jitter. Other errors are printed once and end the script.

    python scripts/invoke_endpoint.py --endpoint semif-qwen --request examples/request.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

try:
    from scripts import _aws
except ModuleNotFoundError:  # run as a file: python scripts/invoke_endpoint.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from scripts import _aws

BODY_KEYS = ("decision", "decisions", "questions")
RETRYABLE_CODES = {"ServiceUnavailable", "ServiceUnavailableException", "ThrottlingException"}


def is_retryable(exc: ClientError) -> bool:
    """503 from SageMaker itself, throttling, or the container's own 503 wrapped in a ModelError."""
    if _aws.http_status(exc) == 503 or _aws.error_code(exc) in RETRYABLE_CODES:
        return True
    return _aws.error_code(exc) == "ModelError" and exc.response.get("OriginalStatusCode") == 503


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
            log(f"attempt {attempt + 1}: {_aws.error_code(exc)} (503), retrying in {delay:.2f}s")
            sleep(delay)
            continue
        response["Body"] = response["Body"].read()
        return response
    raise AssertionError("unreachable")  # pragma: no cover


def load_request(path: Path) -> bytes:
    """Read and sanity-check a request body; a clear UsageError instead of a remote 400."""
    try:
        raw = path.read_bytes()
        body = json.loads(raw)
    except FileNotFoundError:
        raise _aws.UsageError(f"request file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _aws.UsageError(f"{path} is not JSON: {exc}") from None
    present = [k for k in BODY_KEYS if isinstance(body, dict) and k in body]
    if len(present) != 1:
        raise _aws.UsageError(f"{path} must be an object with exactly one of {', '.join(BODY_KEYS)}")
    if present[0] in ("decisions", "questions") and not (
        isinstance(body[present[0]], list) and body[present[0]]
    ):
        raise _aws.UsageError(f"{path}: '{present[0]}' must be a non-empty list")
    return raw


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--max-attempts", type=int, default=6, help="attempts in all, for 503s")
    parser.add_argument("--base-delay", type=float, default=0.5, help="first backoff ceiling, seconds")
    parser.add_argument("--max-delay", type=float, default=8.0, help="backoff cap, seconds")
    _aws.add_session_args(parser)


def runtime_client(args: argparse.Namespace) -> Any:
    # botocore's own retries off (1 attempt): this script owns the retry policy and its jitter.
    return _aws.client("sagemaker-runtime", region=args.region, profile=args.profile, retries=1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_arguments(parser)
    parser.add_argument("--request", type=Path, required=True, help="JSON request body file")
    args = parser.parse_args(argv)
    try:
        body = load_request(args.request)
    except _aws.UsageError as exc:
        return _aws.fail(str(exc))
    try:
        response = invoke_with_retry(
            runtime_client(args),
            endpoint=args.endpoint,
            body=body,
            max_attempts=args.max_attempts,
            base_s=args.base_delay,
            cap_s=args.max_delay,
        )
    except ClientError as exc:
        return _aws.fail(_aws.describe(exc))
    text = response["Body"].decode("utf-8", errors="replace")
    try:
        print(json.dumps(json.loads(text), indent=2))
    except json.JSONDecodeError:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
