"""Golden answers: the exact numbers fixed decisions get, per test model and numerics mode.

``tests/golden/requests.json`` holds the decisions (plain-text, object and JSON-transcript states; 2, 3,
5, 26 and 255 options; shared and single; one agent loop whose transcript grows turn by turn) and
``tests/golden/answers.json`` what each test model answered under each numerics mode, with the scoring
version (``semif_adapter.engine.scoring``) it answered under. ``tests/engine/test_golden.py`` fails when a
single bit of an answer differs.

Answers may move only with a new scoring version. The file keeps a ledger of every scoring version it
ever recorded and a digest of the answers recorded under it, so ``make golden`` refuses to record new
answers under a version the ledger already holds with other numbers: a change that moves answers must
change a part of the version (the derived parts usually do; otherwise bump a revision in ``scoring``).

``make golden`` (``python -m scripts.golden``) scores every request, prints which answers moved and by how
much, and rewrites the answers file; it prints a CHANGELOG line to adapt. ``--check`` only compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
REQUESTS = GOLDEN / "requests.json"
ANSWERS = GOLDEN / "answers.json"
MODELS = ("gemma", "qwen")
MODES = ("invariant", "fixed-split")
FORMAT = 1

Answers = dict[str, dict[str, Any]]


def load_requests(path: Path = REQUESTS) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["requests"]
    return requests


def load_answers(path: Path = ANSWERS) -> dict[str, Any]:
    if not path.is_file():
        return {"format": FORMAT, "models": {}, "ledger": {}}
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def calls(requests: Iterable[Mapping[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every engine call in order, named ``request`` (or ``request/turn-<k>`` for an agent's turns)."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for request in requests:
        if "turns" in request:
            out += [(f"{request['name']}/turn-{k}", list(t)) for k, t in enumerate(request["turns"], 1)]
        else:
            out.append((request["name"], list(request["decisions"])))
    return out


def score_all(engine: Any, requests: Sequence[Mapping[str, Any]]) -> Answers:
    """Score every request on ``engine`` in order; answers keyed ``<call>/<decision id>``."""
    answers: Answers = {}
    for name, decisions in calls(requests):
        for result in engine.score(decisions).results:
            answers[f"{name}/{result.id}"] = {
                "probabilities": list(result.probabilities),
                "option_logits": list(result.option_logits),
                "input_tokens": result.input_tokens,
                "allowed_token_mass": result.allowed_token_mass,
                "argmax_token": result.argmax_token,
            }
    return answers


def digest(answers: Answers) -> str:
    """sha256 (16 hex digits) of the answers' canonical JSON: floats as their shortest exact repr."""
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Moved:
    key: str
    max_delta: float  # largest |Δ| of a probability (inf: the answer is new, gone or changed shape)
    tokens: tuple[int, int] | None = None  # input_tokens before and after, where they differ


def moved(recorded: Answers, computed: Answers) -> list[Moved]:
    """Every answer that differs in any bit (probabilities, logits, tokens, mass or argmax)."""
    out: list[Moved] = []
    for key in sorted(set(recorded) | set(computed)):
        old, new = recorded.get(key), computed.get(key)
        if old == new:
            continue
        if old is None or new is None or len(old["probabilities"]) != len(new["probabilities"]):
            out.append(Moved(key, math.inf))
            continue
        delta = max(abs(a - b) for a, b in zip(old["probabilities"], new["probabilities"], strict=True))
        tokens = (
            None if old["input_tokens"] == new["input_tokens"] else (old["input_tokens"], new["input_tokens"])
        )
        out.append(Moved(key, delta, tokens))
    return out


def check(doc: Mapping[str, Any], model: str, mode: str, version: str, computed: Answers) -> list[str]:
    """What is wrong with ``computed`` (under scoring ``version``) against the golden file: [] if nothing."""
    entry = doc.get("models", {}).get(model, {}).get(mode)
    if entry is None:
        return [f"no golden answers for {model}/{mode}: run make golden"]
    problems = ledger_problems(doc)
    if entry["scoring"]["version"] != version:
        problems.append(
            f"{model}/{mode}: scoring version {version}, the golden answers were recorded under "
            f"{entry['scoring']['version']}: run make golden and add a CHANGELOG entry"
        )
    for m in moved(entry["answers"], computed):
        what = "new or gone" if math.isinf(m.max_delta) else f"max |Δp| {m.max_delta:.3g}"
        problems.append(
            f"{model}/{mode}: {m.key} moved ({what}{'' if m.tokens is None else f', tokens {m.tokens}'})"
        )
    return problems


