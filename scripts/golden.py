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

Answers differ between CPU kernel sets (AVX2 and AVX-512 round differently), so they are recorded per
kernel set, keyed by the scoring version's ``llama_cpp`` part (commit, device, variant, feature hash):

- the **reference** kernels: llama.cpp built the way the DLC builds it, with its portable ``x64`` and
  AVX2 (``haswell``) CPU plugins (the stand-in base's libraries, ``tests/image/dlc_standin.py``), loaded in
  a subprocess through ``LLAMA_CPP_LIB_PATH``. Any x86-64 machine with AVX2 runs them, so every bit of
  these answers is checked everywhere; they are what the stand-in image answers on such a machine;
- the **loaded** kernels: whatever the local wheel runs (``LLAMA_KERNELS=native`` by default: AVX-512
  here). Where they are recorded, every bit is checked; on kernels nobody recorded yet (another CPU's
  native build) each answer must be within :data:`TOLERANCE` of the reference answer (token counts
  exact), and ``make golden`` on that machine records them exactly.

Four modes: ``invariant`` and ``fixed-split`` with the engine's default settings otherwise,
``invariant-flash`` (``SEMIF_FLASH_ATTENTION=true``: pieces padded to flash attention's tiled rows) and
``invariant-tiled`` (``SEMIF_KV_LAYOUT=tiled``: one unified KV stream with flash attention, each
decision's cells from a tile line). In
the fixed split llama.cpp's extra weight buffers follow ``SEMIF_CPU_EXTRA_BUFFERS=auto``: repacked
wherever the loaded kernels have no AMX (the reference kernels everywhere), plain where they do.
Repacking moves fixed-split answers, so the scoring version names the choice (``xb-on``/``xb-off``), and
under ``auto`` the choice follows from the kernels the key names.

``make golden`` (``python -m scripts.golden``) scores every request on both, prints which answers moved
and by how much, and rewrites the answers file; it prints a CHANGELOG line to adapt. ``--check`` only
compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
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
MODES = ("invariant", "fixed-split", "invariant-flash", "invariant-tiled")
#: The engine settings of each mode: ``invariant-flash`` is invariant numerics with flash attention on
#: (every piece padded to its tiled kernel's rows), ``invariant-tiled`` the tiled KV layout; each a
#: configuration of its own scoring version.
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "invariant": {"numerics": "invariant"},
    "fixed-split": {"numerics": "fixed-split"},
    "invariant-flash": {"numerics": "invariant", "flash_attention": True},
    "invariant-tiled": {"numerics": "invariant", "kv_layout": "tiled"},
}
KERNELS = ("loaded", "reference")
FORMAT = 2
#: Largest |Δp| allowed against the reference answers on kernels with no record of their own: a sanity
#: bound, not a proof (the reference and any recorded kernels are checked bit for bit). AVX-512 (native,
#: AMD EPYC) against AVX2 on llama.cpp 0c1e570 moved answers by up to 0.067 (gemma-3-270m, fixed split)
#: and 0.021 (Qwen2.5-Coder-0.5B), and flipped 2 of Qwen's 16 argmaxes; this leaves 1.5x headroom.
TOLERANCE = 0.1

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


def kernels_key(scoring: Mapping[str, str]) -> str:
    """Answers are recorded per kernel set: the scoring version's ``llama_cpp`` part."""
    return scoring["llama_cpp"]


def _same_commit(a: str, b: str) -> bool:
    """Whether two kernels keys name one llama.cpp commit (hashes of any length, ``-dirty`` or not)."""
    first, second = (key.split(".", 1)[0].removesuffix("-dirty") for key in (a, b))
    return first.startswith(second) or second.startswith(first)


def entries(doc: Mapping[str, Any], model: str, mode: str) -> dict[str, Any]:
    """``{kernels key: {"scoring", "answers"}}`` recorded for ``model``/``mode``."""
    found: dict[str, Any] = doc.get("models", {}).get(model, {}).get(mode, {})
    return found


def reference_entry(doc: Mapping[str, Any], model: str, mode: str) -> Mapping[str, Any] | None:
    found: Mapping[str, Any] | None = entries(doc, model, mode).get(doc.get("reference", ""))
    return found


def check(
    doc: Mapping[str, Any], model: str, mode: str, scoring: Mapping[str, str], computed: Answers
) -> list[str]:
    """What is wrong with ``computed`` (scored under ``scoring``) against the golden file: [] if nothing.

    Recorded kernels: every bit. Kernels with no record: within :data:`TOLERANCE` of the reference."""
    problems = ledger_problems(doc)
    where = f"{model}/{mode} [{kernels_key(scoring)}]"
    entry = entries(doc, model, mode).get(kernels_key(scoring))
    if entry is None:
        reference = reference_entry(doc, model, mode)
        if reference is None:
            return [*problems, f"no golden answers for {model}/{mode}: run make golden"]
        for m in moved(reference["answers"], computed):
            if math.isinf(m.max_delta) or m.max_delta > TOLERANCE or m.tokens is not None:
                problems.append(
                    f"{where}: {m.key} is {_what(m)} away from the reference kernels' answer (no record "
                    f"of these kernels; tolerance {TOLERANCE})"
                )
        return problems
    version = scoring["version"]
    if entry["scoring"]["version"] != version:
        problems.append(
            f"{where}: scoring version {version}, the golden answers were recorded under "
            f"{entry['scoring']['version']}: run make golden and add a CHANGELOG entry"
        )
    for m in moved(entry["answers"], computed):
        problems.append(f"{where}: {m.key} moved ({_what(m)})")
    return problems


def basis(doc: Mapping[str, Any], model: str, mode: str, scoring: Mapping[str, str]) -> str:
    """``exact`` where these kernels are recorded, ``tolerance`` where only the reference is."""
    return "exact" if kernels_key(scoring) in entries(doc, model, mode) else "tolerance"


def _what(m: Moved) -> str:
    what = "new or gone" if math.isinf(m.max_delta) else f"max |Δp| {m.max_delta:.3g}"
    return what + ("" if m.tokens is None else f", tokens {m.tokens}")


def ledger_problems(doc: Mapping[str, Any]) -> list[str]:
    """Each recorded entry must be in the ledger under its version with its answers' digest."""
    ledger = doc.get("ledger", {})
    problems = []
    for model, modes in doc.get("models", {}).items():
        for mode, by_kernels in modes.items():
            for key, entry in by_kernels.items():
                version = entry["scoring"]["version"]
                if ledger.get(version) != digest(entry["answers"]):
                    problems.append(
                        f"{model}/{mode} [{key}]: the answers recorded under {version} are not the ones its "
                        "ledger entry holds: answers may move only with a new scoring version"
                    )
    return problems


def record(doc: dict[str, Any], model: str, mode: str, scoring: Mapping[str, str], computed: Answers) -> None:
    """Put ``computed`` into ``doc`` under its kernels; refuses answers that differ from the ledger's under
    one version. Entries of another llama.cpp commit go (no binding of this commit loads them)."""
    version, key = scoring["version"], kernels_key(scoring)
    recorded = entries(doc, model, mode)
    for before in recorded.values():
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
    kept = {k: e for k, e in recorded.items() if _same_commit(k, key)}
    kept[key] = {"scoring": dict(scoring), "answers": computed}
    doc.setdefault("models", {}).setdefault(model, {})[mode] = kept


def load_engine(model: str, mode: str) -> Any:
    from semif_adapter.engine.decision_engine import DecisionEngine
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import EngineSettings

    return DecisionEngine.load(EngineSettings(gguf_path=ensure_model(model), **MODE_SETTINGS[mode]))


def write_answers(doc: Mapping[str, Any], path: Path = ANSWERS) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


Computed = dict[tuple[str, str], tuple[dict[str, str], Answers]]


def compute(models: Sequence[str], modes: Sequence[str]) -> Computed:
    """Every request scored on the kernels this process loaded: ``(model, mode) -> (scoring, answers)``."""
    out: Computed = {}
    requests = load_requests()
    for model in models:
        for mode in modes:
            engine = load_engine(model, mode)
            try:
                out[model, mode] = (engine.model_info.scoring.model_dump(), score_all(engine, requests))
            finally:
                engine.close()
    return out


def reference_library() -> Path:
    """The reference kernels' libraries (built once, cached): the stand-in base's llama.cpp, built from
    the installed binding's sdist as the DLC builds it, with the portable x64 and AVX2 plugins."""
    from importlib.metadata import version

    from tests.image.dlc_standin import libraries

    return libraries(version("llama-cpp-python"), jobs=os.cpu_count() or 2)


def library_env(lib: Path) -> dict[str, str]:
    """This process's environment for a child that loads the llama.cpp libraries in ``lib`` instead of
    the wheel's (the binding reads ``LLAMA_CPP_LIB_PATH``; the libraries find each other on the path)."""
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), os.environ.get("LD_LIBRARY_PATH")) if p)
    return env


