"""Golden answers (``scripts/golden.py``): every bit of every recorded answer reproduces, and answers can
move only together with a new scoring version and a CHANGELOG entry."""

from __future__ import annotations

import copy
import json
import math
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scripts import golden
from semif_adapter.engine import kernels

ROOT = Path(__file__).resolve().parents[2]
DOC = golden.load_answers()


@pytest.mark.parametrize("mode", golden.MODES)
@pytest.mark.parametrize("model", golden.MODELS)
def test_golden_answers_reproduce_on_the_loaded_kernels(
    model: str, mode: str, gemma_gguf: Path, qwen_gguf: Path, record_property: Callable[[str, object], None]
) -> None:
    """Every bit where these kernels are recorded (``make golden`` on a machine of their kind); within
    the tolerance of the reference answers where they are not."""
    ((scoring, computed),) = golden.compute([model], [mode]).values()
    assert computed, "the golden requests scored nothing"
    record_property("basis", golden.basis(DOC, model, mode, scoring))
    problems = golden.check(DOC, model, mode, scoring, computed)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def reference_computed(gemma_gguf: Path, qwen_gguf: Path) -> golden.Computed:
    return golden.compute_reference(golden.MODELS, golden.MODES)


@pytest.mark.parametrize("mode", golden.MODES)
@pytest.mark.parametrize("model", golden.MODELS)
def test_golden_answers_reproduce_bit_for_bit_on_the_reference_kernels(
    model: str, mode: str, reference_computed: golden.Computed
) -> None:
    """The portable AVX2 build every x86-64 machine with AVX2 loads: there every bit is checked. Elsewhere
    (arm64: the stand-in's Arm plugins) the build is other kernels, held to the tolerance."""
    scoring, computed = reference_computed[model, mode]
    if platform.machine() == "x86_64" and {"avx2", "fma", "f16c"} <= kernels.read_cpu_flags():
        assert golden.kernels_key(scoring) == DOC["reference"], "the reference kernels changed: make golden"
        assert golden.basis(DOC, model, mode, scoring) == "exact"
    problems = golden.check(DOC, model, mode, scoring, computed)
    assert not problems, "\n".join(problems)


def test_every_golden_request_is_recorded_for_every_model_mode_and_kernels() -> None:
    names = {name for name, _ in golden.calls(golden.load_requests())}
    for model in golden.MODELS:
        for mode in golden.MODES:
            recorded = golden.entries(DOC, model, mode)
            assert DOC["reference"] in recorded, f"{model}/{mode}: no reference answers: run make golden"
            for key, entry in recorded.items():
                assert golden.kernels_key(entry["scoring"]) == key
                got = {k.rsplit("/", 1)[0] for k in entry["answers"]}
                assert got == names, f"{model}/{mode} [{key}]: run make golden"


def test_golden_requests_cover_what_the_issue_names() -> None:
    decisions = [d for _, ds in golden.calls(golden.load_requests()) for d in ds]
    counts = {len(d["options"]) for d in decisions}
    assert {2, 3, 26, 255} <= counts
    states = {type(d["state"]).__name__ for d in decisions}
    assert states == {"str", "dict", "list"}
    shared = [ds for _, ds in golden.calls(golden.load_requests()) if len(ds) > 1]
    assert shared and any("turns" in r for r in golden.load_requests())


def _first(doc: dict) -> tuple[str, str, dict, str]:
    """(model, mode, the reference entry, its first answer's key)."""
    model = next(iter(doc["models"]))
    mode = next(iter(doc["models"][model]))
    entry = golden.reference_entry(doc, model, mode)
    assert entry is not None
    return model, mode, entry, sorted(entry["answers"])[0]


@pytest.mark.parametrize("where", ["recorded", "computed"])
def test_a_one_ulp_change_of_a_golden_probability_fails(where: str) -> None:
    doc = copy.deepcopy(DOC)
    model, mode, entry, key = _first(doc)
    computed = copy.deepcopy(entry["answers"])
    assert golden.check(doc, model, mode, entry["scoring"], computed) == []
    target = entry["answers"] if where == "recorded" else computed
    p = target[key]["probabilities"][0]
    target[key]["probabilities"][0] = float(np.nextafter(p, math.inf))
    problems = golden.check(doc, model, mode, entry["scoring"], computed)
    assert any(key in problem for problem in problems), problems
    if where == "recorded":  # a hand-edited golden file no longer matches its ledger either
        assert golden.ledger_problems(doc)


