"""The HTTP layer: SageMaker's ``/ping`` and ``/invocations`` (plus ``/metrics``) around the service.

Request flow: read the whole body (bounded) → parse and validate → admit to the engine (or 503) →
render. Every error is JSON with a stable ``type``; a caller's mistake is always a 4xx.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from semif_adapter import __version__
from semif_adapter.errors import DecisionValidationError, SemifError, UnsupportedMediaType
from semif_adapter.http import auth, request_scope
from semif_adapter.http.body import read_body
from semif_adapter.http.decision_json import numbered_lines, read_decision_json, refuse_counts, refuse_options
from semif_adapter.http.framing import AmbiguousFramingGuard
from semif_adapter.metrics import Metrics
from semif_adapter.protocol import (
    Decision,
    ErrorResponse,
    InvocationRequest,
    SharedResponse,
    SingleResponse,
    check_shared_batch,
)
from semif_adapter.serving import DecisionService, Engine
from semif_adapter.settings import Settings

log = logging.getLogger("semif_adapter.http")
T = TypeVar("T")

# No Content-Type, or the generic octet-stream an InvokeEndpoint caller may leave, is read as JSON.
JSON_TYPES = {"application/json", "text/json", "application/octet-stream", ""}
JSONLINES_TYPES = {
    "application/jsonlines",
    "application/x-jsonlines",
    "application/jsonl",
    "application/x-ndjson",
}


def _error_body(request: Request, exc: SemifError) -> dict[str, Any]:
    """Decision API errors are ``{"error", "type"}``; /v1 (System One) keeps FastAPI's ``detail`` shape."""
    message = str(exc)
    extra = getattr(exc, "extra", {})
    if request.url.path.startswith("/v1/"):
        return {"detail": {"error_type": exc.code, "message": message, **extra}}
    body: dict[str, Any] = {"error": message, "type": exc.code, **extra}
    if exc.retryable:
        body["retryable"] = True
    return body


def error_response(request: Request, exc: SemifError) -> JSONResponse:
    headers = {"Retry-After": str(request.app.state.settings.retry_after_s)} if exc.retryable else {}
    if getattr(exc, "close_connection", False):
        headers["Connection"] = "close"
    return JSONResponse(_error_body(request, exc), status_code=exc.status, headers=headers or None)


def _validation_error(exc: ValidationError, root: tuple[str | int, ...] = ()) -> DecisionValidationError:
    first = exc.errors()[0]
    loc = root + tuple(first["loc"])
    return DecisionValidationError(first["msg"], loc=loc)


# Bodies above this size are parsed and validated on a worker thread, so /ping never waits behind them.
OFF_LOOP_BYTES = 64 * 1024
_PARSERS = threading.BoundedSemaphore(2)  # at most two large bodies parsed at once: CPU and memory bounded


async def off_loop(size: int, parse: Callable[[], T]) -> T:
    """Run ``parse`` inline for small bodies, else on a worker thread (at most two at a time)."""
    if size <= OFF_LOOP_BYTES:
        return parse()

    def bounded() -> T:
        with _PARSERS:
            return parse()

    return await asyncio.to_thread(bounded)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "application/json").split(";")[0].strip().lower()


