"""``semif-ops``: every operation reachable and documented, and an operator's mistake ending in one line
that says what to pass instead, never a traceback."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from semif_ops import cli
from semif_ops.errors import OperationFailed, UsageError
from tests.helpers.deploy import REPO_ROOT

SEMIF_OPS = Path(sys.executable).parent / "semif-ops"
OPERATIONS = [(group, name) for group, ops in cli.GROUPS.items() for name in ops]
STOCK = [(group, name) for group, ops in cli.GROUPS.items() for name, op in ops.items() if op.stock]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SEMIF_OPS), *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def test_help_lists_every_operation_and_every_operation_module_is_reachable() -> None:
    done = run("--help")
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^  (\w+) (\w+) ", done.stdout, re.M)
    assert listed == OPERATIONS
    assert {"model", "image", "endpoint"} == set(cli.GROUPS)
    reachable = {op.module for ops in cli.GROUPS.values() for op in ops.values()}
    reachable |= {op.stock for ops in cli.GROUPS.values() for op in ops.values() if op.stock}
    with_main = {
        f"semif_ops.{path.parent.name}.{path.stem}"
        for path in (REPO_ROOT / "semif_ops").glob("*/*.py")
        if re.search(r"^def main\(", path.read_text(), re.M)
    }
    assert with_main == reachable  # no operation module the CLI forgot, none it names that is missing


@pytest.mark.parametrize(
    "argv", [[g, o] for g, o in OPERATIONS] + [[g, o, "--stock"] for g, o in STOCK], ids=" ".join
)
def test_every_operation_answers_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*argv, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: semif-ops {' '.join(argv)} ")


@pytest.mark.parametrize("script", ["gpu_bundle.py", "gpu_report.py"])
def test_the_scripts_left_in_scripts_answer_help(script: str) -> None:
    done = subprocess.run([sys.executable, f"scripts/{script}", "--help"], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["deploy"], "unknown group 'deploy'; pass one of: model, image, endpoint"),
        (["endpoint", "delete"], "pass one of: deploy, invoke, scale, cleanup, batch"),
        (["endpoint", "scale", "--stock"], "--stock applies only to endpoint deploy and endpoint invoke"),
    ],
)
def test_a_wrong_command_says_what_to_pass(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert fragment in line


def sdist_tree(root: Path) -> Path:
    """The layout of a llama-cpp-python sdist: the binding on top, llama.cpp in vendor/llama.cpp."""
    top = root / "llama_cpp_python-9.9.9"
    for header in ("vendor/llama.cpp/include/llama.h", "vendor/llama.cpp/ggml/include/ggml.h"):
        (top / header).parent.mkdir(parents=True, exist_ok=True)
        (top / header).write_text("/* header */\n")
    (top / "llama_cpp").mkdir()
    return top


def test_an_sdist_as_llama_source_ends_in_one_line_naming_its_vendored_tree(tmp_path: Path) -> None:
    top = sdist_tree(tmp_path / "src")
    archive = tmp_path / "llama_cpp_python-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    for source, hint in (
        (archive, "pass <unpacked llama_cpp_python-9.9.9.tar.gz>/vendor/llama.cpp instead"),
        (top, f"pass {top / 'vendor' / 'llama.cpp'} instead"),
    ):
        done = run("image", "context", "--llama-source", str(source), "--out", str(tmp_path / "ctx"))
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: llama.cpp headers: ") and "is a llama-cpp-python sdist" in line
        assert hint in line
        assert not (tmp_path / "ctx" / "wheelhouse").exists()  # refused before any download


def test_the_vendored_tree_itself_is_accepted(tmp_path: Path) -> None:
    from semif_ops.image import abi

    headers = abi.resolve_headers(sdist_tree(tmp_path) / "vendor" / "llama.cpp", tmp_path / "scratch")
    assert headers.llama_h.name == "llama.h"


def _raising(exc: BaseException) -> object:
    def main(argv: list[str], prog: str | None = None) -> int:
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "line", "code"),
    [
        (UsageError("--max is required"), "error: --max is required", 2),
        (OperationFailed("endpoint x is Failed: no capacity"), "error: endpoint x is Failed: no capacity", 1),
        (NoCredentialsError(), "error: Unable to locate credentials (set AWS credentials and a region", 1),
        (
            ClientError({"Error": {"Code": "ExpiredTokenException", "Message": "expired"}}, "ListModels"),
            "error: ExpiredTokenException: expired",
            1,
        ),
        (subprocess.CalledProcessError(2, ["pip", "download"]), "error: `pip download` failed with exit", 1),
        (FileNotFoundError(2, "No such file or directory", "x.gguf"), "error: No such file or directory", 1),
        (TimeoutError("endpoint x not InService in 60 s"), "error: endpoint x not InService in 60 s", 1),
    ],
)
def test_known_errors_end_in_one_line(
    exc: Exception, line: str, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's own input exits 2 (as argparse's usage errors do); a refusal or failure exits 1."""
    monkeypatch.setattr(importlib.import_module("semif_ops.endpoint.cleanup"), "main", _raising(exc))
    assert cli.main(["endpoint", "cleanup", "--endpoint", "x"]) == code
    (printed,) = capsys.readouterr().err.splitlines()
    assert printed.startswith(line)


@pytest.mark.parametrize(
    ("exc", "code"), [(UsageError("--max is required"), 2), (OperationFailed("job is Failed"), 1)]
)
def test_an_operation_run_directly_renders_its_errors_the_same_way(
    exc: Exception, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from semif_ops.exits import command

    @command
    def main(argv: list[str]) -> int:
        raise exc

    assert main([]) == code
    assert capsys.readouterr().err == f"error: {exc}\n"


def test_no_operation_renders_its_own_errors() -> None:
    """One exit convention: operations raise; only semif_ops.exits prints ``error:`` lines. Not counted:
    the Dockerfile check's report (one line per finding, like a linter) and the ABI tool, which the image
    build runs alone, without the rest of semif_ops."""
    root = Path(__file__).resolve().parents[2] / "semif_ops"
    own = {"exits.py", "image/check.py", "image/abi.py"}
    printing = [
        where
        for path in root.rglob("*.py")
        if (where := str(path.relative_to(root))) not in own
        and any(mark in path.read_text() for mark in ('"error: ', "def fail(", 'SystemExit(f"error'))
    ]
    assert not printing, printing
