"""The shape every API gives its errors: one :class:`ErrorRenderer` per API, chosen by the app.

Each API (decisions at ``/invocations``, System One under ``/v1/``) keeps its own wire shape for errors
raised outside its routes: the key check, a bad request header, ambiguous framing, 404/405.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from semif_adapter.errors import SemifError


class ErrorRenderer:
    """Renders errors in one API's shape; subclasses say how the body and the framework's errors look."""

    def body(self, exc: SemifError) -> dict[str, Any]:
        raise NotImplementedError

    def semif_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        headers = {"Retry-After": str(retry_after_s)} if exc.retryable else {}
        if exc.close_connection:
            headers["Connection"] = "close"
        return JSONResponse(self.body(exc), status_code=exc.status, headers=headers or None)

    def header_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        """A request header the server refuses before any route runs (e.g. a bad deadline)."""
        return self.semif_error(exc, retry_after_s)

    def http_error(self, exc: StarletteHTTPException) -> JSONResponse:
        raise NotImplementedError

    def validation_error(self, exc: RequestValidationError) -> JSONResponse:
        raise NotImplementedError
