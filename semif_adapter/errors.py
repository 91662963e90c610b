"""Typed errors shared by the engine and the HTTP layer.

Each error carries a stable ``code`` (the wire ``type``) and the HTTP status the HTTP layer maps it to,
so the mapping lives next to the error, not in every handler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

Loc = tuple[str | int, ...]


class SemifError(Exception):
    """Base class: ``code`` is the wire error type, ``status`` the HTTP status it maps to."""

    code = "internal_error"
    status = 500
    retryable = False
    close_connection = False  # answer, then close: the rest of the stream cannot be trusted
    extra: Mapping[str, Any] = MappingProxyType({})  # more wire fields, e.g. a deadline's token counts

    def __init__(self, message: str, *, loc: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc: Loc = tuple(loc)

    def __str__(self) -> str:
        if self.loc:
            return f"{'.'.join(str(p) for p in self.loc)}: {self.message}"
        return self.message


class DecisionValidationError(SemifError):
    """The caller's request is invalid; ``loc`` names the offending field."""

    code = "invalid_request"
    status = 400


class TokenBudgetExceeded(SemifError):
    """A decision (or the whole request) does not fit the context or token budget; never truncated."""

    code = "token_budget_exceeded"
    status = 413


class UnsupportedMediaType(SemifError):
    code = "unsupported_media_type"
    status = 415


class ModelBusy(SemifError):
    code = "model_busy"
    status = 503
    retryable = True


class NotReady(SemifError):
    code = "not_ready"
    status = 503
    retryable = True


class ShuttingDown(SemifError):
    """The server was told to stop and its grace period ended while this request was still running."""

    code = "shutting_down"
    status = 503
    retryable = True


class EngineFailure(SemifError):
    """The model produced something unusable (non-finite logits, a failed decode).

    Never the caller's fault, so never a 4xx.
    """

    code = "engine_error"
    status = 500


class ModelLoadError(SemifError):
    """The model or llama.cpp library cannot be used; start-up must stop with this message."""

    code = "model_load_error"
    status = 500