def ledger_problems(doc: Mapping[str, Any]) -> list[str]:
    """Each recorded entry must be in the ledger under its version with its answers' digest."""
    ledger = doc.get("ledger", {})
    problems = []
    for model, modes in doc.get("models", {}).items():
        for mode, entry in modes.items():
            version = entry["scoring"]["version"]
            if ledger.get(version) != digest(entry["answers"]):
                problems.append(
                    f"{model}/{mode}: the answers recorded under {version} are not the ones its ledger entry "
                    "holds: answers may move only with a new scoring version"
                )
    return problems


def record(doc: dict[str, Any], model: str, mode: str, scoring: Mapping[str, str], computed: Answers) -> None:
    """Put ``computed`` into ``doc``; refuses answers that differ from the ledger's under one version."""
    version = scoring["version"]
    before = doc.get("models", {}).get(model, {}).get(mode)
    if before is not None:
        old_prompt, new_prompt = before["scoring"]["prompt"], scoring["prompt"]
        if old_prompt != new_prompt and old_prompt.rsplit(".", 1)[0] == new_prompt.rsplit(".", 1)[0]:
            raise SystemExit(
                f"{model}/{mode}: the prompt text changed ({old_prompt} → {new_prompt}) under the same "
                "PROMPT_VERSION: bump it in semif_adapter/engine/prompt.py"
            )
    known = doc.setdefault("ledger", {}).get(version)
    if known is not None and known != digest(computed):
        raise SystemExit(
            f"{model}/{mode}: these answers differ from those recorded under {version} before; a change that "
            "moves answers must change the scoring version (a derived part, or a revision in "
            "semif_adapter/engine/scoring.py)"
        )
    doc["ledger"][version] = digest(computed)
    doc.setdefault("models", {}).setdefault(model, {})[mode] = {"scoring": dict(scoring), "answers": computed}


def load_engine(model: str, mode: str) -> Any:
    from semif_adapter.engine.decision_engine import DecisionEngine
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import EngineSettings

    return DecisionEngine.load(EngineSettings(gguf_path=ensure_model(model), numerics=mode))


def write_answers(doc: Mapping[str, Any], path: Path = ANSWERS) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate (or --check) the golden answers.")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if anything moved")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = parser.parse_args(argv)
    doc = load_answers()
    requests = load_requests()
    problems: list[str] = []
    summary: list[str] = []
    for model in args.models:
        for mode in args.modes:
            engine = load_engine(model, mode)
            try:
                scoring = engine.model_info.scoring.model_dump()
                computed = score_all(engine, requests)
            finally:
                engine.close()
            entry = doc.get("models", {}).get(model, {}).get(mode)
            before = entry["answers"] if entry else {}
            changes = moved(before, computed)
            worst = max((m.max_delta for m in changes), default=0.0)
            line = f"{model}/{mode} ({scoring['version']}): {len(changes)} of {len(computed)} answers moved"
            if entry is None:
                line = f"{model}/{mode} ({scoring['version']}): {len(computed)} answers, the first record"
            elif changes:
                line += f", max |Δp| {worst:.3g}"
                if entry and entry["scoring"]["version"] != scoring["version"]:
                    parts = [k for k in scoring if k != "version" and scoring[k] != entry["scoring"].get(k)]
                    line += f"; parts changed: {', '.join(parts) or 'none'}"
            print(line)
            for m in changes if entry else []:
                what = "new or gone" if math.isinf(m.max_delta) else f"|Δp| {m.max_delta:.3g}"
                print(
                    f"  {m.key}: {what}"
                    + ("" if m.tokens is None else f", input_tokens {m.tokens[0]} → {m.tokens[1]}")
                )
            if args.check:
                problems += check(doc, model, mode, scoring["version"], computed)
            elif changes or entry is None or entry["scoring"] != scoring:
                record(doc, model, mode, scoring, computed)
                summary.append(
                    f"{model} {mode} {scoring['version']}" + (f" (max |Δp| {worst:.3g})" if entry else "")
                )
    if args.check:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    write_answers(doc)
    if summary:
        print("\nCHANGELOG.md (say what moved and why):\n- answers moved: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
