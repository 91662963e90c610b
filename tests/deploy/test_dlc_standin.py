"""The DLC stand-in builder's pure parts: which Debian archive it uses, and what it reads from an sdist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.image import dlc_standin

DEB822 = """\
Types: deb
# a comment
URIs: http://archive.example/debian
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://archive.example/debian-security
Suites: trixie-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: trixie
"""


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "extra.list").write_text(
        "# deb http://commented.example/debian trixie main\n"
        "deb [arch=amd64 signed-by=/k.gpg] https://vendor.example/apt stable main\n"
    )
    return tmp_path


def test_reads_both_apt_formats_and_skips_source_entries(etc: Path) -> None:
    found = {(s.uri, s.suite) for s in dlc_standin.apt_sources(etc)}
    assert found == {
        ("http://archive.example/debian", "trixie"),
        ("http://archive.example/debian", "trixie-updates"),
        ("http://archive.example/debian-security", "trixie-security"),
        ("https://vendor.example/apt", "stable"),
    }
    vendor = next(s for s in dlc_standin.apt_sources(etc) if s.suite == "stable")
    assert vendor.keyring == "/k.gpg"


def test_picks_the_archive_serving_the_release_suite(etc: Path) -> None:
    source = dlc_standin.debian_archive(dlc_standin.apt_sources(etc), "trixie")
    assert source.uri == "http://archive.example/debian"
    assert source.keyring == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_no_archive_for_the_suite_is_one_clear_error(etc: Path) -> None:
    with pytest.raises(SystemExit, match="no apt source serves suite 'bookworm'"):
        dlc_standin.debian_archive(dlc_standin.apt_sources(etc), "bookworm")


def test_host_codename_comes_from_os_release(tmp_path: Path) -> None:
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nVERSION_CODENAME=bookworm\n')
    assert dlc_standin.host_codename(release) == "bookworm"
    release.write_text('NAME="Something"\n')
    with pytest.raises(SystemExit, match="VERSION_CODENAME"):
        dlc_standin.host_codename(release)


@pytest.mark.parametrize(
    ("changelog", "commit"),
    [
        ("## [0.3.36]\n- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n- fix: x\n"
         "## [0.3.35]\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n", "0c1e57098"),
        ("## [0.1.0]\n- initial\n", "unknown"),
    ],
)  # fmt: skip
def test_vendored_commit_is_the_newest_changelog_entry(changelog: str, commit: str) -> None:
    assert dlc_standin.vendored_commit(changelog) == commit
