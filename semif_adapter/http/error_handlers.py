"""App-wide exception handlers: each answers in the error shape of the API the path belongs to."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from semif_adapter.decisions.errors import DECISION_ERRORS
from semif_adapter.errors import SemifError
from semif_adapter.http.rendering import SYSTEMONE_API, ErrorRenderer
from semif_adapter.systemone.errors import SYSTEMONE_ERRORS

log = logging.getLogger("semif_adapter.http")


def renderer_for(path: str) -> ErrorRenderer:
    """The one place a path picks its API's error shape: System One under ``/v1/``, else decisions."""
    return SYSTEMONE_ERRORS if path.startswith("/v1/") else DECISION_ERRORS


def _renderer(request: Request) -> ErrorRenderer:
    if getattr(request.state, "api", None) == SYSTEMONE_API:
        return SYSTEMONE_ERRORS
    return renderer_for(request.url.path)


def _retry_after_s(request: Request) -> int:
    retry_after_s: int = request.app.state.settings.retry_after_s
    return retry_after_s


async def _semif_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SemifError)
    if exc.status >= 500 and not exc.retryable and exc.code != "deadline_exceeded":
        log.error("internal error", extra={"request_id": request.state.request_id, "error": str(exc)})
    return _renderer(request).semif_error(exc, _retry_after_s(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _renderer(request).http_error(exc)


async def _request_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _renderer(request).validation_error(exc)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", extra={"request_id": getattr(request.state, "request_id", None)})
    return _renderer(request).internal_error()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SemifError, _semif_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(Exception, _unexpected)
