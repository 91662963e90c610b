"""What may a shared call cost in masked attention? The two sides of ``calls.SHARED_CALL_CELLS``, measured.

Without flash attention llama.cpp gives every stream of a call the longest span among them (the cells up
to the call's furthest end, rounded up to 256), and each row pays for every cell of it, masked or not.
So the planners put runs far apart in their streams into calls of their own when the masked row-cells a
shared call would add cost more than the call it saves (``calls.group_calls`` with ``ends``). The budget
is the ratio of two costs, and this benchmark measures both on the engine's runtime in the served
invariant context (``Settings`` defaults, flash attention off), per model:

* **a row-cell**: one 40-token call whose sequence ends at cell 256, 1,024, 2,048 and 4,096 of its stream
  (each stream holding a transcript that long, decoded once, untimed); the least-squares slope of time
  over rows × span;
* **a saved call**: four 40-token pieces, one per stream, all ending at one span, decoded apart (four
  calls) and together (one call): (apart − together) ÷ 3;

and reports their ratio, the budget this model would get, beside the constant the planners use. Then the
engine itself (``DecisionEngine.score_many``) runs what the rule is for: four requests of two decisions
each on transcripts of very different lengths, sent together cold and then as three warm turns (each
appending a new event to every transcript), with the budget as shipped and lifted (every span shares:
the planner before the rule), alternating; answers must be identical both ways (invariant numerics make
every grouping give the same numbers). Medians of ``--repeats``.

    python -m benchmarks.shared_call_budget [--models qwen gemma] [--hybrid] [--repeats 3] [--json F]

(``make bench`` runs it with ``--hybrid``: the random Qwen3.5-shaped 0.8B-class model of ``make
bench-peer``, built once.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: rows of the timed pieces: an agent turn's size (an event, a decision's suffix)
PIECE = 40
#: the cells the timed row-cell calls end at
SPANS = (256, 1024, 2048, 4096)
#: the span the four pieces of the saved-call timing end at
SHARED_SPAN = 1280
#: transcript events per request of the engine run: from a few hundred to ~2,400 tokens
EVENTS = (12, 40, 70, 100)
#: the events appended to every transcript, one per warm turn
WARM_EVENTS = (
    " Then the customer replied that the refund never arrived and asked for a manager.",
    " The billing tool showed the refund as issued on the third and bounced by the bank.",
    " The manager approved a second refund to the card on file and asked for a confirmation.",
)
QUESTIONS = (
    ("What should the agent do next?", ["retry", "escalate", "wait", "close"]),
    ("Is the ticket resolved?", ["yes", "no"]),
)


def _timed(runtime: Any, calls: list[list[Any]], saved: dict[int, Any]) -> float:
    """Seconds to decode ``calls`` one after another; then every part's stream is put back as it was:
    its new cells dropped, or (``saved``: memory with a recurrent state, which cannot drop a tail) its
    saved state restored."""
    t0 = time.perf_counter()
    for parts in calls:
        runtime.decode_parts(parts)
    seconds = time.perf_counter() - t0
    for parts in calls:
        for part in parts:
            if saved:
                runtime.drop(part.seq)
                runtime.restore_seq(part.seq, saved[part.seq])
            else:
                runtime.drop(part.seq, part.start_pos)
    return seconds


def _prefilled(runtime: Any, transcripts: dict[int, list[int]], recurrent: bool) -> dict[int, Any]:
    """Each stream filled with its transcript but the last ``PIECE`` tokens; their saved states where the
    memory is recurrent (else none)."""
    for seq, tokens in transcripts.items():
        runtime.drop(seq)
        runtime.decode(tokens[:-PIECE], 0, seq, want_logits=False, chunk_size=256)
    return {seq: runtime.save_seq(seq) for seq in transcripts} if recurrent else {}


def raw_costs(gguf: Path, repeats: int, threads: int) -> dict[str, Any]:
    """The per-row-cell cost and the worth of a saved call on the raw runtime."""
    from benchmarks.batching_ceiling import _runtime, transcript
    from semif_adapter.engine.llama_backend import Part

    runtime = _runtime(gguf, threads)
    try:
        streams = list(range(1, runtime.n_seq_max))  # stream 0, the engine's prefix stream, stays empty
        if len(streams) < 4:
            raise SystemExit(f"the served context has {runtime.n_seq_max} streams; this needs 5")
        recurrent = runtime.is_recurrent or runtime.is_hybrid
        # per row-cell: one stream per span, filled up to PIECE before its end
        ids = {seq: transcript(runtime, seq, span) for seq, span in zip(streams, SPANS, strict=True)}
        saved = _prefilled(runtime, ids, recurrent)
        one = {
            span: [Part(ids[seq][-PIECE:], span - PIECE, seq)]
            for seq, span in zip(streams, SPANS, strict=True)
        }
        _timed(runtime, [one[SPANS[0]]], saved)  # warm the threads
        spans: dict[int, list[float]] = {span: [] for span in SPANS}
        for r in range(repeats):
            for span in SPANS if r % 2 == 0 else SPANS[::-1]:
                spans[span].append(_timed(runtime, [one[span]], saved))
        medians = {span: statistics.median(v) for span, v in spans.items()}
        x = np.array([PIECE * span for span in SPANS], dtype=float)
        y = np.array([medians[span] for span in SPANS])
        slope, _ = np.polyfit(x, y, 1)
        # a saved call: the four streams refilled, four pieces ending at SHARED_SPAN
        shared = {seq: transcript(runtime, 10 + seq, SHARED_SPAN) for seq in streams[:4]}
        saved = _prefilled(runtime, shared, recurrent)
        parts = [Part(tokens[-PIECE:], SHARED_SPAN - PIECE, seq) for seq, tokens in shared.items()]
        ways: dict[str, list[float]] = {"apart": [], "together": []}
        _timed(runtime, [parts], saved)
        for r in range(repeats):
            for way in ("apart", "together") if r % 2 == 0 else ("together", "apart"):
                calls = [[p] for p in parts] if way == "apart" else [parts]
                ways[way].append(_timed(runtime, calls, saved))
        apart, together = statistics.median(ways["apart"]), statistics.median(ways["together"])
        saved_call = (apart - together) / (len(parts) - 1)
        library = runtime.cpu_library
    finally:
        runtime.close()
    return {
        "cpu_library": library,
        "one_call_ms_by_span": {str(span): round(1000 * medians[span], 1) for span in SPANS},
        "us_per_row_cell": round(1e6 * float(slope), 4),
        "four_pieces_apart_ms": round(1000 * apart, 1),
        "four_pieces_together_ms": round(1000 * together, 1),
        "ms_per_saved_call": round(1000 * saved_call, 2),
        # a noisy machine can give a slope or a saving of 0 or less: no budget follows from those
        "implied_budget_row_cells": int(saved_call / slope) if slope > 0 and saved_call > 0 else None,
    }


def _requests(extra: str, turn: int) -> list[tuple[list[dict[str, Any]], None]]:
    rng = random.Random(3)
    jobs = []
    for agent, n in enumerate(EVENTS):
        state = " ".join(
            f"Step {i} of agent {agent}: the tool returned {rng.randint(1, 999)} rows in "
            f"{rng.randint(5, 900)} ms."
            for i in range(n)
        )
        decisions = [
            {
                "id": f"a{agent}t{turn}q{q}",
                "state": state + extra,
                "question": question,
                "options": [{"id": o} for o in options],
            }
            for q, (question, options) in enumerate(QUESTIONS)
        ]
        jobs.append((decisions, None))
    return jobs


def engine_turns(gguf: Path, repeats: int, threads: int) -> dict[str, Any]:
    """Four requests on transcripts of very different lengths, cold then ``len(WARM_EVENTS)`` warm turns,
    budget as shipped vs lifted; seconds per way: the cold turn, and the warm turns together."""
    from semif_adapter.engine import DecisionEngine, calls
    from semif_adapter.settings import Settings

    shipped = calls.SHARED_CALL_CELLS
    engine = DecisionEngine.load(Settings(n_threads=threads, verify_manifest=False), gguf)
    try:
        if engine.verdict.mode != "invariant" or engine.runtime.min_rows:
            raise SystemExit(f"{gguf.name}: the rule needs invariant numerics without flash attention")
        turns = [_requests("".join(WARM_EVENTS[:t]), t) for t in range(len(WARM_EVENTS) + 1)]
        budgets = {"budget as shipped": shipped, "every span shares": 10**12}
        times: dict[str, dict[str, list[float]]] = {way: {"cold": [], "warm": []} for way in budgets}
        answers: dict[str, dict[str, list[float]]] = {}
        for r in range(repeats):
            for way in budgets if r % 2 == 0 else list(budgets)[::-1]:
                calls.SHARED_CALL_CELLS = budgets[way]
                engine.reset_prefix_cache()
                got: dict[str, list[float]] = {}
                seconds = []
                for jobs in turns:
                    t0 = time.perf_counter()
                    out = engine.score_many(jobs)
                    seconds.append(time.perf_counter() - t0)
                    for result in out:
                        if isinstance(result, Exception):
                            raise result
                        got.update({x.id: x.probabilities for x in result.results})
                times[way]["cold"].append(seconds[0])
                times[way]["warm"].append(sum(seconds[1:]))
                if answers.setdefault(way, got) != got:
                    raise SystemExit(f"{way}: answers moved between repeats")
        if answers["budget as shipped"] != answers["every span shares"]:
            raise SystemExit("the budget moved an answer")
        lengths = [len(engine.prompt_tokens(jobs)[0]) for jobs, _ in turns[0]]
    finally:
        calls.SHARED_CALL_CELLS = shipped
        engine.close()
    med = {way: {turn: statistics.median(v) for turn, v in d.items()} for way, d in times.items()}
    shipped_s, lifted_s = med["budget as shipped"], med["every span shares"]
    return {
        "prefix_tokens": lengths,
        "warm_turns": len(WARM_EVENTS),
        "seconds": {way: {turn: round(s, 3) for turn, s in d.items()} for way, d in med.items()},
        "shipped_over_lifted": {turn: round(shipped_s[turn] / lifted_s[turn], 3) for turn in shipped_s},
        "answers_identical": True,
    }


def report(
    results: list[dict[str, Any]], args: argparse.Namespace, load: tuple[list[float], list[float]]
) -> str:
    from semif_adapter.engine import calls

    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {args.threads} threads; load average "
        f"{load[0]} before, {load[1]} after; served invariant context, flash attention off; medians of "
        f"{args.repeats} alternations; the planners' budget: {calls.SHARED_CALL_CELLS:,} row-cells",
        "",
        "| model | µs per row-cell | one 40-token call ending at cell 256 / 1,024 / 2,048 / 4,096 ms "
        f"| ms per saved call (4 × {PIECE} tokens at {SHARED_SPAN} cells: apart / together ms) "
        "| implied budget, row-cells |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        raw = r["raw"]
        budget = raw["implied_budget_row_cells"]
        by_span = " / ".join(f"{v:.0f}" for v in raw["one_call_ms_by_span"].values())
        lines.append(
            f"| {r['gguf']} | {raw['us_per_row_cell']:.3f} | {by_span} | {raw['ms_per_saved_call']:.1f} "
            f"({raw['four_pieces_apart_ms']:.0f} / {raw['four_pieces_together_ms']:.0f}) "
            f"| **{'none (noisy run)' if budget is None else f'{budget:,}'}** |"
        )
    lines += [
        "",
        "Four requests × 2 decisions on transcripts of very different lengths, sent together "
        "(engine, one process):",
        "",
        "| model | prefix tokens | cold: budget as shipped / every span shares s | ratio "
        f"| {len(WARM_EVENTS)} warm turns: shipped / lifted s | ratio | answers identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        e = r["engine"]
        s, lifted = e["seconds"]["budget as shipped"], e["seconds"]["every span shares"]
        lines.append(
            f"| {r['gguf']} | {', '.join(map(str, e['prefix_tokens']))} "
            f"| {s['cold']:.2f} / {lifted['cold']:.2f} "
            f"| {e['shipped_over_lifted']['cold']:.3f} | {s['warm']:.2f} / {lifted['warm']:.2f} "
            f"| **{e['shipped_over_lifted']['warm']:.3f}** | {e['answers_identical']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument(
        "--hybrid", action="store_true", help="add the Qwen3.5-shaped (0.8B-class) model of bench-peer"
    )
    parser.add_argument(
        "--cmake-args",
        default=os.environ.get("LLAMA_CMAKE_ARGS", ""),
        help="flags for llama-quantize when the hybrid model must be built",
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternations of each comparison")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    ggufs = [ensure_model(m) for m in args.models]
    if args.hybrid:
        sys.path.insert(0, str(Path(__file__).parent))  # the peer benchmark is a script: its imports are
        from benchmarks.peer_llama_server import shaped_model  # its folder's modules

        ggufs.append(shaped_model("0.8b", args.cmake_args))
    before = [round(x, 2) for x in os.getloadavg()]
    results = []
    for gguf in ggufs:
        raw = raw_costs(gguf, args.repeats, args.threads)
        results.append(
            {"gguf": gguf.name, "raw": raw, "engine": engine_turns(gguf, args.repeats, args.threads)}
        )
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # a later model's failure keeps it
    load = (before, [round(x, 2) for x in os.getloadavg()])
    print(report(results, args, load))
    if args.json:
        meta = {"threads": args.threads, "repeats": args.repeats, "piece": PIECE}
        args.json.write_text(json.dumps({**meta, "load_average": load, "models": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
