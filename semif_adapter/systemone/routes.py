"""HTTP routes of the System One API: ``POST /v1/systemone`` and ``GET /v1/models``.

The body is read with :func:`semif_adapter.http.body.read_body` (size/time limits, gzip/zstd) rather
than by FastAPI, so the request model is declared for OpenAPI only and validated in
:func:`answer_systemone` — the same code path ``/invocations`` uses.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from semif_adapter.errors import NotReady
from semif_adapter.http.body import off_loop, read_body
from semif_adapter.http.rendering import SYSTEMONE_API
from semif_adapter.systemone.protocol import (
    ErrorBody,
    HTTPValidationError,
    ModelCard,
    ModelList,
    SystemOneRequest,
    SystemOneResponse,
)
from semif_adapter.systemone.serving import (
    ScoringService,
    accepted_model_names,
    answer_systemone,
    parse_json_body,
)


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve pydantic's local ``#/$defs`` refs, which mean nothing inside an OpenAPI document.

    The discriminator goes too: its mapping names those refs; each inlined branch still pins ``type``.
    """
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {
            key: _inline_refs(value, defs)
            for key, value in node.items()
            if key not in ("$defs", "discriminator")
        }
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    return node


def _request_body_schema() -> dict[str, Any]:
    schema = SystemOneRequest.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline_refs(schema, schema.get("$defs", {}))}},
        }
    }


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer key (when SEMIF_API_KEY is set)."},
    408: {"model": ErrorBody, "description": "Request body not received in time."},
    413: {"model": ErrorBody, "description": "Body or token budget exceeded (never truncated)."},
    415: {"model": ErrorBody, "description": "Unsupported Content-Encoding (use gzip, zstd or none)."},
    422: {"model": HTTPValidationError, "description": "Invalid request; loc names the field."},
    503: {"model": ErrorBody, "description": "Busy or loading; retry after Retry-After seconds."},
}

router = APIRouter(tags=["System One (Jev-compatible)"])


def _service(request: Request) -> ScoringService:
    service: ScoringService = request.app.state.service  # create_app always sets it
    return service


def _loaded(service: Any) -> Any:
    if not service.ready or service.model_info is None:
        raise NotReady("the model is not ready (loading, failed or shutting down); retry later")
    return service


async def respond(request: Request, service: ScoringService, payload: Any) -> Response:
    """Answer a decoded System One body; its errors are raised and rendered by the app's handlers in
    the Jev shape, on any path (``/invocations`` calls this for bodies with ``questions``)."""
    request.state.api = SYSTEMONE_API
    answer = await answer_systemone(service, payload)
    request.state.log.update(questions=len(answer["answers"]), input_tokens=answer["usage"]["input_tokens"])
    return JSONResponse(answer)


@router.post(
    "/v1/systemone",
    response_model=SystemOneResponse,
    responses=_ERRORS,
    openapi_extra=_request_body_schema(),
    summary="Answer noul / choice / score questions about one state",
)
async def systemone(request: Request) -> Response:
    """The key was checked by the middleware; the body is read bounded and parsed off the event loop
    when large, as ``/invocations`` does."""
    service = _service(request)
    settings = service.settings
    body = await read_body(request, settings)
    payload = await off_loop(len(body), lambda: parse_json_body(body, settings.max_json_depth))
    return await respond(request, service, payload)


def _release_date(service: Any) -> str:
    """The served GGUF's modification date (when it was built or packaged): the file the engine loaded,
    found by discovery or named by SEMIF_GGUF_PATH; today only where no file is known (a stand-in)."""
    engine = getattr(service, "engine", None)
    for candidate in (getattr(engine, "gguf_path", None), getattr(service.settings, "gguf_path", None)):
        if candidate and Path(candidate).is_file():
            mtime = Path(candidate).stat().st_mtime
            return datetime.fromtimestamp(mtime, tz=timezone.utc).date().isoformat()
    return date.today().isoformat()


def model_list(service: Any) -> ModelList:
    served = service.served_model_name
    info = service.model_info
    released = _release_date(service)
    base = (
        f"Self-hosted decision model ({info.architecture or 'GGUF'}, llama.cpp) answering noul, choice "
        "and score questions about text from its option-label logits."
    )
    cards = [ModelCard(name=served, description=base, release_date=released)]
    for alias in accepted_model_names(served, service.settings.model_aliases)[1:]:
        cards.append(ModelCard(name=alias, description=f"Alias of {served}. {base}", release_date=released))
    return ModelList(models=cards)


@router.get(
    "/v1/models",
    response_model=ModelList,
    responses={401: _ERRORS[401], 503: _ERRORS[503]},
    summary="The served model and its accepted aliases",
)
async def models(request: Request) -> Response:
    listing = model_list(_loaded(_service(request)))
    return JSONResponse(listing.model_dump(mode="json"))
