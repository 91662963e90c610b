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
    `make serve` runs it, in invariant numerics where the probe proves them, on the reference (portable
    AVX2) kernels; the documents say that other kernels move the last digits."""
    from scripts import golden

    (request,) = [r for r in golden.load_requests() if r["name"] == name]
    entry = golden.reference_entry(golden.load_answers(), "qwen", "invariant")
    assert entry is not None, "no reference answers: run make golden"
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


# --- every path and module a reader is pointed to exists ------------------------------------------------
CODE_ROOTS = ("semif_adapter", "semif_ops", "semif_client", "scripts", "tests", ".ci")
PATH = re.compile(
    r"(?<![\w./-])((?:semif_adapter|semif_ops|semif_client|scripts|tests|benchmarks|\.ci)/[\w./-]*\w)"
)
DOTTED = re.compile(r"(?<![\w.])((?:semif_adapter|semif_ops|semif_client|scripts)(?:\.\w+)+)")


def _reading() -> dict[str, str]:
    """The docs, and every docstring and comment of the code: what a reader follows to a file."""
    import ast

    texts = {str(p.relative_to(ROOT)): p.read_text() for p in [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md")]}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in ROOT.glob("benchmarks/**/*.md")})
    for root in (*CODE_ROOTS[:4], "benchmarks"):
        for path in ROOT.glob(f"{root}/**/*.py"):
            source = path.read_text()
            nodes = ast.walk(ast.parse(source))
            docs = [
                ast.get_docstring(n) or ""
                for n in nodes
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            comments = [line for line in source.splitlines() if line.lstrip().startswith("#")]
            texts[str(path.relative_to(ROOT))] = "\n".join(docs + comments)
    return texts


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    path, i = ROOT / parts[0], 1
    while i < len(parts) and ((path / parts[i]).is_dir() or (path / f"{parts[i]}.py").is_file()):
        path = path / parts[i] if (path / parts[i]).is_dir() else path / f"{parts[i]}.py"
        i += 1
    if i == len(parts):
        return True
    module = path / "__init__.py" if path.is_dir() else path
    name = re.escape(parts[i])
    pattern = rf"^(?:async def|def|class) {name}\b|^{name}\b|^\s*{name}\s*[:=]|import [^\n]*\b{name}\b"
    return module.is_file() and re.search(pattern, module.read_text(), re.M) is not None


def test_every_code_path_and_module_named_in_docs_and_docstrings_exists() -> None:
    missing = []
    for where, text in _reading().items():
        for named in PATH.findall(text):
            named = named.rstrip(".")
            is_code = named.startswith(CODE_ROOTS) or named.endswith((".py", ".sh"))
            if is_code and "*" not in named and not (ROOT / named).exists():
                missing.append(f"{where}: {named}")
        missing += [f"{where}: {name}" for name in set(DOTTED.findall(text)) if not _resolves(name)]
    assert not missing, "named but not there:\n" + "\n".join(sorted(missing))


def test_the_path_check_notices_a_module_that_is_gone() -> None:
    assert _resolves("semif_adapter.engine.scoring.ScoringParts")
    assert not _resolves("semif_adapter.engine.gone")
    assert not _resolves("semif_adapter.engine.scoring.NoSuchThing")
    assert PATH.findall("see ``scripts/batch_transform.py``.") == ["scripts/batch_transform.py"]


def test_contributing_names_every_module_of_the_server() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    layout = re.search(r"```\n(semif_adapter/.*?)```", text, re.S)
    assert layout is not None, "CONTRIBUTING.md lost its layout block"
    modules = [p for p in ROOT.glob("semif_adapter/**/*.py") if p.name != "__init__.py"]
    unnamed = [
        str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{re.escape(p.name)}", layout.group(1))
    ]
    assert not unnamed, f"name these modules in CONTRIBUTING.md's layout: {unnamed}"
