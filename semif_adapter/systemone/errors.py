"""Errors of the System One API and how they are rendered.

Jev clients expect FastAPI's shapes: validation problems are ``422 {"detail": [{loc, msg, type}]}``
and everything else is ``{"detail": {"error_type", "message"}}``. Clients retry 5xx, so a bad
request must never end up as one; only our own failures (engine, bugs) are 5xx.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from semif_adapter.errors import DecisionValidationError, SemifError
from semif_adapter.http.auth import AuthenticationFailed
from semif_adapter.http.rendering import ErrorRenderer

log = logging.getLogger(__name__)

LocPart = str | int


class SystemOneValidationError(Exception):
    """A request the API refuses with 422; ``errors`` are FastAPI-style ``{loc, msg, type}`` dicts."""

    def __init__(self, errors: Iterable[dict[str, Any]]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(f"{_dotted(e['loc'])}: {e['msg']}" for e in self.errors))

    @classmethod
    def single(cls, loc: Sequence[LocPart], msg: str, type_: str = "value_error") -> SystemOneValidationError:
        return cls([{"loc": list(loc), "msg": msg, "type": type_}])

    @classmethod
    def from_pydantic(
        cls, error: ValidationError, prefix: Sequence[LocPart] = ("body",)
    ) -> SystemOneValidationError:
        """Keep pydantic's own loc/msg/type (as FastAPI does) but not ``input``, which may be huge."""
        return cls(
            {"loc": [*prefix, *item["loc"]], "msg": item["msg"], "type": item["type"]}
            for item in error.errors(include_url=False, include_input=False, include_context=False)
        )


def _dotted(loc: Sequence[LocPart]) -> str:
    return ".".join(str(part) for part in loc)


def _detail(code: str, message: str) -> dict[str, dict[str, Any]]:
    return {"detail": {"error_type": code, "message": message}}


def systemone_error_response(exc: BaseException, retry_after_s: int = 1) -> JSONResponse:
    """Render any exception raised while answering a System One request (used by both routes)."""
    if isinstance(exc, SystemOneValidationError):
        return JSONResponse({"detail": exc.errors}, status_code=422)
    # A bare pydantic ValidationError here is a bug of ours (the request parser converts its own),
    # so it falls through to the 500 below rather than blaming the caller.
    if isinstance(exc, DecisionValidationError):
        # The engine's own checks (e.g. label capacity) are still the caller's fault: 422 with a loc.
        loc = ["body", *exc.loc] if exc.loc else ["body"]
        return JSONResponse(
            {"detail": [{"loc": loc, "msg": exc.message, "type": "value_error"}]}, status_code=422
        )
    if isinstance(exc, SemifError):
        headers: dict[str, str] = {}
        if exc.retryable:
            headers["Retry-After"] = str(retry_after_s)
        if isinstance(exc, AuthenticationFailed):
            headers["WWW-Authenticate"] = "Bearer"
        if exc.status >= 500 and not exc.retryable and exc.code != "deadline_exceeded":
            log.error("systemone request failed: %s", exc)
        body = _detail(exc.code, exc.message)
        body["detail"].update(exc.extra)  # e.g. a deadline's token counts
        return JSONResponse(body, status_code=exc.status, headers=headers)
    log.exception("unexpected error in systemone request", exc_info=exc)
    return JSONResponse(_detail("internal_error", "internal server error"), status_code=500)


class SystemOneErrors(ErrorRenderer):
    """The ``/v1/`` shape for errors raised outside the routes (key check, headers, framing, 404/405)."""

    def body(self, exc: SemifError) -> dict[str, Any]:
        return {"detail": {"error_type": exc.code, "message": str(exc), **exc.extra}}

    def header_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        issue = {"loc": list(exc.loc), "msg": exc.message, "type": "value_error"}
        return JSONResponse({"detail": [issue]}, status_code=422)

    def http_error(self, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    def validation_error(self, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)


SYSTEMONE_ERRORS = SystemOneErrors()
