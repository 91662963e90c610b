"""How an HTTP request gets its deadline, and how the engine learns that the caller left.

The middleware binds a :class:`RequestScope` to each request (arrival time, the deadline: the server's
``SEMIF_REQUEST_TIMEOUT_S``, possibly shortened by a header, and the ASGI ``receive``). The decision
service reads it when it admits work — through a context variable, so every route (decisions,
jsonlines, System One) is covered without threading a parameter through each — and, while the engine
runs, :func:`guard` arms a timer that cancels the token when the deadline passes and watches the
connection for ``http.disconnect``. The body has been read by then, so the watcher is the only reader.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from semif_adapter.engine.deadline import DISCONNECTED, Deadline
from semif_adapter.errors import DecisionValidationError

TIMEOUT_HEADER = "x-semif-timeout-s"
# SageMaker forwards only this one custom header to the container: "timeout_s=<seconds>" inside it.
CUSTOM_ATTRIBUTES_HEADER = "x-amzn-sagemaker-custom-attributes"
CUSTOM_ATTRIBUTE_KEY = "timeout_s"

Receive = Callable[[], Awaitable[Mapping[str, Any]]]


class InvalidTimeout(DecisionValidationError):
    """A per-request timeout that is not a positive number of seconds."""


@dataclass(frozen=True)
class RequestScope:
    limit_s: float | None
    receive: Receive | None = None
    started: float = field(default_factory=time.monotonic)


_current: ContextVar[RequestScope | None] = ContextVar("semif_request_scope", default=None)


def _custom_attribute(text: str | None) -> str | None:
    for part in (text or "").replace(",", ";").split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip().lower() == CUSTOM_ATTRIBUTE_KEY:
            return value
    return None


def requested_limit(headers: Mapping[str, str], server_limit_s: float) -> float | None:
    """The request's deadline in seconds, or ``None``; a header shortens the server's, never extends it."""
    limit = server_limit_s if server_limit_s > 0 else None
    raw, source = headers.get(TIMEOUT_HEADER), TIMEOUT_HEADER
    if raw is None:
        raw, source = _custom_attribute(headers.get(CUSTOM_ATTRIBUTES_HEADER)), CUSTOM_ATTRIBUTES_HEADER
    if raw is None:
        return limit
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidTimeout(
            f"timeout must be a positive number of seconds, got {raw.strip()[:40]!r}", loc=("header", source)
        )
    return value if limit is None else min(value, limit)


def bind(scope: RequestScope) -> Token[RequestScope | None]:
    return _current.set(scope)


def unbind(token: Token[RequestScope | None]) -> None:
    _current.reset(token)


def current() -> RequestScope | None:
    return _current.get()


async def _watch_disconnect(receive: Receive, deadline: Deadline) -> None:
    while True:
        try:
            message = await receive()
        except Exception:  # a broken connection is a caller that left
            message = {"type": "http.disconnect"}
        if message.get("type") == "http.disconnect":
            deadline.cancel(DISCONNECTED)
            return


@asynccontextmanager
async def guard(deadline: Deadline, scope: RequestScope | None) -> AsyncIterator[None]:
    """While the engine works for this request: cancel the token on its deadline or when the caller leaves."""
    loop = asyncio.get_running_loop()
    remaining = deadline.remaining()
    timer = loop.call_later(max(remaining, 0.0), deadline.expire) if remaining is not None else None
    watcher = (
        asyncio.create_task(_watch_disconnect(scope.receive, deadline))
        if scope is not None and scope.receive is not None
        else None
    )
    try:
        yield
    except asyncio.CancelledError:
        deadline.cancel(DISCONNECTED)  # the handler itself was cancelled: its work has no caller left
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if watcher is not None:
            watcher.cancel()
