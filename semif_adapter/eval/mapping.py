"""Task → request and response → probabilities, for both wire protocols, in one place.

The benchmark, the calibration fit, the live end-to-end test and the System One routes all need the
same mapping from a JevBench-style question to declared options; keeping it here means a change to
option wording changes every caller at once. Probabilities always come back aligned with
``task.labels`` (ids are matched, never positions), so metrics never depend on server ordering.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from semif_adapter.eval.tasks import Task

DEFAULT_SYSTEMONE_MODEL = "jev-latest"
_SUM_TOLERANCE = 1e-3


class AnswerError(ValueError):
    """A response that cannot be read as an answer to the task (counted as an invalid response)."""


def render_text(value: Any) -> str:
    """Text stays as is; objects and arrays become compact JSON (keys in the author's order)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def task_to_decision(task: Task) -> dict[str, Any]:
    """The semif ``Decision`` body for one task: exactly the decision the System One API would score."""
    from semif_adapter.systemone.convert import decision_for_question

    question = task.question.model_dump(mode="json", exclude_none=True)
    return decision_for_question(question, task.state, task.id).model_dump(mode="json")


def task_options(task: Task) -> list[dict[str, str | None]]:
    """Declared options ``[{"id", "description"}]`` in the order the model is shown them."""
    return list(task_to_decision(task)["options"])


def task_to_invocation(task: Task) -> dict[str, Any]:
    return {"decision": task_to_decision(task)}


def task_to_systemone_request(task: Task, model: str = DEFAULT_SYSTEMONE_MODEL) -> dict[str, Any]:
    """A System One request asking this task's question alone, keyed by the task id."""
    question = task.question.model_dump(mode="json", exclude_none=True)
    return {"model": model, "state": task.state, "questions": {task.id: question}}


@dataclass
class Prediction:
    """What a target answered, aligned with ``task.labels``."""

    probabilities: list[float]
    option_logits: list[float] | None = None
    calibration: dict[str, Any] | None = None
    prompt_version: str | None = None
    scoring_version: str | None = None
    model_sha256: str | None = None
    reply: str | None = None


def _check_distribution(probs: list[float], where: str) -> list[float]:
    if not all(isinstance(p, int | float) and math.isfinite(p) and 0.0 <= p <= 1.0 + 1e-9 for p in probs):
        raise AnswerError(f"{where}: probabilities must be finite numbers in [0, 1]")
    total = math.fsum(probs)
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise AnswerError(f"{where}: probabilities sum to {total:.6f}, not 1")
    return [float(p) for p in probs]


def _align(task: Task, by_id: dict[str, Any], what: str) -> list[Any]:
    missing = [label for label in task.labels if label not in by_id]
    extra = [key for key in by_id if key not in task.labels]
    if missing or extra:
        raise AnswerError(f"{what} do not match the labels: missing {missing}, unexpected {extra}")
    return [by_id[label] for label in task.labels]


def parse_semif_response(task: Task, payload: Any) -> Prediction:
    """Read ``{"result": {option_ids, probabilities, option_logits, calibration, ...}}``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), dict):
        raise AnswerError("response has no 'result' object")
    result = payload["result"]
    ids, probs = result.get("option_ids"), result.get("probabilities")
    if not isinstance(ids, list) or not isinstance(probs, list) or len(ids) != len(probs):
        raise AnswerError("result needs 'option_ids' and 'probabilities' lists of equal length")
    if len(set(ids)) != len(ids):
        raise AnswerError("result has duplicate option ids")
    aligned = _check_distribution(_align(task, dict(zip(ids, probs, strict=True)), "option_ids"), "result")
    logits = result.get("option_logits")
    aligned_logits: list[float] | None = None
    if isinstance(logits, list) and len(logits) == len(ids):
        values = _align(task, dict(zip(ids, logits, strict=True)), "option_ids")
        if all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            aligned_logits = [float(v) for v in values]
    model = result.get("model") if isinstance(result.get("model"), dict) else {}
    return Prediction(
        probabilities=aligned,
        option_logits=aligned_logits,
        calibration=result.get("calibration") if isinstance(result.get("calibration"), dict) else None,
        prompt_version=result.get("prompt_version"),
        scoring_version=result.get("scoring_version"),
        model_sha256=model.get("sha256"),
    )


_NOUL_NAMES = {"no": "no", "yes": "yes", "false": "no", "true": "yes"}


def parse_systemone_response(task: Task, payload: Any) -> Prediction:
    """Read ``{"answers": {task_id: {"type": ..., ...}}}`` (noul/choice/score answer objects)."""
    answers = payload.get("answers") if isinstance(payload, dict) else None
    if not isinstance(answers, dict) or not isinstance(answers.get(task.id), dict):
        raise AnswerError(f"response has no answer for question {task.id!r}")
    answer = answers[task.id]
    if answer.get("type") != task.type:
        raise AnswerError(f"answer type {answer.get('type')!r} does not match question type {task.type!r}")
    if task.type == "noul":
        p = answer.get("noul")
        if not isinstance(p, int | float) or isinstance(p, bool):
            raise AnswerError("noul answer needs a numeric 'noul'")
        probs = _check_distribution([1.0 - float(p), float(p)], "noul")
    else:
        table = answer.get("probabilities")
        if not isinstance(table, dict):
            raise AnswerError(f"{task.type} answer needs a 'probabilities' object")
        probs = _check_distribution(_align(task, table, "probabilities"), task.type)
    logits: list[float] | None = None
    extra = answer.get("x_option_logits")
    if isinstance(extra, dict):
        if task.type == "noul":
            extra = {_NOUL_NAMES.get(str(k).lower(), k): v for k, v in extra.items()}
        values = _align(task, extra, "x_option_logits")
        if all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            logits = [float(v) for v in values]
    calibration = answer.get("x_calibration")
    scoring_version = answer.get("x_scoring_version")
    return Prediction(
        probabilities=probs,
        option_logits=logits,
        calibration=calibration if isinstance(calibration, dict) else None,
        scoring_version=scoring_version if isinstance(scoring_version, str) else None,
    )
