"""The docs a user reads first: every setting documented, a short README, figures taken from result files."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
