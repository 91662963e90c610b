"""Decision-API bodies (JSON, and JSON Lines line by line) read into raw payloads, before the schema.

The shared JSON reader's refusals become 400s that say where; the count limits are checked on the raw
payload, because validating 6 MB of options or lines only to refuse them afterwards would hold the
event loop for seconds (the engine checks the same limits again on what it is given).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from semif_adapter.errors import DecisionValidationError
from semif_adapter.http.json_reader import JsonError, read_json
from semif_adapter.protocol import check_decision_count
from semif_adapter.settings import Settings


def read_decision_json(body: bytes, max_depth: int, line: int | None = None) -> Any:
    """The shared JSON reader; its refusal becomes a 400 naming where (for JSON Lines, which line)."""
    try:
        return read_json(body, max_depth)
    except JsonError as exc:
        loc: tuple[str | int, ...] = (f"line {line}",) if line is not None else ()
        if exc.line is None:
            raise DecisionValidationError(exc.message, loc=loc + exc.path) from exc
        where = f"line {line} column {exc.column}" if line is not None else exc.position
        raise DecisionValidationError(exc.message, loc=(where,)) from exc


def refuse_counts(payload: dict[str, Any], settings: Settings) -> None:
    """``decisions`` and each decision's ``options``, counted before any is validated."""
    decisions = payload.get("decisions")
    many = decisions if isinstance(decisions, list) else []
    check_decision_count(len(many), settings.max_decisions)
    refuse_options(payload.get("decision"), settings, ("decision",))
    for index, decision in enumerate(many):
        refuse_options(decision, settings, ("decisions", index))


def refuse_options(decision: Any, settings: Settings, loc: tuple[str | int, ...]) -> None:
    options = decision.get("options") if isinstance(decision, dict) else None
    if isinstance(options, list) and len(options) > settings.max_options:
        raise DecisionValidationError(
            f"{len(options)} options; the limit is {settings.max_options}", loc=(*loc, "options")
        )


_LINE = re.compile(rb"[^\r\n]+")


def numbered_lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines, numbered as ``bytes.splitlines`` splits (LF, CRLF or CR).

    Blank runs are skipped by the regex engine, so 6 MB of newlines (cheap to send) is cheap to refuse.
    """
    number, last = 1, 0
    for match in _LINE.finditer(body):
        start = match.start()
        number += body.count(b"\n", last, start) + body.count(b"\r", last, start)
        number -= body.count(b"\r\n", last, start)
        last = start
        if not match.group().isspace():
            yield number, match.group()
