"""The shape every API gives its errors: one :class:`ErrorRenderer` per API, chosen by the app.

Each API (decisions at ``/invocations``, System One under ``/v1/``) keeps its own wire shape for every
error: those its routes raise, and those raised outside them (the key check, a bad request header,
ambiguous framing, 404/405). Routes raise; the app's handlers render, once.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from semif_adapter.errors import SemifError
from semif_adapter.http.auth import AuthenticationFailed

#: ``request.state.api`` of a request that one API answers on another's path (a System One body sent to
#: ``/invocations``): its errors take that API's shape.
SYSTEMONE_API = "systemone"


class ErrorRenderer:
    """Renders errors in one API's shape; subclasses say how the body and the framework's errors look."""

    def body(self, exc: SemifError) -> dict[str, Any]:
        raise NotImplementedError

    def semif_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        headers = {"Retry-After": str(retry_after_s)} if exc.retryable else {}
        if exc.close_connection:
            headers["Connection"] = "close"
        if isinstance(exc, AuthenticationFailed):
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(self.body(exc), status_code=exc.status, headers=headers or None)

    def header_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        """A request header the server refuses before any route runs (e.g. a bad deadline)."""
        return self.semif_error(exc, retry_after_s)

    def http_error(self, exc: StarletteHTTPException) -> JSONResponse:
        raise NotImplementedError

    def validation_error(self, exc: RequestValidationError) -> JSONResponse:
        raise NotImplementedError

    def internal_error(self) -> JSONResponse:
        """A fault of ours that no handler expected: a 500 without details (the log has them)."""
        return JSONResponse(self.body(SemifError("internal server error")), status_code=500)
