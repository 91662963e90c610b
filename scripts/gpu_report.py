"""The GPU check's report: ``report.json`` and a short ``report.md`` from what scripts/gpu_check.sh left.

Reads the fact files in ``--work`` (machine, build, check, model), ``determinism.xml`` (pytest's JUnit XML)
and ``timings.json`` in ``--out``. On a GPU it also writes ``gpu-<name>.md``, the file to commit as
``benchmarks/results/gpu-<name>.md``. Figures are printed as measured; nothing is filled in.
"""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# The reference SemIf sample: Qwen3.5-4B Q4_K_M on an NVIDIA L40S, 231 sequential tasks.
REFERENCE = {"gpu": "NVIDIA L40S", "p50_s": 0.352, "p95_s": 0.599}
# Which engine test proves which invariance (tests/engine/...).
INVARIANCES = {
    "single = shared": ["test_single_equals_shared"],
    "order / count of other decisions": ["test_order_and_count_of_other_decisions_do_not_matter"],
    "cache off = on": [
        "test_repeatable_with_and_without_prefix_reuse",
        "test_agent_loop_answers_do_not_depend_on_the_cache",
        "test_cache_off_reuses_only_the_kept_prefix",
        "test_a_diverging_state_reuses_only_the_shared_blocks",
        "test_a_new_state_reuses_the_head_and_answers_like_no_cache",
        "test_a_grown_state_reuses_the_last_saved_state_whole",
        "test_event_states_answer_alike_cold_warm_and_interleaved",
        "test_a_string_state_with_the_same_text_is_cut_alike",
    ],
    "exact after abort": [
        "test_abort_mid_prefill_drops_the_half_written_prefix",
        "test_abort_mid_suffix",
        "test_abort_between_decisions_keeps_the_prefix_reused_answers_identical",
        "test_a_cancelled_token_stops_before_any_decode",
    ],
    "abort callback stops a decode mid-graph": [
        "test_llama_abort_callback_stops_a_decode_between_graph_nodes"
    ],
    "readout = raw decode": ["test_readout_matches_raw_decode"],
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def test_outcomes(xml_path: Path) -> list[dict[str, str]]:
    """Every test case in pytest's JUnit XML: name, model (the parameter) and outcome with its message."""
    if not xml_path.is_file():
        return []
    rows = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        match = re.match(r"(?P<name>[^\[]+)(?:\[(?P<param>[^\]]+)\])?", case.get("name", ""))
        name, param = (match["name"], match["param"] or "") if match else (case.get("name", ""), "")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip().splitlines()[0][:300]
                break
        rows.append({"test": name, "model": param.split("-")[0], "outcome": outcome, "message": message})
    return rows


def invariance_table(outcomes: list[dict[str, str]]) -> list[dict[str, Any]]:
    models = sorted({o["model"] for o in outcomes if o["model"]})
    table = []
    for label, tests in INVARIANCES.items():
        row: dict[str, Any] = {"invariance": label}
        for model in models:
            cases = [o for o in outcomes if o["test"] in tests and o["model"] == model]
            failed = [o for o in cases if o["outcome"] != "passed"]
            row[model] = "—" if not cases else ("holds" if not failed else f"DIFFERS: {failed[0]['message']}")
        table.append(row)
    return table


def probe_verdicts(path: Path) -> list[dict[str, str]]:
    """The numerics mode the probe chose per model in the check phase, and why: test_numerics prints one
    line per model, ``<architecture>: <mode> (<reason>)``, and scripts/gpu_check.sh keeps them in
    numerics.txt."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        match = re.match(r"(?P<arch>[a-z0-9_]+): (?P<mode>[a-z-]+) \((?P<reason>.*)\)$", line.strip())
        if match:
            rows.append({"architecture": match["arch"], "mode": match["mode"], "reason": match["reason"]})
    return rows


def _import_order(facts: dict[str, Any], what: str) -> list[str]:
    """Whether the engine loaded as the server loads it (llama_cpp through semif-adapter's loader), and
    whether ``what`` then ran with llama_cpp imported first instead (scripts/gpu_check.sh says why)."""
    if "server_order_exit" not in facts:
        return []
    code = facts["server_order_exit"]
    loaded = "loaded" if code < 128 else f"DIED (exit {code}, signal {code - 128})"
    first = facts.get("llama_cpp_first") in (True, "true")
    orders = facts.get("import_orders") or {}
    tried = ", ".join(f"{name} exit {rc}" for name, rc in orders.items())
    return [
        f"Engine load in the server's import order: {loaded}. "
        + (f"{what} ran with llama_cpp imported first." if first else f"{what} ran in that order.")
        + (f" Other import orders tried: {tried}." if tried else ""),
        "",
    ]


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    m, b, c = report.get("machine") or {}, report.get("build") or {}, report.get("check") or {}
    t, model = report.get("timings") or {}, report.get("model") or {}
    lines = [
        f"# GPU check: {m.get('gpu', '?')} ({m.get('mode', '?')})",
        "",
        f"Commit {m.get('commit')} (bundle from {str(m.get('bundle_commit'))[:12]}), {m.get('cores')} cores, "
        f"Python {m.get('python')}, driver {m.get('driver') or '—'}, "
        f"compute capability {m.get('compute_cap') or '—'}.",
        f"Build (libllama + llama-quantize, {b.get('jobs')} jobs): {_fmt(b.get('seconds'))} s, "
        f"{b.get('steps')} ninja steps.",
        "",
        f"## Determinism with every layer offloaded (n_gpu_layers {c.get('n_gpu_layers')}; pytest exit "
        f"{c.get('exit_code')})",
        "",
    ]
    lines += _import_order(c, "The engine tests")
    table = report.get("invariances") or []
    models = [k for k in (table[0] if table else {}) if k != "invariance"]
    lines += ["| invariance | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    lines += ["| " + " | ".join([row["invariance"], *(row[k] for k in models)]) + " |" for row in table]
    failed = [o for o in report.get("tests") or [] if o["outcome"] != "passed"]
    verdicts = report.get("numerics") or []
    lines += ["", "Numerics the probe chose at load (`SEMIF_NUMERICS=auto`), per model, and why:", ""]
    lines += [f"- {v['architecture']}: **{v['mode']}** ({v['reason']})" for v in verdicts] or [
        "- none recorded (test_numerics did not run or printed no verdict)"
    ]
    lines += ["", f"{len(report.get('tests') or [])} test cases, {len(failed)} not passed."]
    for o in failed:
        lines.append(f"- {o['test']}[{o['model']}]: {o['outcome']}: {o['message']}")
    if t:
        cold, eng = t.get("cold_decisions") or {}, t.get("engine") or {}
        lines += [
            "",
            f"## Timings: {t.get('model', {}).get('file')} ({_fmt((model.get('bytes') or 0) / 1e9, 2)} GB; "
            f"generated {model.get('generate_s')} s, quantized {model.get('quantize_s')} s)",
            "",
            f"Engine: n_gpu_layers {eng.get('n_gpu_layers')}, offload {eng.get('gpu_offload')}, n_batch "
            f"{eng.get('n_batch')}, prefix blocks {eng.get('block_tokens')}, fork {eng.get('fork_mode')}, "
            f"numerics {eng.get('numerics')} ({eng.get('numerics_reason')}); "
            f"load {_fmt(t.get('load_s'), 1)} s.",
            "",
            *_import_order(report.get("bench") or {}, "The timings"),
            "| cold decisions (devset-shaped) | n | p50 s | p95 s | mean s | tokens p50 |",
            "|---|---|---|---|---|---|",
            f"| this run | {cold.get('n')} | {_fmt(cold.get('p50_s'))} | {_fmt(cold.get('p95_s'))} | "
            f"{_fmt(cold.get('mean_s'))} | {(cold.get('input_tokens') or {}).get('p50')} |",
            f"| reference SemIf sample, {REFERENCE['gpu']} (another GPU and model files) | 231 | "
            f"{REFERENCE['p50_s']} | {REFERENCE['p95_s']} | — | — |",
        ]
        share, loop = t.get("sharing") or {}, t.get("agent_loop") or {}
        if share:
            lines += [
                "",
                f"Sharing: {share.get('decisions')} decisions over a "
                f"{share.get('prefix_tokens')}-token state: "
                f"{_fmt(share.get('separate_s'))} s as separate cold calls, {_fmt(share.get('shared_s'))} s "
                f"shared ({_fmt(share.get('speedup'), 2)}×).",
            ]
        if loop:
            lines.append(
                f"Agent loop (~{loop.get('start_tokens')} tokens, +{loop.get('growth_tokens')} a turn): "
                "warm turn "
                f"{_fmt(loop.get('warm_turn_s'))} s, cold {_fmt(loop.get('cold_turn_s'))} s "
                f"({_fmt(loop.get('speedup'), 2)}×, "
                f"{_fmt(100 * (loop.get('reused_share') or 0), 0)}% reused)."
            )
        prefill, engine_rate = t.get("raw_prefill") or [], t.get("engine_prefill") or {}
        if prefill:
            raw = ", ".join(
                f"{_fmt(r['tokens_per_s'], 0)} tokens/s in {r['chunk']}-token chunks" for r in prefill
            )
            lines.append(
                f"Prefill: raw llama_decode {raw}; the engine's cold decision "
                f"{_fmt(engine_rate.get('tokens_per_s'), 0)} tokens/s "
                f"over {engine_rate.get('tokens')} tokens."
            )
        io = t.get("state_io") or []
        if io:
            lines += [
                "",
                "| state save/restore: prefix tokens | MB | save ms | restore ms |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {r['prefix_tokens']} | {_fmt(r['bytes'] / 1e6, 1)} | {_fmt(r['save_ms'], 2)} | "
                f"{_fmt(r['restore_ms'], 2)} |"
                for r in io
            ]
        dl = t.get("deadline") or []
        if dl:
            lines += [
                "",
                f"Deadline and disconnect (a timer cancels a {_fmt(dl[0].get('full_request_s'))} s request):",
                "",
                "| reason | cancelled at s | stopped at s | overshoot s | longest chunk s | tokens done |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['reason']} | {_fmt(r['cancel_after_s'])} | {_fmt(r['stopped_after_s'])} | "
                f"{_fmt(r['overshoot_s']) if r['error'] else 'finished first'} | {_fmt(r['max_chunk_s'])} | "
                f"{r['tokens_done']} of {r['tokens_needed']} |"
                for r in dl[1:]
            ]
    else:
        lines += ["", "No timings (the bench phase did not run or stopped before its first step)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tests = test_outcomes(args.out / "determinism.xml")
    names = ("machine", "build", "check", "model", "bench")
    report = {name: _load(args.work / f"{name}.json") for name in names}
    report["timings"] = _load(args.out / "timings.json")
    report["tests"] = tests
    report["invariances"] = invariance_table(tests)
    report["numerics"] = probe_verdicts(args.out / "numerics.txt")
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (args.out / "report.md").write_text(text)
    machine = report.get("machine") or {}
    if machine.get("mode") == "cuda" and machine.get("gpu"):
        slug = re.sub(r"[^a-z0-9]+", "-", machine["gpu"].lower()).strip("-")
        (args.out / f"gpu-{slug}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
