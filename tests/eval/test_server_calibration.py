"""The real server applies calibration.json (model directory or SEMIF_CALIBRATION_PATH) or refuses to start.

``test_calibration.py`` covers the loader on its own; here the file is written by the harness's writer,
shipped the way SageMaker ships it (inside model.tar.gz) and read by ``python -m semif_adapter serve``
on gemma-270m. The uncalibrated ``live_server`` answers the same decisions, so the raw logits can be
compared across the two processes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from semif_adapter.eval.calibrate import write_calibration
from semif_adapter.eval.mapping import task_to_invocation, task_to_systemone_request
from semif_adapter.eval.tasks import Task, load_tasks
from semif_adapter.model.calibration import CalibrationFile
from tests.helpers.evalserver import DEVSET
from tests.helpers.support import LiveServer, make_model_dir

ServerFactory = Callable[..., LiveServer]

# choice/4 and score/5 exist in the devset; "score" covers score/4 and score/3; noul stays uncalibrated
MODEL_DIR_TEMPERATURES = {"choice": 2.5, "score": 1.7, "score/5": 0.6}
ENV_TEMPERATURES = {"choice": 0.4}


def _calibration_bytes(
    temperatures: dict[str, float], tmp_path: Path, name: str, scoring_version: str
) -> bytes:
    calibration = CalibrationFile(
        temperatures=temperatures, prompt_version=None, scoring_version=scoring_version, source={"test": name}
    )
    return write_calibration(calibration, tmp_path / f"{name}.json").read_bytes()


@pytest.fixture(scope="module")
def scoring_version(live_server: LiveServer) -> str:
    """The scoring the uncalibrated server (same model, same settings) answers under."""
    ping = httpx.get(live_server.url + "/ping", timeout=10).json()
    version: str = ping["scoring_version"]
    return version


def _softmax(logits: list[float], t: float) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / t
    e = np.exp(z - z.max())
    return e / e.sum()


def _pick(tasks: list[Task], qtype: str, n_options: int) -> Task:
    return next(t for t in tasks if t.type == qtype and len(t.labels) == n_options)


def _score(server: LiveServer, task: Task) -> dict[str, Any]:
    response = httpx.post(server.url + "/invocations", json=task_to_invocation(task), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["result"]


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    devset = load_tasks(DEVSET)
    return [
        _pick(devset, "choice", 4),
        _pick(devset, "score", 5),
        _pick(devset, "score", 4),
        _pick(devset, "noul", 2),
    ]


@pytest.fixture(scope="module")
def calibrated_model_dir(
    gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory, scoring_version: str
) -> Path:
    root = tmp_path_factory.mktemp("calibrated")
    data = _calibration_bytes(MODEL_DIR_TEMPERATURES, root, "model-dir", scoring_version)
    model_dir = make_model_dir(root, gemma_gguf, extra_files={"calibration.json": data})
    assert (model_dir / "calibration.json").read_bytes() == data
    return model_dir


def _expected(temperatures: dict[str, float], task: Task) -> tuple[float, str] | None:
    for key in (f"{task.type}/{len(task.labels)}", task.type):
        if key in temperatures:
            return temperatures[key], key
    return None


def _check_calibrated(
    server: LiveServer, reference: LiveServer, tasks: list[Task], temperatures: dict[str, float]
) -> None:
    for task in tasks:
        got, raw = _score(server, task), _score(reference, task)
        assert got["option_ids"] == raw["option_ids"] == task.labels
        # option_logits stay raw: the same numbers an uncalibrated server reads for the same decision
        np.testing.assert_allclose(got["option_logits"], raw["option_logits"], atol=1e-3, err_msg=task.id)
        expected = _expected(temperatures, task)
        if expected is None:
            assert got["calibration"] is None
            t = 1.0
        else:
            t, key = expected
            assert got["calibration"] == {"temperature": pytest.approx(t, rel=1e-12), "key": key}
            # the temperature really moved the probabilities away from the raw softmax
            assert np.abs(np.asarray(got["probabilities"]) - _softmax(got["option_logits"], 1.0)).max() > 1e-3
        np.testing.assert_allclose(
            got["probabilities"], _softmax(got["option_logits"], t), rtol=1e-9, atol=1e-12, err_msg=task.id
        )
        assert raw["calibration"] is None
        np.testing.assert_allclose(raw["probabilities"], _softmax(raw["option_logits"], 1.0), rtol=1e-9)


def test_calibration_json_in_the_model_dir_is_applied(
    calibrated_model_dir: Path, server_factory: ServerFactory, live_server: LiveServer, tasks: list[Task]
) -> None:
    server = server_factory(calibrated_model_dir)
    _check_calibrated(server, live_server, tasks, MODEL_DIR_TEMPERATURES)

    # System One clients get the same calibrated probabilities for the same question
    choice = tasks[0]
    invocation = _score(server, choice)
    response = httpx.post(server.url + "/v1/systemone", json=task_to_systemone_request(choice), timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()["answers"][choice.id]
    by_id = dict(zip(invocation["option_ids"], invocation["probabilities"], strict=True))
    for label in choice.labels:
        assert answer["probabilities"][label] == pytest.approx(by_id[label], abs=1e-6)


def test_semif_calibration_path_wins_over_the_model_dir(
    calibrated_model_dir: Path,
    server_factory: ServerFactory,
    live_server: LiveServer,
    tasks: list[Task],
    tmp_path: Path,
    scoring_version: str,
) -> None:
    explicit = tmp_path / "elsewhere" / "my-calibration.json"
    explicit.parent.mkdir()
    explicit.write_bytes(_calibration_bytes(ENV_TEMPERATURES, tmp_path, "env", scoring_version))
    server = server_factory(calibrated_model_dir, {"SEMIF_CALIBRATION_PATH": str(explicit)})
    _check_calibrated(server, live_server, tasks, ENV_TEMPERATURES)


def _assert_start_up_fails(server: LiveServer, *fragments: str) -> None:
    assert server.process is not None
    code = server.process.wait(timeout=120)
    log = server.log_text()
    assert code != 0, log
    for fragment in fragments:
        assert fragment in log, log


def test_malformed_calibration_in_the_model_dir_stops_start_up(
    gemma_gguf: Path, server_factory: ServerFactory, tmp_path: Path
) -> None:
    bad = b'{"version": 1, "temperatures": {"choice": -1.0}}'
    model_dir = make_model_dir(tmp_path, gemma_gguf, extra_files={"calibration.json": bad})
    server = server_factory(model_dir, wait_ready=False)
    _assert_start_up_fails(
        server, str(model_dir / "calibration.json"), "malformed", "'choice' must be a finite number > 0"
    )


def test_a_calibration_fitted_under_another_scoring_stops_start_up(
    gemma_gguf: Path, server_factory: ServerFactory, tmp_path: Path
) -> None:
    data = _calibration_bytes({"choice": 1.5}, tmp_path, "old", "sv1-0123456789ab")
    model_dir = make_model_dir(tmp_path, gemma_gguf, extra_files={"calibration.json": data})
    server = server_factory(model_dir, wait_ready=False)
    _assert_start_up_fails(
        server, "was fitted under scoring sv1-0123456789ab", "refit", "SEMIF_STALE_CALIBRATION"
    )


@pytest.mark.parametrize(
    ("content", "fragment"), [("{not json", "not readable JSON"), (None, "does not exist")]
)
def test_bad_semif_calibration_path_stops_start_up(
    content: str | None, fragment: str, gemma_gguf: Path, server_factory: ServerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "my-calibration.json"
    if content is not None:
        path.write_text(content)
    server = server_factory(
        None, {"SEMIF_GGUF_PATH": str(gemma_gguf), "SEMIF_CALIBRATION_PATH": str(path)}, wait_ready=False
    )
    _assert_start_up_fails(server, str(path), fragment)
