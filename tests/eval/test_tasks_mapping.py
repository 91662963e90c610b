"""Task loading/validation and the task → request / response → probabilities mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semif_adapter.eval.mapping import (
    AnswerError,
    parse_semif_response,
    parse_systemone_response,
    task_to_decision,
    task_to_systemone_request,
)
from semif_adapter.eval.tasks import Task, TaskFileError, load_tasks, parse_tasks
from semif_adapter.protocol import Decision


def _task(**overrides: object) -> dict:
    base = {
        "id": "t1",
        "family": "routing",
        "state": {"ticket": "charged twice"},
        "question": {
            "type": "choice",
            "instructions": {"ask": "which queue?"},
            "criteria": {"billing": "money", "tech": None},
        },
        "labels": ["billing", "tech"],
        "expected": "billing",
    }
    base.update(overrides)
    return base


def test_devset_loads_and_every_task_maps_to_a_valid_decision(devset: list[Task]) -> None:
    assert len(devset) == 60
    assert {t.type for t in devset} == {"choice", "noul", "score"}
    for task in devset:
        decision = Decision.model_validate(task_to_decision(task))
        assert [o.id for o in decision.options] == task.labels
        assert decision.type == task.type


def test_choice_mapping_renders_objects_as_compact_json() -> None:
    task = Task.model_validate(_task())
    decision = task_to_decision(task)
    assert decision == {
        "id": "t1",
        "state": {"ticket": "charged twice"},
        "question": '{"ask":"which queue?"}',
        "type": "choice",
        "options": [{"id": "billing", "description": "money"}, {"id": "tech", "description": None}],
    }
    request = task_to_systemone_request(task)
    assert request["model"] == "jev-latest"
    assert request["questions"]["t1"]["criteria"] == {"billing": "money", "tech": None}


def test_noul_and_score_options() -> None:
    noul = Task.model_validate(
        _task(
            question={"type": "noul", "instructions": "q", "criteria": {"true": "do it"}},
            labels=["no", "yes"],
            expected=True,
        )
    )
    # the same mapping the System One API serves: the missing side is the complement
    assert task_to_decision(noul)["options"] == [
        {"id": "no", "description": "Anything other than: do it"},
        {"id": "yes", "description": "do it"},
    ]
    assert noul.expected_index == 1
    score = Task.model_validate(
        _task(
            question={"type": "score", "instructions": "q", "criteria": ["low", "mid", "high"]},
            labels=["0", "1", "2"],
            expected=2,
        )
    )
    assert task_to_decision(score)["options"] == [
        {"id": "0", "description": "low"},
        {"id": "1", "description": "mid"},
        {"id": "2", "description": "high"},
    ]
    assert score.expected_label == "2"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"expected": "sales"}, "not one of the labels"),
        ({"labels": ["billing", "billing"]}, "unique"),
        ({"labels": ["billing", "other"]}, "criteria names"),
        (
            {"question": {"type": "noul", "instructions": "q"}, "labels": ["yes", "no"], "expected": "yes"},
            "noul labels",
        ),
        (
            {
                "question": {"type": "score", "instructions": "q", "criteria": ["a", "b"]},
                "labels": ["0", "1"],
                "expected": 2,
            },
            "outside",
        ),
        ({"question": {"type": "multi", "instructions": "q"}}, "question.type"),
    ],
)
def test_invalid_tasks_name_the_line(overrides: dict, fragment: str) -> None:
    lines = [json.dumps(_task(id="ok")), "", json.dumps(_task(**overrides))]
    with pytest.raises(TaskFileError) as info:
        parse_tasks(lines, source="x.jsonl")
    assert "x.jsonl:3" in str(info.value) and fragment in str(info.value)


def test_duplicate_ids_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="duplicate task id"):
        parse_tasks([json.dumps(_task()), json.dumps(_task())])
    with pytest.raises(TaskFileError, match="not JSON"):
        parse_tasks(["{"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TaskFileError, match="no tasks"):
        load_tasks(empty)


def test_semif_response_is_aligned_by_id_not_position() -> None:
    task = Task.model_validate(_task())
    payload = {
        "result": {
            "option_ids": ["tech", "billing"],
            "probabilities": [0.25, 0.75],
            "option_logits": [-1.0, 0.1],
            "calibration": {"temperature": 1.5, "key": "choice"},
            "prompt_version": "p1",
            "model": {"sha256": "aa"},
        }
    }
    pred = parse_semif_response(task, payload)
    assert pred.probabilities == [0.75, 0.25]
    assert pred.option_logits == [0.1, -1.0]
    assert pred.calibration == {"temperature": 1.5, "key": "choice"}
    assert (pred.prompt_version, pred.model_sha256) == ("p1", "aa")


@pytest.mark.parametrize(
    "result",
    [
        {"option_ids": ["billing"], "probabilities": [1.0]},
        {"option_ids": ["billing", "tech"], "probabilities": [0.7, 0.7]},
        {"option_ids": ["billing", "sales"], "probabilities": [0.5, 0.5]},
        {"option_ids": ["billing", "tech"], "probabilities": [float("nan"), 0.5]},
        {"option_ids": ["billing", "billing"], "probabilities": [0.5, 0.5]},
    ],
)
def test_semif_response_defects_are_answer_errors(result: dict) -> None:
    with pytest.raises(AnswerError):
        parse_semif_response(Task.model_validate(_task()), {"result": result})


def test_systemone_answers_map_to_label_order() -> None:
    noul = Task.model_validate(
        _task(question={"type": "noul", "instructions": "q"}, labels=["no", "yes"], expected="yes")
    )
    pred = parse_systemone_response(
        noul,
        {"answers": {"t1": {"type": "noul", "noul": 0.9, "x_option_logits": {"true": 2.0, "false": 0.5}}}},
    )
    assert pred.probabilities == pytest.approx([0.1, 0.9])
    assert pred.option_logits == [0.5, 2.0]
    choice = Task.model_validate(_task())
    pred = parse_systemone_response(
        choice,
        {
            "answers": {
                "t1": {
                    "type": "choice",
                    "choice": "tech",
                    "probabilities": {"tech": 0.6, "billing": 0.4},
                    "confidence": 0.2,
                }
            }
        },
    )
    assert pred.probabilities == [0.4, 0.6] and pred.option_logits is None
    with pytest.raises(AnswerError, match="does not match"):
        parse_systemone_response(choice, {"answers": {"t1": {"type": "noul", "noul": 0.5}}})
    with pytest.raises(AnswerError, match="no answer"):
        parse_systemone_response(choice, {"answers": {}})
