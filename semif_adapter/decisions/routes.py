"""HTTP routes of the decision API and SageMaker's contract: ``/ping``, ``/metrics``, ``/invocations``.

``/invocations`` reads the whole body (bounded), parses and validates it, admits it to the engine (or
503) and renders the answer. A System One body there is answered by the System One API's own code.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from semif_adapter.decisions.parse import is_jsonlines, parse_invocation, parse_jsonlines
from semif_adapter.errors import SemifError
from semif_adapter.http.body import off_loop, read_body
from semif_adapter.metrics import Metrics
from semif_adapter.protocol import (
    BatchResult,
    Decision,
    DecisionResult,
    ErrorResponse,
    InvocationRequest,
    SharedResponse,
    SingleResponse,
    check_shared_batch,
)
from semif_adapter.serving import DecisionService, GroupFailed
from semif_adapter.systemone.routes import respond as answer_systemone_invocation

router = APIRouter()

_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InvocationRequest"}},
            "application/jsonlines": {
                "schema": {"type": "string", "description": "One Decision JSON object per line."}
            },
        },
    }
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SingleResponse | SharedResponse},
    400: {"model": ErrorResponse},
    413: {"model": ErrorResponse},
    415: {"model": ErrorResponse},
    503: {"model": ErrorResponse},
}


def _service(request: Request) -> DecisionService:
    service: DecisionService = request.app.state.service
    return service


@router.get("/ping", summary="SageMaker health check: 200 once the model is loaded and warmed up")
async def ping(request: Request) -> JSONResponse:
    service = _service(request)
    info = service.model_info
    if service.ready and info is not None:
        return JSONResponse(
            {"status": "ready", "model_sha256": info.sha256, "scoring_version": info.scoring.version}
        )
    return JSONResponse(
        {"status": service.phase.value, "error": service.failure},
        status_code=503,
        headers={"Retry-After": str(service.settings.retry_after_s)},
    )


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus_metrics(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.post(
    "/invocations",
    summary="Score one decision, several decisions about one state, or a jsonlines batch",
    responses=_RESPONSES,
    openapi_extra=_REQUEST_BODY,
)
async def invocations(request: Request) -> Response:
    service = _service(request)
    settings = service.settings
    body = await read_body(request, settings)
    if is_jsonlines(request):
        decisions = await off_loop(len(body), lambda: parse_jsonlines(body, settings))
        return await _score_jsonlines(request, service, decisions)
    payload, parsed = await off_loop(len(body), lambda: parse_invocation(body, settings))
    if parsed is None:
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


def _at_line(exc: SemifError, indices: list[int]) -> SemifError:
    """``exc`` (about decision ``loc[1]`` of the same-state group at body lines ``indices``) naming the
    caller's line instead."""
    if len(exc.loc) >= 2 and isinstance(exc.loc[1], int):
        exc.loc = (f"line {indices[exc.loc[1]] + 1}", *exc.loc[2:])
    return exc


async def _score_jsonlines(request: Request, service: DecisionService, decisions: list[Decision]) -> Response:
    # Lines about the same state share one prefill; determinism makes grouping invisible.
    groups: dict[str, list[int]] = {}
    for index, decision in enumerate(decisions):
        groups.setdefault(decision.state_text, []).append(index)
    order = list(groups.values())
    max_options = service.settings.max_options
    for indices in order:
        try:
            check_shared_batch([decisions[i] for i in indices], len(decisions), max_options)
        except SemifError as exc:
            raise _at_line(exc, indices) from None
    try:
        batches, waited, engine_s = await service.score_groups(
            [[decisions[i] for i in indices] for indices in order]
        )
    except GroupFailed as failed:  # the engine's refusal of one group: loc names the caller's line
        raise _at_line(failed.error, order[failed.index]) from None
    results = _in_request_order(len(decisions), order, batches)
    request.state.log.update(
        decisions=len(decisions),
        input_tokens=sum(b.timing.input_tokens for b in batches),
        queue_wait_s=round(waited, 4),
        engine_s=round(engine_s, 4),
    )
    text = "".join(result.model_dump_json() + "\n" for result in results)
    return Response(text, media_type="application/jsonlines")


def _in_request_order(count: int, order: list[list[int]], batches: list[BatchResult]) -> list[DecisionResult]:
    results: list[DecisionResult | None] = [None] * count
    for indices, batch in zip(order, batches, strict=True):
        for index, result in zip(indices, batch.results, strict=True):
            results[index] = result
    return [result for result in results if result is not None]


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus ``InvocationRequest``, which ``/invocations`` reads itself (JSON or lines)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    extra = InvocationRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(extra.pop("$defs", {}))
    components["InvocationRequest"] = extra
    app.openapi_schema = schema
    return schema
