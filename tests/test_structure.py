"""The shape of the code a maintainer reads: small functions, an engine facade of its size."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60
MAX_ENGINE_LINES = 300


def _definitions() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted((ROOT / "semif_adapter").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return found


def _length(node: ast.AST) -> int:
    return int(node.end_lineno or 0) - int(getattr(node, "lineno", 0)) + 1


def test_no_function_of_the_server_is_longer_than_a_screen() -> None:
    long = [
        f"{where} ({_length(node)} lines)"
        for where, node in _definitions()
        if not isinstance(node, ast.ClassDef) and _length(node) > MAX_FUNCTION_LINES
    ]
    assert not long, f"split these (over {MAX_FUNCTION_LINES} lines): {long}"


def test_the_engine_facade_stays_small() -> None:
    (engine,) = [node for where, node in _definitions() if where.endswith(" DecisionEngine")]
    assert _length(engine) <= MAX_ENGINE_LINES, (
        "move work into the engine's rooms (planner, prefill, branches)"
    )


def test_the_length_check_measures_lines() -> None:
    (node,) = ast.parse("def f():\n    a = 1\n    return a\n").body
    assert _length(node) == 3
