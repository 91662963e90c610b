"""Labelled tasks in the JevBench format, loaded and checked before anything is sent.

A task is ``{"id", "family", "state", "question": {"type", "instructions", "criteria"}, "labels",
"expected", ...}``. Labels are the answer space in a fixed order (noul ``["no","yes"]``, score
``"0".."n-1"``, choice the criteria names); ``expected`` is one of them (score: an integer level).
Every defect is reported with its file line so a bad dataset fails before the first request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

QuestionType = Literal["choice", "noul", "score"]
NOUL_LABELS = ("no", "yes")


class TaskQuestion(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: QuestionType
    instructions: str | dict[str, Any] | list[Any]
    criteria: dict[str, Any] | list[Any] | None = None


class Task(BaseModel):
    """One labelled decision; ``expected_index`` is the position of the right answer in ``labels``."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    family: str | None = None
    state: str | dict[str, Any] | list[Any]
    question: TaskQuestion
    labels: list[str] = Field(min_length=2)
    expected: str | int | bool

    @property
    def type(self) -> QuestionType:
        return self.question.type

    @property
    def family_name(self) -> str:
        return self.family or self.question.type

    @property
    def expected_label(self) -> str:
        return self.labels[self.expected_index]

    @property
    def expected_index(self) -> int:
        return _expected_index(self.question.type, self.labels, self.expected)

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be unique, got {self.labels}")
        qtype = self.question.type
        if qtype == "noul" and tuple(self.labels) != NOUL_LABELS:
            raise ValueError(f"noul labels must be {list(NOUL_LABELS)}, got {self.labels}")
        if qtype == "score" and self.labels != [str(i) for i in range(len(self.labels))]:
            raise ValueError(f"score labels must be '0'..'n-1', got {self.labels}")
        if qtype == "choice" and isinstance(self.question.criteria, dict):
            if set(self.question.criteria) != set(self.labels):
                raise ValueError("choice labels must be the criteria names")
        if qtype == "score" and isinstance(self.question.criteria, list | dict):
            if len(self.question.criteria) != len(self.labels):
                raise ValueError(
                    f"score has {len(self.question.criteria)} levels but {len(self.labels)} labels"
                )
        _expected_index(qtype, self.labels, self.expected)  # raises on an unknown answer
        return self


def _expected_index(qtype: str, labels: list[str], expected: str | int | bool) -> int:
    if qtype == "noul" and isinstance(expected, bool):
        return 1 if expected else 0
    if qtype == "score" and isinstance(expected, int) and not isinstance(expected, bool):
        if 0 <= expected < len(labels):
            return expected
        raise ValueError(f"expected level {expected} is outside 0..{len(labels) - 1}")
    text = str(expected)
    if qtype == "noul":
        text = {"true": "yes", "false": "no"}.get(text.lower(), text.lower())
    if text not in labels:
        raise ValueError(f"expected {expected!r} is not one of the labels {labels}")
    return labels.index(text)


class TaskFileError(ValueError):
    """A task file that cannot be used; the message names the file and line."""


def parse_tasks(lines: Iterable[str], source: str = "<tasks>") -> list[Task]:
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{source}:{lineno}: not JSON: {exc.msg}") from exc
        try:
            task = Task.model_validate(raw)
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'task'}: {err['msg']}" for err in exc.errors()
            )
            raise TaskFileError(f"{source}:{lineno}: invalid task: {detail}") from exc
        if task.id in seen:
            raise TaskFileError(
                f"{source}:{lineno}: duplicate task id {task.id!r} (first on line {seen[task.id]})"
            )
        seen[task.id] = lineno
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{source}: no tasks")
    return tasks


def load_tasks(*paths: Path) -> list[Task]:
    """Tasks from one or more JSONL files, in file order (ids must be unique across files)."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for path in paths:
        with Path(path).open(encoding="utf-8") as handle:
            for task in parse_tasks(handle, source=str(path)):
                if task.id in seen:
                    raise TaskFileError(f"{path}: task id {task.id!r} already used in an earlier file")
                seen.add(task.id)
                tasks.append(task)
    return tasks
