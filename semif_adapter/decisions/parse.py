"""From a decision API body to validated decisions: media types, JSON, limits, states rendered.

Routes parse large bodies off the event loop (``http.body.off_loop``), so ``/ping`` never waits behind one.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from semif_adapter.decisions.json_body import (
    numbered_lines,
    read_decision_json,
    refuse_counts,
    refuse_options,
)
from semif_adapter.errors import DecisionValidationError, UnsupportedMediaType
from semif_adapter.protocol import Decision, InvocationRequest
from semif_adapter.settings import Settings
from semif_adapter.systemone.serving import is_systemone_payload

# No Content-Type, or the generic octet-stream an InvokeEndpoint caller may leave, is read as JSON.
JSON_TYPES = {"application/json", "text/json", "application/octet-stream", ""}
JSONLINES_TYPES = {
    "application/jsonlines",
    "application/x-jsonlines",
    "application/jsonl",
    "application/x-ndjson",
}


def is_jsonlines(request: Request) -> bool:
    """True for a JSON Lines body; raises 415 for a type that is neither JSON nor JSON Lines."""
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media_type in JSONLINES_TYPES:
        return True
    if media_type not in JSON_TYPES:
        raise UnsupportedMediaType(
            f"Content-Type {media_type!r} is not supported; use application/json or application/jsonlines"
        )
    return False


def validation_error(exc: ValidationError, root: tuple[str | int, ...] = ()) -> DecisionValidationError:
    first = exc.errors()[0]
    loc = root + tuple(first["loc"])
    return DecisionValidationError(first["msg"], loc=loc)


def parse_invocation(body: bytes, settings: Settings) -> tuple[Any, InvocationRequest | None]:
    """JSON → the decision request (``None`` for a System One body), validated, states rendered."""
    payload = read_decision_json(body, settings.max_json_depth)
    if is_systemone_payload(payload):
        return payload, None
    if isinstance(payload, dict):
        refuse_counts(payload, settings)
    try:
        parsed = InvocationRequest.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    for decision in parsed.all_decisions:
        _ = decision.state_text  # a large structured state is rendered here, off the event loop
    return payload, parsed


def parse_jsonlines(body: bytes, settings: Settings) -> list[Decision]:
    """One decision per line (``{"decision": {...}}`` tolerated); the line count is refused first."""
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
            payload = payload["decision"]
        refuse_options(payload, settings, (f"line {number}",))
        try:
            decisions.append(Decision.model_validate(payload))
        except ValidationError as exc:
            raise validation_error(exc, (f"line {number}",)) from exc
    if not decisions:
        raise DecisionValidationError("jsonlines body has no decisions")
    for decision in decisions:
        _ = decision.state_text
    return decisions
