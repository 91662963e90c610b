"""Several requests in one tiled call: what it buys four agents' warm turns in the tiled layout.

The tiled layout (``SEMIF_KV_LAYOUT=tiled``, ``engine/tile_layout.py``) decodes one request per call:
every request's prefix must start at cell 0. ``TiledRuntime.decode_regions`` lifts that: each request's
prefix is restored into a region from a tile line, and its rows see exactly the tiles they would see
alone (``tests/engine/test_tile_regions.py`` proves it bit for bit). Before the engine batches requests
that way, this measures the gain on the raw runtime: four agents, each on a transcript of its own
(``--prefix`` tokens, decoded once and saved, as the prefix cache holds it), take a warm turn — a new
event and their decisions' suffixes — **apart** (per agent: its state restored into the emptied context
and one ``decode_tiled`` call, as the engine runs a request today; a call under 64 rows gets filler)
and **together** (the four states restored into regions and one ``decode_regions`` call). Restores
are timed on both sides. Every decision's logits are compared bit for bit between the two.

Part 2, the served engine (``engine/tiled_batches.py``): four agents, each on a JSON transcript of its
own (``--prefix`` tokens to start with), take warm turns of one new event and ``--decisions`` decisions;
every turn's four requests go to ``DecisionEngine.score_many`` on an engine that shares calls
(``SEMIF_MAX_BATCH_REQUESTS`` 4: a request joins a shared call when it comes to fewer than 64 rows) and
on one that scores them one at a time (``SEMIF_MAX_BATCH_REQUESTS`` 1), turn by turn alternating which
goes first; the warm turns' wall time is summed and every probability compared bit for bit.

Qwen2.5-Coder-0.5B only: a sliding-window model (gemma-3-270m) takes one request per tiled call.

    python -m benchmarks.tiled_regions [--prefix 300 1200] [--repeats 5] [--turns 6] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.batching_ceiling import transcript

AGENTS = 4
#: (name, event tokens, suffix lengths): an agent turn as the peer benchmark's agent loop has it, one of
#: exactly the tiled path's 64 rows, and a short one (a one-line event, one decision) where a lone call
#: is mostly filler
TURNS = (
    ("event 41 + suffixes 40, 27", 41, (40, 27)),
    ("event 24 + suffixes 20, 20", 24, (20, 20)),
    ("event 8 + suffix 20", 8, (20,)),
)


class Agents:
    """The agents' saved transcripts and their turns' tokens on one tiled runtime."""

    def __init__(self, runtime: Any, prefix: int) -> None:
        from semif_adapter.engine.llama_backend import PREFIX_SEQ, Part

        self.runtime, self.prefix = runtime, prefix
        self.ids = [transcript(runtime, agent, prefix + 200) for agent in range(AGENTS)]
        self.states = []
        for ids in self.ids:
            runtime.clear()
            for a in range(0, prefix, 512):
                runtime.decode_parts([Part(ids[a : min(a + 512, prefix)], a, PREFIX_SEQ, False)])
            self.states.append(runtime.save_seq(PREFIX_SEQ))
        runtime.clear()

    def turn(
        self, agent: int, event: int, suffixes: tuple[int, ...], first_seq: int
    ) -> tuple[list[int], list[Any]]:
        """The agent's event (the call's tail) and its decisions' runs on sequences from ``first_seq``."""
        from semif_adapter.engine.tile_layout import Run

        ids, n = self.ids[agent], self.prefix
        runs, at = [], n + event
        for k, length in enumerate(suffixes):
            runs.append(Run(ids[at + 10 * k : at + 10 * k + length], n + event, first_seq + k))
        return ids[n : n + event], runs

    def apart(self, event: int, suffixes: tuple[int, ...]) -> tuple[float, list[np.ndarray]]:
        from semif_adapter.engine.llama_backend import PREFIX_SEQ

        rt, got = self.runtime, []
        t0 = time.perf_counter()
        for agent in range(AGENTS):
            rt.clear()
            rt.restore_seq(PREFIX_SEQ, self.states[agent])
            tail, runs = self.turn(agent, event, suffixes, 1)
            for run in runs:
                rt.fork(PREFIX_SEQ, run.seq)
            rows = rt.decode_tiled(self.prefix, tail, runs)
            got += [np.array(rt.logits_at(r)) for r in rows]
        seconds = time.perf_counter() - t0
        rt.clear()
        return seconds, got

    def together(self, event: int, suffixes: tuple[int, ...]) -> tuple[float, list[np.ndarray]]:
        from semif_adapter.engine.tile_layout import Region

        rt, regions, seq = self.runtime, [], 0
        for agent in range(AGENTS):
            tail, runs = self.turn(agent, event, suffixes, seq + 1)
            regions.append(Region(seq, self.prefix, tail, runs, self.states[agent]))
            seq += 1 + len(suffixes)
        t0 = time.perf_counter()
        rows = rt.decode_regions(regions)
        got = [np.array(rt.logits_at(r)) for region_rows in rows for r in region_rows]
        seconds = time.perf_counter() - t0
        rt.clear()
        return seconds, got


