"""Turn System One questions into engine decisions (the single task→decision mapping).

The JevBench runner (issue 6) maps its tasks through :func:`question_to_decision` too, so the
benchmark measures exactly what the API serves. Choices made here, and why:

* The caller's question id is never shown to the model; decisions get positional ids that the
  engine does not show either, so renaming or reordering questions cannot change an answer.
* Structured instructions and criteria are shown as compact JSON (same rendering as the state).
* Empty or missing instructions fall back to a fixed question per type (:data:`DEFAULT_INSTRUCTIONS`).
* noul options are always ``no`` then ``yes``. A missing side of a one-sided criterion is described
  as the complement of the other side ("Anything other than: …"), so the model compares two
  explicit descriptions instead of a described outcome against a bare word.
* Empty-string descriptions count as missing (the engine then shows the option id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from semif_adapter.protocol import Decision, Option
from semif_adapter.systemone.errors import LocPart, SystemOneValidationError
from semif_adapter.systemone.protocol import (
    BoxQuestion,
    ChoiceQuestion,
    Content,
    NoulCriteria,
    NoulQuestion,
    Question,
    TextQuestion,
)

# The engine lays a decision out as "State: … Question: … Options: A. … B. …", so defaults name the
# state; a noul without instructions or criteria asks about the state itself as a statement.
DEFAULT_INSTRUCTIONS = {
    "noul": "Is the statement true?",
    "noul_with_criteria": "Which option describes the state?",
    "choice": "Which option best fits the state?",
    "score": "Which level best describes the state?",
}
NOUL_NO, NOUL_YES = "no", "yes"
COMPLEMENT_PREFIX = "Anything other than: "

_question_adapter: TypeAdapter[Any] = TypeAdapter(Question)


def parse_question(raw: Any, loc: Sequence[LocPart] = ()) -> TextQuestion:
    """Validate one question dict (as the API would) and refuse image questions."""
    try:
        question = _question_adapter.validate_python(raw)
    except ValidationError as error:
        raise SystemOneValidationError.from_pydantic(error, prefix=loc) from error
    return refuse_images(question, loc)


def refuse_images(question: TextQuestion | BoxQuestion, loc: Sequence[LocPart] = ()) -> TextQuestion:
    if isinstance(question, BoxQuestion):
        raise SystemOneValidationError.single(
            [*loc, "type"],
            "box questions need an image model; this server serves text models only "
            "(supported types: noul, choice, score)",
            "unsupported_question_type",
        )
    return question


def content_text(value: Content | None, loc: Sequence[LocPart]) -> str | None:
    """What the model reads for a piece of content; ``None`` for missing or blank text.

    Refuses content that cannot be sent on or echoed back as valid UTF-8 JSON (lone surrogates,
    NaN/Infinity), which would otherwise fail later as a server error.
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except ValueError as error:
            raise SystemOneValidationError.single(loc, f"not valid JSON content: {error}") from error
    ensure_utf8(text, loc)
    return text if text.strip() else None


def ensure_utf8(text: str, loc: Sequence[LocPart]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SystemOneValidationError.single(
            loc, "text is not valid Unicode (lone surrogate escape)", "string_unicode"
        ) from error


def noul_options(criteria: NoulCriteria | None, loc: Sequence[LocPart] = ()) -> list[Option]:
    """``no`` then ``yes``; each reads its criterion, the complement of the other one, or its word."""
    true_text = content_text(criteria.true, [*loc, "true"]) if criteria else None
    false_text = content_text(criteria.false, [*loc, "false"]) if criteria else None
    no_text = false_text or (COMPLEMENT_PREFIX + true_text if true_text else None)
    yes_text = true_text or (COMPLEMENT_PREFIX + false_text if false_text else None)
    return [Option(id=NOUL_NO, description=no_text), Option(id=NOUL_YES, description=yes_text)]


def question_options(question: TextQuestion, loc: Sequence[LocPart] = ()) -> list[Option]:
    """Engine options in answer order: noul no/yes, choice names in criteria order, score 0..n-1."""
    criteria_loc = [*loc, question.type, "criteria"]
    if isinstance(question, NoulQuestion):
        return noul_options(question.criteria, criteria_loc)
    if isinstance(question, ChoiceQuestion):
        options = []
        for name, description in question.criteria.items():
            ensure_utf8(name, [*criteria_loc, name])
            options.append(Option(id=name, description=content_text(description, [*criteria_loc, name])))
        return options
    options = []
    for index, level in enumerate(question.criteria):
        text = content_text(level, [*criteria_loc, index])
        if text is None:
            raise SystemOneValidationError.single(
                [*criteria_loc, index], "score levels need a non-empty description", "string_too_short"
            )
        options.append(Option(id=str(index), description=text))
    return options


def question_text(question: TextQuestion, loc: Sequence[LocPart] = ()) -> str:
    text = content_text(question.instructions, [*loc, question.type, "instructions"])
    if text is not None:
        return text
    if isinstance(question, NoulQuestion) and question.criteria is not None:
        if content_text(question.criteria.true, ()) or content_text(question.criteria.false, ()):
            return DEFAULT_INSTRUCTIONS["noul_with_criteria"]
    return DEFAULT_INSTRUCTIONS[question.type]


def question_to_decision(
    question: TextQuestion,
    state: Content,
    decision_id: str,
    loc: Sequence[LocPart] = (),
) -> Decision:
    """The engine decision for one question; ``loc`` prefixes error locations (e.g. body.questions.q)."""
    return Decision(
        id=decision_id,
        state=state,
        question=question_text(question, loc),
        options=question_options(question, loc),
        type=question.type,
    )


def decision_for_question(raw_question: Any, state: Content, decision_id: str) -> Decision:
    """A JevBench/System One question dict straight to a decision (what the eval runner calls)."""
    return question_to_decision(parse_question(raw_question), state, decision_id)
