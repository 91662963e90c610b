"""Errors of the System One API and how they are rendered.

Jev clients expect FastAPI's shapes: validation problems are ``422 {"detail": [{loc, msg, type}]}``
and everything else is ``{"detail": {"error_type", "message"}}``. Clients retry 5xx, so a bad
request must never end up as one; only our own failures (engine, bugs) are 5xx. The routes raise and
the app's handlers render with :data:`SYSTEMONE_ERRORS` (``error_handlers``), like every other error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from semif_adapter.errors import DecisionValidationError, SemifError
from semif_adapter.http.rendering import ErrorRenderer

LocPart = str | int


class SystemOneValidationError(SemifError):
    """A request the API refuses with 422; ``errors`` are FastAPI-style ``{loc, msg, type}`` dicts."""

    code = "invalid_request"
    status = 422

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


class SystemOneErrors(ErrorRenderer):
    """The ``/v1/`` shape of every error: FastAPI's 422 list for a bad request, else ``{"detail":
    {error_type, message}}`` with the error's extra fields (e.g. a deadline's token counts).

    ``message`` is the error's own text without the engine's ``loc``: a System One caller names its
    questions by key, not by the engine's decision index."""

    def body(self, exc: SemifError) -> dict[str, Any]:
        return {"detail": {"error_type": exc.code, "message": exc.message, **exc.extra}}

    def semif_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        if isinstance(exc, SystemOneValidationError):
            return JSONResponse({"detail": exc.errors}, status_code=422)
        if isinstance(exc, DecisionValidationError):
            # the engine's own checks (e.g. label capacity) are still the caller's fault: 422 with a loc
            issue = {"loc": ["body", *exc.loc], "msg": exc.message, "type": "value_error"}
            return JSONResponse({"detail": [issue]}, status_code=422)
        return super().semif_error(exc, retry_after_s)

    def header_error(self, exc: SemifError, retry_after_s: int) -> JSONResponse:
        issue = {"loc": list(exc.loc), "msg": exc.message, "type": "value_error"}
        return JSONResponse({"detail": [issue]}, status_code=422)

    def http_error(self, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    def validation_error(self, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)


SYSTEMONE_ERRORS = SystemOneErrors()
