"""The README documents every setting and both set-up commands."""

from __future__ import annotations

from pathlib import Path

from semif_adapter.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_readme_table() -> None:
    missing = [name for name in Settings.model_fields if f"| `SEMIF_{name.upper()}` |" not in README]
    assert not missing, f"document these settings in README.md: {missing}"


def test_readme_shows_the_two_set_up_commands() -> None:
    assert "make serve" in README and "make test" in README
