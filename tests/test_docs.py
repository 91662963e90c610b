"""The docs a user reads first: every setting documented, a short README, figures taken from result files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from semif_adapter.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
RESULTS = ROOT / "benchmarks" / "results"

# **<figure>**<!-- <result file> <dotted path into its JSON> <format spec> -->
FIGURE = re.compile(r"\*\*([^*]+)\*\*<!-- (\S+) (\S+) (\S+) -->")


def test_every_setting_is_in_the_configuration_table() -> None:
    missing = [name for name in Settings.model_fields if f"| `SEMIF_{name.upper()}` |" not in CONFIGURATION]
    assert not missing, f"document these settings in docs/configuration.md: {missing}"


def test_readme_settings_are_real_settings() -> None:
    named = set(re.findall(r"`SEMIF_([A-Z0-9_]+)`", README))
    unknown = sorted(name for name in named if name.lower() not in Settings.model_fields)
    assert named and not unknown, f"README names settings that do not exist: {unknown}"


def test_readme_shows_the_two_set_up_commands_on_a_short_page() -> None:
    assert "make serve" in README and "make test" in README
    assert len(README.splitlines()) <= 250


def test_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert targets and not missing, f"README links to missing files: {missing}"


def lookup(data: object, dotted: str) -> object:
    for key in dotted.split("."):
        data = data[int(key)] if isinstance(data, list) else data[key]  # type: ignore[index]
    return data


def test_readme_headline_figures_match_their_result_files() -> None:
    figures = FIGURE.findall(README)
    assert len(figures) >= 3, "cite the README's figures as **figure**<!-- file path format -->"
    wrong = []
    for shown, name, dotted, spec in figures:
        value = lookup(json.loads((RESULTS / name).read_text()), dotted)
        expected = format(value, spec)
        if shown != expected:
            wrong.append(f"{name} {dotted}: README says {shown}, the file says {expected}")
    assert not wrong, "\n".join(wrong)


def test_figure_pattern_notices_a_hand_edited_number() -> None:
    edited = "**1.234**<!-- engine_overhead-2cpu.json 0.overhead_ratio .3f -->"
    ((shown, name, dotted, spec),) = FIGURE.findall(edited)
    assert shown != format(lookup(json.loads((RESULTS / name).read_text()), dotted), spec)


# The documents that print an answer of the demo model, and the golden request (tests/golden) it is.
EXAMPLES = [("README.md", "readme"), ("docs/api.md", "api-one-decision")]


def _example(document: str) -> tuple[dict, str]:
    """A document's first curl body and the answer it prints."""
    text = (ROOT / document).read_text()
    body = re.search(r"curl -s localhost:8080/invocations .*? -d '(\{.*?\})'", text, re.S)
    answer = re.search(r"```json\n(\{\"result\".*?)```", text, re.S)
    assert body and answer, f"{document}: the example (curl and its answer) is gone"
    return json.loads(body.group(1)), answer.group(1)


def _shown(answer: str) -> dict[str, object]:
    def find(pattern: str) -> str:
        match = re.search(pattern, answer)
        assert match is not None, f"the example answer lacks {pattern}"
        return match.group(1)

    return {
        "probabilities": [float(x) for x in find(r'"probabilities": \[([^\]]*)\]').split(",")],
        "option_logits": [float(x) for x in find(r'"option_logits": \[([^\]]*)\]').split(",")],
        "input_tokens": int(find(r'"input_tokens": (\d+)')),
        "allowed_token_mass": float(find(r'"allowed_token_mass": ([0-9.]+)')),
        "argmax_token": find(r'"argmax_token": "([^"]*)"'),
        "scoring_version": find(r'"scoring_version": "([^"]*)"'),
    }


def _golden(name: str) -> tuple[dict, dict[str, object]]:
    """A golden request's decision and its answer as a document prints it (rounded): the demo model as
    `make serve` runs it, in invariant numerics where the probe proves them."""
    from scripts import golden

    (request,) = [r for r in golden.load_requests() if r["name"] == name]
    entry = golden.load_answers()["models"]["qwen"]["invariant"]
    (decision,) = request["decisions"]
    recorded = entry["answers"][f"{name}/{decision['id']}"]
    return decision, {
        "probabilities": [round(p, 4) for p in recorded["probabilities"]],
        "option_logits": [round(x, 3) for x in recorded["option_logits"]],
        "input_tokens": recorded["input_tokens"],
        "allowed_token_mass": round(recorded["allowed_token_mass"], 4),
        "argmax_token": recorded["argmax_token"],
        "scoring_version": entry["scoring"]["version"],
    }


@pytest.mark.parametrize(("document", "name"), EXAMPLES)
def test_a_printed_example_answer_is_a_golden_answer(document: str, name: str) -> None:
    body, answer = _example(document)
    decision, expected = _golden(name)
    assert body == {"decision": decision}, f"{document}: the curl body is not the golden {name!r} request"
    assert _shown(answer) == expected, (
        f"{document}: the example answer no longer reproduces; print {expected} (tests/golden/answers.json)"
    )


@pytest.mark.parametrize("field", ["probabilities", "option_logits", "input_tokens"])
def test_the_example_check_notices_an_answer_that_moved(field: str) -> None:
    _, answer = _example("README.md")
    value = re.search(rf'"{field}": \[?([0-9.]+)', answer)
    assert value is not None
    digits = value.group(1)
    bumped = digits[:-1] + str((int(digits[-1]) + 1) % 10)  # one unit in the last place shown
    moved = answer[: value.start(1)] + bumped + answer[value.end(1) :]
    assert moved != answer and _shown(moved) != _golden("readme")[1]
