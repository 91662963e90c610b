"""Around every request: its id, the API key, its deadline, one structured log line and the metrics.

The key and the deadline header are checked before any route runs; a refusal is answered in the
shape of the API the path belongs to.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request
from starlette.responses import Response

from semif_adapter import request_scope
from semif_adapter.errors import SemifError
from semif_adapter.http import auth
from semif_adapter.http.error_handlers import renderer_for
from semif_adapter.metrics import Metrics
from semif_adapter.settings import Settings

log = logging.getLogger("semif_adapter.http")
QUIET_ROUTES = ("/ping", "/metrics")  # polled constantly: neither logged nor counted


async def observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    settings: Settings = request.app.state.settings
    metrics: Metrics = request.app.state.metrics
    request_id = (
        request.headers.get("x-amzn-requestid") or request.headers.get("x-request-id") or uuid.uuid4().hex
    )
    request.state.request_id = request_id
    request.state.log = {}
    started = time.perf_counter()
    renderer = renderer_for(request.url.path)
    try:  # the key first; then the request's deadline and its connection, for the engine to stop on
        if auth.requires_key(request.url.path, settings.api_key, settings.metrics_open):
            auth.check_bearer(request.headers.get("authorization"), settings.api_key)
        limit_s = request_scope.requested_limit(request.headers, settings.request_timeout_s)
    except auth.AuthenticationFailed as exc:
        response: Response = renderer.semif_error(exc, settings.retry_after_s)  # with its Bearer challenge
    except SemifError as exc:
        response = renderer.header_error(exc, settings.retry_after_s)
    else:
        bound = request_scope.bind(request_scope.RequestScope(limit_s, request.receive))
        try:
            response = await call_next(request)
        finally:
            request_scope.unbind(bound)
    elapsed = time.perf_counter() - started
    route_path = getattr(request.scope.get("route"), "path", "unmatched")
    response.headers["X-Request-Id"] = request_id
    if route_path not in QUIET_ROUTES:
        metrics.requests.labels(route_path, str(response.status_code)).inc()
        metrics.latency.labels(route_path).observe(elapsed)
        log.info(
            "request",
            extra={
                "request_id": request_id,
                "method": request.method,
                "route": route_path,
                "status": response.status_code,
                "duration_s": round(elapsed, 4),
                **request.state.log,
            },
        )
    return response
