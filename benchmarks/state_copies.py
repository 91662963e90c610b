"""What agents' sequences kept resident save: the share of warm turns spent copying states.

Between turns an agent's prefix lives in the prefix cache (host memory): its next turn could restore it
into a sequence (``llama_state_seq_set_data``), and each prefill call's end state is copied out again to
be filed (``llama_state_seq_get_data``). Instead, the last request's prefix stays in sequence 0, and an
agent's next turn right after its last goes on from it in place (``Prefill.resident``); in the stream
layout a shared batch leaves each request's prefix in its branch stream, and the agent's next batched
turn goes on there (``resident_streams``). Both are counted as "prefills in place". The same tokens are
decoded either way, so this times every state operation of the runtime (save, restore, fork, drop,
clear) during agents' warm turns on the served engine (``DecisionEngine.score_many``), against the turns'
wall time; four agents in the stream layout also run with the streams emptied after each batch (the
engine before resident streams), alternating with the default, three times, for the wall-time ratio.

Workloads (Qwen2.5-Coder-0.5B, JSON transcripts of ~1,000 tokens, warm turns of one ~20-token event):
one agent alone (two decisions a turn), and four agents at once in one batch — two decisions a turn in
the stream layout, one in the tiled layout (the short turns it shares in one call).

    python -m benchmarks.state_copies [--turns 6] [--first-events 30] [--json F] [--markdown F]
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.batch_window import arguments, machine, publish
from benchmarks.tiled_regions import agent_turn

#: the runtime's state operations (``llama_backend.LlamaRuntime``)
STATE_OPERATIONS = ("save_seq", "restore_seq", "fork", "drop", "clear")
#: (KV layout, agents, decisions a turn, streams kept between batches)
WORKLOADS = (
    ("streams", 1, 2, True),
    *((("streams", 4, 2, True), ("streams", 4, 2, False)) * 3),
    ("tiled", 1, 2, True),
    ("tiled", 4, 1, True),
)


@contextmanager
def streams_kept(on: bool) -> Iterator[None]:
    """``Prefill.streams_stay`` as the engine decides it, or off: every batch's streams emptied after it."""
    from semif_adapter.engine.prefill import Prefill

    original = Prefill.streams_stay
    if not on:
        Prefill.streams_stay = property(lambda self: False)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        Prefill.streams_stay = original  # type: ignore[method-assign]


@contextmanager
def timed_state_operations() -> Iterator[tuple[Counter[str], Counter[str]]]:
    """Seconds and calls per state operation while the block runs (the runtime class's methods wrapped)."""
    from semif_adapter.engine.llama_backend import LlamaRuntime

    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    originals = {name: getattr(LlamaRuntime, name) for name in STATE_OPERATIONS}

    def wrapped(name: str, original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0
                calls[name] += 1

        return timed

    for name, original in originals.items():
        setattr(LlamaRuntime, name, wrapped(name, original))
    try:
        yield seconds, calls
    finally:
        for name, original in originals.items():
            setattr(LlamaRuntime, name, original)


def measure(
    layout: str, agents: int, decisions: int, stay: bool, turns: int, first: int, threads: int
) -> dict[str, Any]:
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import Settings

    settings = Settings(verify_manifest=False, kv_layout=layout, n_threads=threads, max_batch_requests=agents)
    engine = DecisionEngine.load(settings, ensure_model("qwen"))
    try:
        with streams_kept(stay):
            engine.score_many([(agent_turn(a, first, decisions), None) for a in range(agents)])  # cold
            resident = engine.prefix_cache_stats().resident
            with timed_state_operations() as (seconds, calls):
                t0 = time.perf_counter()
                for t in range(first + 1, first + 1 + turns):
                    outcomes = engine.score_many([(agent_turn(a, t, decisions), None) for a in range(agents)])
                    if any(isinstance(o, Exception) for o in outcomes):
                        raise SystemExit(f"a request failed: {outcomes}")
                wall = time.perf_counter() - t0
            resident = engine.prefix_cache_stats().resident - resident
            prefix = len(engine.prompt_tokens(agent_turn(0, first + turns, 1))[0])
    finally:
        engine.close()
    copies = sum(seconds.values())
    return {
        "layout": layout,
        "agents": agents,
        "decisions_per_turn": decisions,
        "streams_stay": stay,
        "warm_turns": turns,
        "last_prefix_tokens": prefix,
        "wall_s": round(wall, 3),
        "state_operations_s": round(copies, 3),
        "share": round(copies / wall, 4),
        "resident_prefills": resident,
        "per_operation": {n: {"s": round(seconds[n], 4), "calls": calls[n]} for n in STATE_OPERATIONS},
    }


def report(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        f"machine: {machine}; Qwen2.5-Coder-0.5B Q4_K_M, the served engine, warm turns only",
        "",
        "| layout | agents | decisions a turn | streams kept | warm turns | prefix tokens (last) | wall s "
        "| state operations s | share | save s (calls) | restore s (calls) | fork, drop, clear s "
        "| prefills in place |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        op = r["per_operation"]
        rest = sum(op[n]["s"] for n in ("fork", "drop", "clear"))
        lines.append(
            f"| {r['layout']} | {r['agents']} | {r['decisions_per_turn']} "
            f"| {'yes' if r.get('streams_stay', True) else 'no'} | {r['warm_turns']} "
            f"| {r['last_prefix_tokens']} | {r['wall_s']} | {r['state_operations_s']} | {r['share']:.1%} "
            f"| {op['save_seq']['s']} ({op['save_seq']['calls']}) "
            f"| {op['restore_seq']['s']} ({op['restore_seq']['calls']}) | {rest:.4f} "
            f"| {r.get('resident_prefills', 0)} |"
        )
    pairs = [r for r in rows if r["layout"] == "streams" and r["agents"] > 1]
    kept = [r["wall_s"] for r in pairs if r.get("streams_stay", True)]
    emptied = [r["wall_s"] for r in pairs if not r.get("streams_stay", True)]
    if kept and emptied:
        lines += [
            "",
            f"Four agents, stream layout: streams kept ÷ emptied after each batch, warm turns' wall time "
            f"{sum(kept) / sum(emptied):.3f} (run by run: "
            + ", ".join(f"{a / b:.3f}" for a, b in zip(kept, emptied, strict=False))
            + ").",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    rows = [measure(*w, args.turns, args.first_events, args.threads) for w in WORKLOADS]
    publish(rows, report(rows, machine(args.threads)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
