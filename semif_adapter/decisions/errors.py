"""The decision API's error shape: ``{"error", "type"}`` (plus ``retryable`` and extra fields)."""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from semif_adapter.errors import SemifError
from semif_adapter.http.rendering import ErrorRenderer

_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed"}


class DecisionErrors(ErrorRenderer):
    def body(self, exc: SemifError) -> dict[str, Any]:
        body: dict[str, Any] = {"error": str(exc), "type": exc.code, **exc.extra}
        if exc.retryable:
            body["retryable"] = True
        return body

    def http_error(self, exc: StarletteHTTPException) -> JSONResponse:
        kind = _HTTP_KINDS.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": str(exc.detail), "type": kind}, status_code=exc.status_code, headers=exc.headers
        )

    def validation_error(self, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"error": f"{loc}: {first['msg']}", "type": "invalid_request"}, status_code=400)


DECISION_ERRORS = DecisionErrors()
