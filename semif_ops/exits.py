"""One exit convention for every operator command: errors are raised where they happen and rendered here.

An operation either returns 0 or raises. What an operator can cause and fix becomes one ``error: …`` line
on stderr: their own input (``UsageError``, exit 2, like argparse's usage errors), and a refusal or a
failure (a refused AWS call, missing credentials, a resource that ended Failed, a wait that timed out, a
library the layout probe refused, a command that failed: exit 1). Anything else is a defect and keeps
its traceback. ``semif-ops`` renders through :func:`render`, and each operation's ``main`` is wrapped in
:func:`command` so that running a module directly (``python -m semif_ops.endpoint.deploy``) behaves the same.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from typing import ParamSpec

P = ParamSpec("P")

USAGE = 2
FAILED = 1
# Refusals whose message already says what to pass (semif_ops.errors, the layout probe, the engine's
# binding and model checks), matched by name so that explaining one imports nothing heavy or missing.
REFUSALS = frozenset({"UsageError", "OperationFailed", "AbiError", "BindingError", "ModelLoadError"})


def explain(exc: BaseException) -> str | None:
    """One line for an error an operator can cause and fix; None for a defect (let it raise)."""
    if any(
        cls.__name__ in REFUSALS and cls.__module__.startswith(("semif_ops.", "semif_adapter."))
        for cls in type(exc).__mro__
    ):
        return str(exc)
    if type(exc).__module__.startswith("botocore"):  # boto3 is only there with the ops extra
        return _aws_error(exc)
    if isinstance(exc, subprocess.CalledProcessError):
        command = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return f"`{command}` failed with exit status {exc.returncode}"
    if isinstance(exc, TimeoutError):  # the waits for an endpoint, a build or a job say what they waited on
        return str(exc) or "timed out"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or exc}: {exc.filename}"
    return None


def _aws_error(exc: BaseException) -> str | None:
    from botocore.exceptions import BotoCoreError, ClientError

    from semif_ops.aws import describe

    if isinstance(exc, ClientError):
        return describe(exc)
    if isinstance(exc, BotoCoreError):  # no credentials or region, unknown profile, endpoint unreachable
        return f"{exc} (set AWS credentials and a region: --profile/--region or the AWS_* variables)"
    return None


def render(exc: BaseException) -> int | None:
    """Print ``exc`` as one ``error:`` line and return its exit status; None for a defect."""
    message = explain(exc)
    if message is None:
        return None
    print(f"error: {message}", file=sys.stderr)
    usage = any(cls.__name__ == "UsageError" for cls in type(exc).__mro__)
    return USAGE if usage else FAILED


def command(main: Callable[P, int]) -> Callable[P, int]:
    """Wrap an operation's ``main``: its raised errors come back as one line and an exit status."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as exc:
            code = render(exc)
            if code is None:
                raise
            return code

    return run