def agent_turn(agent: int, events: int, decisions: int) -> list[dict[str, Any]]:
    """Agent ``agent``'s turn once its transcript holds ``events`` events: ``decisions`` decisions about
    it (an event is ~20 tokens, a decision's suffix ~25)."""
    transcript = [
        {
            "step": k,
            "tool": "search",
            "result": f"agent {agent}: {3 + 7 * k} rows in {20 + 13 * k + agent} ms",
        }
        for k in range(events)
    ]
    questions = [("Call the tool again?", ["yes", "no"]), ("Ask the user?", ["ask", "wait"])]
    return [
        {
            "id": f"a{agent}e{events}d{k}",
            "state": transcript,
            "question": questions[k % 2][0],
            "options": [{"id": o} for o in questions[k % 2][1]],
        }
        for k in range(decisions)
    ]


def measure_served(prefix: int, turns: int, decisions: int, threads: int) -> dict[str, Any]:
    """Part 2: four agents' warm turns on an engine that shares tiled calls and on one that does not."""
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import Settings

    gguf = ensure_model("qwen")
    engines = {
        way: DecisionEngine.load(
            Settings(
                verify_manifest=False,
                kv_layout="tiled",
                n_threads=threads,
                max_batch_requests=together,
                numerics_probe_cache=False,
            ),
            gguf,
        )
        for way, together in (("one at a time", 1), ("batched", AGENTS))
    }
    try:
        first = 1
        while len(engines["batched"].prompt_tokens(agent_turn(0, first, 1))[0]) < prefix:
            first += 1
        seconds = dict.fromkeys(engines, 0.0)
        rows: dict[str, list[int]] = {way: [] for way in engines}
        gap = 0.0
        for t in range(first, first + turns + 1):  # the first turn is cold: untimed
            batch = [agent_turn(a, t, decisions) for a in range(AGENTS)]
            got = {}
            for way in list(engines) if t % 2 else list(engines)[::-1]:
                t0 = time.perf_counter()
                outcomes = engines[way].score_many([(r, None) for r in batch])
                elapsed = time.perf_counter() - t0
                results = [o for o in outcomes if not isinstance(o, Exception)]
                if len(results) != AGENTS:
                    raise SystemExit(f"{way}: a request failed: {outcomes}")
                got[way] = [p for o in results for r in o.results for p in r.probabilities]
                if t > first:
                    seconds[way] += elapsed
                    rows[way].append(
                        sum(o.timing.prefix_tokens - o.timing.prefix_reused_tokens for o in results)
                    )
            gap = max([gap] + [abs(a - b) for a, b in zip(*got.values(), strict=True)])
        shared = engines["batched"].model_info.max_batch_requests
        return {
            "prefix_tokens": prefix,
            "first_events": first,
            "warm_turns": turns,
            "decisions_per_turn": decisions,
            "seconds": seconds,
            "prefix_tokens_decoded_per_turn": {way: statistics.mean(r) for way, r in rows.items()},
            "one_at_a_time_over_batched": seconds["one at a time"] / seconds["batched"],
            "max_abs_probability_gap": gap,
            "batched_max_requests": shared,
        }
    finally:
        for engine in engines.values():
            engine.close()