def _unrecorded(scoring: dict) -> dict:
    return dict(scoring, llama_cpp="0c1e570.cpu-avx512.ffffff", version="sv1-dddddddddddd")


def test_kernels_with_no_record_are_held_to_the_reference_within_the_tolerance() -> None:
    doc = copy.deepcopy(DOC)
    model, mode, entry, key = _first(doc)
    scoring = _unrecorded(entry["scoring"])
    computed = copy.deepcopy(entry["answers"])
    assert golden.basis(doc, model, mode, scoring) == "tolerance"
    computed[key]["probabilities"][0] += golden.TOLERANCE / 2
    assert golden.check(doc, model, mode, scoring, computed) == []
    computed[key]["probabilities"][0] += golden.TOLERANCE
    problems = golden.check(doc, model, mode, scoring, computed)
    assert len(problems) == 1 and key in problems[0] and "tolerance" in problems[0], problems
    computed = copy.deepcopy(entry["answers"])
    computed[key]["input_tokens"] += 1
    assert golden.check(doc, model, mode, scoring, computed), "a token count is never within a tolerance"


def test_recording_other_kernels_keeps_the_reference_and_drops_another_commits() -> None:
    doc = copy.deepcopy(DOC)
    model, mode, entry, _ = _first(doc)
    scoring = _unrecorded(entry["scoring"])
    golden.record(doc, model, mode, scoring, copy.deepcopy(entry["answers"]))
    assert {DOC["reference"], scoring["llama_cpp"]} <= set(golden.entries(doc, model, mode))
    upgraded = dict(scoring, llama_cpp="4df29be4f.cpu-avx512.ffffff", version="sv1-cccccccccccc")
    golden.record(doc, model, mode, upgraded, copy.deepcopy(entry["answers"]))
    assert set(golden.entries(doc, model, mode)) == {"4df29be4f.cpu-avx512.ffffff"}


def test_moved_answers_pass_again_only_under_a_new_scoring_version() -> None:
    doc = copy.deepcopy(DOC)
    model, mode, entry, key = _first(doc)
    scoring = dict(entry["scoring"])
    computed = copy.deepcopy(entry["answers"])
    computed[key]["probabilities"][0] = float(np.nextafter(computed[key]["probabilities"][0], -math.inf))
    with pytest.raises(SystemExit, match="must change the scoring version"):
        golden.record(doc, model, mode, scoring, computed)
    assert golden.check(doc, model, mode, scoring, computed)
    old = dict(scoring)
    scoring["version"] = "sv1-ffffffffffff"
    golden.record(doc, model, mode, scoring, computed)
    assert golden.check(doc, model, mode, scoring, computed) == []
    assert golden.check(doc, model, mode, old, computed)


def test_a_new_prompt_text_needs_a_new_prompt_version() -> None:
    doc = copy.deepcopy(DOC)
    model, mode, entry, _ = _first(doc)
    scoring = dict(entry["scoring"])
    answers = entry["answers"]
    prompt_version, text_hash = scoring["prompt"].rsplit(".", 1)
    scoring.update(prompt=f"{prompt_version}.{'0' * len(text_hash)}", version="sv1-eeeeeeeeeeee")
    with pytest.raises(SystemExit, match="bump it"):
        golden.record(doc, model, mode, scoring, answers)
    scoring["prompt"] = f"{prompt_version}-next.{'0' * len(text_hash)}"
    golden.record(doc, model, mode, scoring, answers)
    recorded = golden.entries(doc, model, mode)[scoring["llama_cpp"]]
    assert recorded["scoring"]["prompt"].startswith(prompt_version + "-next.")


def test_the_changelog_names_every_recorded_scoring_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = {
        e["scoring"]["version"]
        for modes in DOC["models"].values()
        for by_kernels in modes.values()
        for e in by_kernels.values()
    }
    missing = sorted(v for v in versions if v not in changelog)
    assert not missing, f"CHANGELOG.md must say what moved under {missing}"


def test_the_golden_file_is_what_make_golden_writes(tmp_path: Path) -> None:
    out = tmp_path / "answers.json"
    golden.write_answers(DOC, out)
    assert out.read_text(encoding="utf-8") == golden.ANSWERS.read_text(encoding="utf-8")
    assert json.loads(out.read_text())["format"] == golden.FORMAT