def compute_reference(models: Sequence[str], modes: Sequence[str]) -> Computed:
    """:func:`compute` in a subprocess that loads the reference libraries instead of the wheel's."""
    env = library_env(reference_library())
    cmd = [sys.executable, "-m", "scripts.golden", "--emit", "--models", *models, "--modes", *modes]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"scoring on the reference kernels failed ({done.returncode}):\n{done.stderr[-4000:]}"
        )
    emitted = json.loads(done.stdout)
    return {(e["model"], e["mode"]): (e["scoring"], e["answers"]) for e in emitted}


def _report(
    doc: Mapping[str, Any], model: str, mode: str, scoring: dict[str, str], computed: Answers
) -> float:
    """Print what moved against the record of these kernels; returns the largest |Δp|."""
    entry = entries(doc, model, mode).get(kernels_key(scoring))
    head = f"{model}/{mode} [{kernels_key(scoring)}] ({scoring['version']})"
    if entry is None:
        reference = reference_entry(doc, model, mode)
        against = moved(reference["answers"], computed) if reference else []
        worst = max((m.max_delta for m in against), default=0.0)
        print(
            f"{head}: {len(computed)} answers, the first record of these kernels"
            + (f"; max |Δp| {worst:.3g} from the reference kernels" if reference else "")
        )
        return worst
    changes = moved(entry["answers"], computed)
    worst = max((m.max_delta for m in changes), default=0.0)
    line = f"{head}: {len(changes)} of {len(computed)} answers moved"
    if changes:
        line += f", max |Δp| {worst:.3g}"
        if entry["scoring"]["version"] != scoring["version"]:
            parts = [k for k in scoring if k != "version" and scoring[k] != entry["scoring"].get(k)]
            line += f"; parts changed: {', '.join(parts) or 'none'}"
    print(line)
    for m in changes:
        print(f"  {m.key}: {_what(m)}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate (or --check) the golden answers.")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if anything moved")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)  # compute_reference's child
    args = parser.parse_args(argv)
    if args.emit:
        rows = [
            {"model": model, "mode": mode, "scoring": scoring, "answers": answers}
            for (model, mode), (scoring, answers) in compute(args.models, args.modes).items()
        ]
        print(json.dumps(rows))
        return 0
    doc = load_answers()
    problems: list[str] = []
    summary: list[str] = []
    for kernels in args.kernels:
        computed = (compute if kernels == "loaded" else compute_reference)(args.models, args.modes)
        for (model, mode), (scoring, answers) in computed.items():
            if kernels == "reference" and not args.check:
                doc["reference"] = kernels_key(scoring)
            worst = _report(doc, model, mode, scoring, answers)
            if args.check:
                problems += check(doc, model, mode, scoring, answers)
                continue
            entry = entries(doc, model, mode).get(kernels_key(scoring))
            if entry is None or entry["scoring"] != scoring or moved(entry["answers"], answers):
                record(doc, model, mode, scoring, answers)
                summary.append(
                    f"{model} {mode} {scoring['version']} ({kernels_key(scoring)}, max |Δp| {worst:.3g})"
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