def measure(model: str, prefix: int, repeats: int, threads: int) -> dict[str, Any]:
    from semif_adapter.engine.tile_layout import TiledRuntime
    from semif_adapter.model.demo_models import ensure_model

    gguf = ensure_model(model)
    most = max(len(s) for _, _, s in TURNS)
    runtime = TiledRuntime(
        gguf,
        n_ctx=AGENTS * (prefix + 64),
        n_batch=512,
        n_threads=threads,
        n_seq_max=1 + most,
        regions=AGENTS,
    )
    try:
        agents = Agents(runtime, prefix)
        rows = []
        for name, event, suffixes in TURNS:
            times: dict[str, list[float]] = {"apart": [], "together": []}
            gap = 0.0
            for r in range(repeats + 1):  # the first round warms caches and threads, untimed
                ways = ("apart", "together") if r % 2 else ("together", "apart")
                got = {}
                for way in ways:
                    seconds, got[way] = getattr(agents, way)(event, suffixes)
                    if r:
                        times[way].append(seconds)
                gap = max(
                    [gap]
                    + [float(np.abs(a - b).max()) for a, b in zip(got["apart"], got["together"], strict=True)]
                )
            apart, together = statistics.median(times["apart"]), statistics.median(times["together"])
            rows.append(
                {
                    "turn": name,
                    "rows_per_agent": event + sum(suffixes),
                    "apart_s": apart,
                    "together_s": together,
                    "apart_over_together": apart / together,
                    "max_abs_logit_gap": gap,
                }
            )
        return {"model": model, "gguf": gguf.name, "prefix": prefix, "turns": rows}
    finally:
        runtime.close()


def report(results: list[dict[str, Any]], repeats: int, threads: int, load: list[float]) -> str:
    lines = [
        f"machine: {platform.machine()}, {threads} threads, load average {load} before; tiled layout (one "
        f"unified KV stream, flash attention, plain weights); {AGENTS} agents, each on a transcript of its "
        f"own; medians of {repeats} alternations; restores timed on both sides",
        "",
        "| model | transcript tokens | warm turn | rows per agent | apart s (a call per agent) "
        "| together s (one call, a region per agent) | apart ÷ together | max abs logit gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for t in res["turns"]:
            lines.append(
                f"| {res['gguf']} | {res['prefix']} | {t['turn']} | {t['rows_per_agent']} "
                f"| {t['apart_s']:.3f} | {t['together_s']:.3f} | **{t['apart_over_together']:.3f}** "
                f"| {t['max_abs_logit_gap']:.3g} |"
            )
    return "\n".join(lines)


def report_served(rows: list[dict[str, Any]]) -> str:
    lines = [
        "",
        f"Served engine, tiled layout, {AGENTS} agents, each turn's requests to `score_many` (the first turn "
        "cold, untimed): wall time of the warm turns, one request at a time (`SEMIF_MAX_BATCH_REQUESTS` 1) "
        "and batched (4: short turns share a call)",
        "",
        "| transcript tokens at the start | decisions a turn | warm turns | one at a time s | batched s "
        "| one at a time ÷ batched | prefix tokens decoded a turn (one at a time / batched) "
        "| max abs probability gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        decoded = r["prefix_tokens_decoded_per_turn"]
        lines.append(
            f"| {r['prefix_tokens']} | {r['decisions_per_turn']} | {r['warm_turns']} "
            f"| {r['seconds']['one at a time']:.3f} | {r['seconds']['batched']:.3f} "
            f"| **{r['one_at_a_time_over_batched']:.3f}** "
            f"| {decoded['one at a time']:.0f} / {decoded['batched']:.0f} "
            f"| {r['max_abs_probability_gap']:.3g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--prefix", type=int, nargs="+", default=[300, 1200], help="tokens of each agent's transcript"
    )
    parser.add_argument("--repeats", type=int, default=5, help="alternations of the two ways")
    parser.add_argument("--turns", type=int, default=6, help="warm turns in part 2")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    results = [measure("qwen", prefix, args.repeats, args.threads) for prefix in args.prefix]
    served = [
        measure_served(prefix, args.turns, decisions, args.threads)
        for prefix in args.prefix
        for decisions in (1, 2)
    ]
    print(report(results, args.repeats, args.threads, load))
    print(report_served(served))
    if args.json:
        args.json.write_text(json.dumps({"runtime": results, "served": served}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
