"""One code path for System One requests, shared by ``/v1/systemone`` and ``/invocations``.

All questions of a request become decisions about the same state and go to the engine as one
``service.score`` call, so the state is prefilled once and every question forks from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import ValidationError

from semif_adapter.errors import (
    DecisionValidationError,
    EngineFailure,
    NotReady,
    SemifError,
    TokenBudgetExceeded,
)
from semif_adapter.http.json_reader import DEFAULT_MAX_DEPTH, JsonError, read_json
from semif_adapter.protocol import BatchResult, Decision
from semif_adapter.settings import Settings
from semif_adapter.systemone.answers import answer_for
from semif_adapter.systemone.convert import content_text, ensure_utf8, question_to_decision, refuse_images
from semif_adapter.systemone.errors import LocPart, SystemOneValidationError
from semif_adapter.systemone.protocol import (
    SystemOneRequest,
    SystemOneResponse,
    TextQuestion,
    Usage,
)

Built = tuple[str, TextQuestion, Decision]


class ScoringService(Protocol):
    """What this module needs from ``semif_adapter.serving.DecisionService``."""

    settings: Settings

    @property
    def ready(self) -> bool: ...

    @property
    def served_model_name(self) -> str: ...

    async def score(self, decisions: list[Decision]) -> BatchResult: ...


def is_systemone_payload(payload: object) -> bool:
    """How ``/invocations`` tells a System One body from a decision body."""
    return (
        isinstance(payload, dict)
        and "questions" in payload
        and not ("decision" in payload or "decisions" in payload)
    )


def parse_json_body(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """The shared JSON reader, its refusal as FastAPI would report it: a 422 ``json_invalid``.

    ``loc`` is ``["body", position]`` for text that does not parse, ``["body", *path]`` for a value
    that breaks a limit (duplicate key, number size, NaN, nesting, NUL, lone surrogate).
    """
    try:
        return read_json(body, max_depth)
    except JsonError as error:
        if error.line is None:
            loc: list[LocPart] = ["body", *error.path]
            msg = f"JSON decode error: {error.message}"
        else:
            loc = ["body", error.pos or 0]
            msg = f"JSON decode error: {error.message} at {error.position}"
        raise SystemOneValidationError.single(loc, msg, "json_invalid") from error


def accepted_model_names(served_model_name: str, aliases: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([served_model_name, *aliases]))


def parse_request(payload: Any, settings: Settings, served_model_name: str) -> SystemOneRequest:
    """Validate the body and every limit that does not need the model, before any engine work."""
    questions = payload.get("questions") if isinstance(payload, dict) else None
    if isinstance(questions, dict) and len(questions) > settings.max_decisions:
        # Before validating them all, which takes seconds for a body of half a million questions.
        raise SystemOneValidationError.single(
            ["body", "questions"],
            f"at most {settings.max_decisions} questions per request (got {len(questions)})",
            "too_long",
        )
    try:
        request = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise SystemOneValidationError.from_pydantic(error) from error
    accepted = accepted_model_names(served_model_name, settings.model_aliases)
    if request.model not in accepted:
        raise SystemOneValidationError.single(
            ["body", "model"],
            f"unknown model {request.model!r}; available: {', '.join(accepted)}",
            "model_not_found",
        )
    if request.assets:
        raise SystemOneValidationError.single(
            ["body", "assets"], "image assets need an image model; this server serves text models only"
        )
    content_text(request.state, ["body", "state"])
    return request


def build_decisions(request: SystemOneRequest, max_options: int) -> list[Built]:
    """(question id, question, decision) in request order; decision ids are positional.

    Collects the problems of every question, so one 422 names them all.
    """
    built: list[Built] = []
    errors: list[dict[str, Any]] = []
    for index, (qid, question) in enumerate(request.questions.items()):
        loc = ["body", "questions", qid]
        try:
            ensure_utf8(qid, loc)
            text_question = refuse_images(question, loc)
            decision = question_to_decision(text_question, request.state, f"q{index}", loc)
        except SystemOneValidationError as error:
            errors.extend(error.errors)
            continue
        if len(decision.options) > max_options:
            errors.append(
                {
                    "loc": [*loc, question.type, "criteria"],
                    "msg": f"at most {max_options} options per question (got {len(decision.options)})",
                    "type": "too_long",
                }
            )
            continue
        built.append((qid, text_question, decision))
    if errors:
        raise SystemOneValidationError(errors)
    return built


def _question_loc(error: SemifError, built: list[Built]) -> tuple[list[LocPart], str | None]:
    """Where an engine error about ``decisions[i]`` lies in the caller's request, and which question."""
    loc = list(error.loc)
    index = next((part for part in loc if isinstance(part, int)), None)
    if index is None or not 0 <= index < len(built):
        if len(built) == 1:
            index = 0
        else:
            return ["body", "questions"], None
    qid, question, _ = built[index]
    rest = [part for part in loc[loc.index(index) + 1 :] if isinstance(part, str)] if index in loc else []
    if rest and rest[0] == "state":
        return ["body", "state"], qid
    field = {"options": "criteria", "question": "instructions"}.get(rest[0]) if rest else None
    return ["body", "questions", qid, *([question.type, field] if field else [])], qid


async def answer_systemone(service: ScoringService, payload: Any) -> dict[str, Any]:
    """Answer a System One request body (already JSON-decoded) as a JSON-ready dict.

    Raises :class:`SystemOneValidationError` or another ``SemifError``; the app's handlers render
    either in the Jev shape (``systemone.errors.SYSTEMONE_ERRORS``).
    """
    if not service.ready:
        # Checked first: the accepted model names are only known once the model is loaded.
        raise NotReady("the model is not ready (loading, failed or shutting down); retry later")
    settings = service.settings
    served = service.served_model_name
    request = parse_request(payload, settings, served)
    built = build_decisions(request, settings.max_options)
    try:
        batch = await service.score([decision for _, _, decision in built])
    except DecisionValidationError as error:
        loc, _ = _question_loc(error, built)
        raise SystemOneValidationError.single(loc, error.message) from error
    except TokenBudgetExceeded as error:
        _, qid = _question_loc(error, built)
        where = f" (question {qid!r})" if qid is not None else ""
        raise TokenBudgetExceeded(error.message + where) from error
    by_id = {result.id: result for result in batch.results}
    missing = [decision.id for _, _, decision in built if decision.id not in by_id]
    if missing:
        raise EngineFailure(f"engine returned no result for decisions {missing}")
    answers = {qid: answer_for(question, by_id[decision.id]) for qid, question, decision in built}
    response = SystemOneResponse(
        model=served, answers=answers, usage=Usage(input_tokens=batch.timing.input_tokens)
    )
    body = response.model_dump(mode="json", exclude_none=True)
    # Schema fields first, x_ diagnostics last (a stable sort keeps each group's order).
    body["answers"] = {
        qid: dict(sorted(answer.items(), key=lambda item: item[0].startswith("x_")))
        for qid, answer in body["answers"].items()
    }
    return body
