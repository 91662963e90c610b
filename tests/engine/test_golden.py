"""Golden answers (``scripts/golden.py``): every bit of every recorded answer reproduces, and answers can
move only together with a new scoring version and a CHANGELOG entry."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from scripts import golden

ROOT = Path(__file__).resolve().parents[2]
DOC = golden.load_answers()


@pytest.mark.parametrize("mode", golden.MODES)
@pytest.mark.parametrize("model", golden.MODELS)
def test_golden_answers_reproduce_bit_for_bit(
    model: str, mode: str, gemma_gguf: Path, qwen_gguf: Path
) -> None:
    engine = golden.load_engine(model, mode)
    try:
        version = engine.model_info.scoring.version
        computed = golden.score_all(engine, golden.load_requests())
    finally:
        engine.close()
    assert computed, "the golden requests scored nothing"
    problems = golden.check(DOC, model, mode, version, computed)
    assert not problems, "\n".join(problems)


def test_every_golden_request_is_recorded_for_every_model_and_mode() -> None:
    names = {name for name, _ in golden.calls(golden.load_requests())}
    for model in golden.MODELS:
        for mode in golden.MODES:
            recorded = {key.rsplit("/", 1)[0] for key in DOC["models"][model][mode]["answers"]}
            assert recorded == names, f"{model}/{mode}: run make golden"


def test_golden_requests_cover_what_the_issue_names() -> None:
    decisions = [d for _, ds in golden.calls(golden.load_requests()) for d in ds]
    counts = {len(d["options"]) for d in decisions}
    assert {2, 3, 26, 255} <= counts
    states = {type(d["state"]).__name__ for d in decisions}
    assert states == {"str", "dict", "list"}
    shared = [ds for _, ds in golden.calls(golden.load_requests()) if len(ds) > 1]
    assert shared and any("turns" in r for r in golden.load_requests())


def _first_key(doc: dict) -> tuple[str, str, str]:
    model = next(iter(doc["models"]))
    mode = next(iter(doc["models"][model]))
    key = sorted(doc["models"][model][mode]["answers"])[0]
    return model, mode, key


@pytest.mark.parametrize("where", ["recorded", "computed"])
def test_a_one_ulp_change_of_a_golden_probability_fails(where: str) -> None:
    model, mode, key = _first_key(DOC)
    entry = DOC["models"][model][mode]
    computed = copy.deepcopy(entry["answers"])
    doc = copy.deepcopy(DOC)
    assert golden.check(doc, model, mode, entry["scoring"]["version"], computed) == []
    target = doc["models"][model][mode]["answers"] if where == "recorded" else computed
    p = target[key]["probabilities"][0]
    target[key]["probabilities"][0] = float(np.nextafter(p, math.inf))
    problems = golden.check(doc, model, mode, entry["scoring"]["version"], computed)
    assert any(key in problem for problem in problems), problems
    if where == "recorded":  # a hand-edited golden file no longer matches its ledger either
        assert golden.ledger_problems(doc)


def test_moved_answers_pass_again_only_under_a_new_scoring_version() -> None:
    model, mode, key = _first_key(DOC)
    doc = copy.deepcopy(DOC)
    scoring = dict(doc["models"][model][mode]["scoring"])
    computed = copy.deepcopy(doc["models"][model][mode]["answers"])
    computed[key]["probabilities"][0] = float(np.nextafter(computed[key]["probabilities"][0], -math.inf))
    with pytest.raises(SystemExit, match="must change the scoring version"):
        golden.record(doc, model, mode, scoring, computed)
    assert golden.check(doc, model, mode, scoring["version"], computed)
    scoring["version"] = "sv1-ffffffffffff"
    golden.record(doc, model, mode, scoring, computed)
    assert golden.check(doc, model, mode, "sv1-ffffffffffff", computed) == []
    assert golden.check(doc, model, mode, DOC["models"][model][mode]["scoring"]["version"], computed)


def test_a_new_prompt_text_needs_a_new_prompt_version() -> None:
    model, mode, _ = _first_key(DOC)
    doc = copy.deepcopy(DOC)
    scoring = dict(doc["models"][model][mode]["scoring"])
    answers = doc["models"][model][mode]["answers"]
    prompt_version, text_hash = scoring["prompt"].rsplit(".", 1)
    scoring.update(prompt=f"{prompt_version}.{'0' * len(text_hash)}", version="sv1-eeeeeeeeeeee")
    with pytest.raises(SystemExit, match="bump it"):
        golden.record(doc, model, mode, scoring, answers)
    scoring["prompt"] = f"{prompt_version}-next.{'0' * len(text_hash)}"
    golden.record(doc, model, mode, scoring, answers)
    assert doc["models"][model][mode]["scoring"]["prompt"].startswith(prompt_version + "-next.")


def test_the_changelog_names_every_recorded_scoring_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = {e["scoring"]["version"] for modes in DOC["models"].values() for e in modes.values()}
    missing = sorted(v for v in versions if v not in changelog)
    assert not missing, f"CHANGELOG.md must say what moved under {missing}"


def test_the_golden_file_is_what_make_golden_writes(tmp_path: Path) -> None:
    out = tmp_path / "answers.json"
    golden.write_answers(DOC, out)
    assert out.read_text(encoding="utf-8") == golden.ANSWERS.read_text(encoding="utf-8")
    assert json.loads(out.read_text())["format"] == golden.FORMAT