def create_app(
    settings: Settings,
    engine_factory: Callable[[], Engine],
    *,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    metrics = Metrics()
    service = DecisionService(settings, engine_factory, metrics, on_fatal=on_fatal)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import asyncio

        loader = asyncio.create_task(service.start())
        app.state.loader = loader
        try:
            yield
        finally:
            if not loader.done():
                await loader
            await service.shutdown()

    app = FastAPI(
        title="semif-adapter",
        version=__version__,
        description="Probabilities over declared options, read from a GGUF model's last-position logits.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.service = service
    app.state.metrics = metrics
    app.add_middleware(AmbiguousFramingGuard)

    # --- middleware: request id, one structured log line, metrics ----------------------------
    @app.middleware("http")
    async def observe(request: Request, call_next: Callable[[Request], Any]) -> Response:
        request_id = (
            request.headers.get("x-amzn-requestid") or request.headers.get("x-request-id") or uuid.uuid4().hex
        )
        request.state.request_id = request_id
        request.state.log = {}
        started = time.perf_counter()
        try:  # the key first; then the request's deadline and its connection, for the engine to stop on
            if auth.requires_key(request.url.path, settings.api_key, settings.metrics_open):
                auth.check_bearer(request.headers.get("authorization"), settings.api_key)
            limit_s = request_scope.requested_limit(request.headers, settings.request_timeout_s)
        except auth.AuthenticationFailed as exc:
            response = error_response(request, exc)
            response.headers["WWW-Authenticate"] = "Bearer"
        except SemifError as exc:
            response = _header_error(request, exc)
        else:
            bound = request_scope.bind(request_scope.RequestScope(limit_s, request.receive))
            try:
                response = await call_next(request)
            finally:
                request_scope.unbind(bound)
        elapsed = time.perf_counter() - started
        route = request.scope.get("route")
        route_path = getattr(route, "path", "unmatched")
        response.headers["X-Request-Id"] = request_id
        if route_path not in ("/ping", "/metrics"):
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

    def _header_error(request: Request, exc: SemifError) -> Response:
        if request.url.path.startswith("/v1/"):
            issue = {"loc": list(exc.loc), "msg": exc.message, "type": "value_error"}
            return JSONResponse({"detail": [issue]}, status_code=422)
        return error_response(request, exc)

    # --- error handlers ------------------------------------------------------------------------
    @app.exception_handler(SemifError)
    async def semif_error(request: Request, exc: SemifError) -> JSONResponse:
        if exc.status >= 500 and not exc.retryable and exc.code != "deadline_exceeded":
            log.error("internal error", extra={"request_id": request.state.request_id, "error": str(exc)})
        return error_response(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if request.url.path.startswith("/v1/"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": str(exc.detail), "type": kind}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path.startswith("/v1/"):
            errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
            return JSONResponse({"detail": errors}, status_code=422)
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"error": f"{loc}: {first['msg']}", "type": "invalid_request"}, status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"request_id": getattr(request.state, "request_id", None)})
        return JSONResponse({"error": "internal server error", "type": "internal_error"}, status_code=500)

    # --- routes ------------------------------------------------------------------------------------
    @app.get("/ping", summary="SageMaker health check: 200 once the model is loaded and warmed up")
    async def ping() -> JSONResponse:
        if service.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": service.phase.value, "error": service.failure},
            status_code=503,
            headers={"Retry-After": str(settings.retry_after_s)},
        )

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/invocations",
        summary="Score one decision, several decisions about one state, or a jsonlines batch",
        responses={
            200: {"model": SingleResponse | SharedResponse},
            400: {"model": ErrorResponse},
            413: {"model": ErrorResponse},
            415: {"model": ErrorResponse},
            503: {"model": ErrorResponse},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/InvocationRequest"}},
                    "application/jsonlines": {
                        "schema": {"type": "string", "description": "One Decision JSON object per line."}
                    },
                },
            }
        },
    )
    async def invocations(request: Request) -> Response:
        body = await read_body(request, settings)
        media_type = _media_type(request)
        if media_type in JSONLINES_TYPES:
            return await _jsonlines(request, body)
        if media_type not in JSON_TYPES:
            raise UnsupportedMediaType(
                f"Content-Type {media_type!r} is not supported; use application/json or application/jsonlines"
            )
        payload, parsed = await off_loop(len(body), lambda: _parse_invocation(body))
        if parsed is None:
            from semif_adapter.systemone import answer_systemone_invocation

            return await answer_systemone_invocation(request, service, payload)
        single = parsed.decision is not None
        try:
            # judged before admission: a bad batch gets its 400 even while the engine is busy
            check_shared_batch(parsed.all_decisions, settings.max_decisions, settings.max_options)
            scored = await service.score_timed(parsed.all_decisions)
        except SemifError as exc:
            if single and exc.loc[:2] == ("decisions", 0):
                exc.loc = ("decision", *exc.loc[2:])
            raise
        request.state.log.update(
            decisions=scored.batch.timing.decisions,
            input_tokens=scored.batch.timing.input_tokens,
            queue_wait_s=round(scored.queue_wait_s, 4),
            engine_s=round(scored.engine_s, 4),
        )
        if single:
            content: dict[str, Any] = {"result": scored.batch.results[0].model_dump(mode="json")}
        else:
            content = scored.batch.model_dump(mode="json")
        return JSONResponse(content)

    def _parse_invocation(body: bytes) -> tuple[Any, InvocationRequest | None]:
        """JSON → the decision request (``None`` for a System One body), validated, states rendered."""
        payload = read_decision_json(body, settings.max_json_depth)
        if (
            isinstance(payload, dict)
            and "questions" in payload
            and not ("decision" in payload or "decisions" in payload)
        ):
            return payload, None
        if isinstance(payload, dict):
            refuse_counts(payload, settings)
        try:
            parsed = InvocationRequest.model_validate(payload)
        except ValidationError as exc:
            raise _validation_error(exc) from exc
        for decision in parsed.all_decisions:
            _ = decision.state_text  # a large structured state is rendered here, off the event loop
        return payload, parsed

    async def _jsonlines(request: Request, body: bytes) -> Response:
        decisions = await off_loop(len(body), lambda: _parse_jsonlines(body))
        return await _score_jsonlines(request, decisions)

    def _parse_jsonlines(body: bytes) -> list[Decision]:
        lines: list[tuple[int, bytes]] = []
        for numbered in numbered_lines(body):
            lines.append(numbered)
            if len(lines) > settings.max_decisions:  # refused before any line is parsed
                raise DecisionValidationError(
                    f"more than {settings.max_decisions} lines (SEMIF_MAX_DECISIONS); send them in batches"
                )
        decisions: list[Decision] = []
        for number, line in lines:
            payload = read_decision_json(line, settings.max_json_depth, number)
            if isinstance(payload, dict) and "decision" in payload and len(payload) == 1:
                payload = payload["decision"]  # tolerate {"decision": {...}} per line
            refuse_options(payload, settings, (f"line {number}",))
            try:
                decisions.append(Decision.model_validate(payload))
            except ValidationError as exc:
                raise _validation_error(exc, (f"line {number}",)) from exc
        if not decisions:
            raise DecisionValidationError("jsonlines body has no decisions")
        for decision in decisions:
            _ = decision.state_text
        return decisions

    async def _score_jsonlines(request: Request, decisions: list[Decision]) -> Response:
        # Lines about the same state share one prefill; determinism makes grouping invisible.
        groups: dict[str, list[int]] = {}
        for index, decision in enumerate(decisions):
            groups.setdefault(decision.state_text, []).append(index)
        order = list(groups.values())
        try:
            for group, indices in enumerate(order):
                try:
                    check_shared_batch([decisions[i] for i in indices], len(decisions), settings.max_options)
                except SemifError as exc:
                    exc.group = group  # type: ignore[attr-defined]
                    raise
            batches, waited, engine_s = await service.score_groups(
                [[decisions[i] for i in indices] for indices in order]
            )
        except SemifError as exc:
            group = getattr(exc, "group", None)
            if group is not None and len(exc.loc) >= 2 and isinstance(exc.loc[1], int):
                exc.loc = (f"line {order[group][exc.loc[1]] + 1}", *exc.loc[2:])
            raise
        results: list[Any] = [None] * len(decisions)
        for indices, batch in zip(order, batches, strict=True):
            for index, result in zip(indices, batch.results, strict=True):
                results[index] = result
        request.state.log.update(
            decisions=len(decisions),
            input_tokens=sum(b.timing.input_tokens for b in batches),
            queue_wait_s=round(waited, 4),
            engine_s=round(engine_s, 4),
        )
        text = "".join(result.model_dump_json() + "\n" for result in results)
        return Response(text, media_type="application/jsonlines")

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        extra = InvocationRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(extra.pop("$defs", {}))
        components["InvocationRequest"] = extra
        app.openapi_schema = schema
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]

    try:
        from semif_adapter.systemone.routes import router as systemone_router
    except ImportError:  # pragma: no cover - only while the package is being assembled
        systemone_router = None
    if systemone_router is not None:
        app.include_router(systemone_router)
    return app
