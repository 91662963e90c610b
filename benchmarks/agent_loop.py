"""Agent-loop benchmark: the prefix cache against cold prefills, side by side in one run.

Several agents take turns on one engine. Each agent's state is a transcript that starts near
``--start-tokens`` and grows by about ``--growth`` tokens a turn; every turn asks two decisions in
one request (a 6-way next action and a yes/no "done?"). Every turn is scored twice, back to back, on
two engines over the same model file and the same decode split: one with the prefix cache off and
one with it on — so drift on a shared machine hits both sides alike. Printed per model:

* total engine time without cache ÷ with cache, agents interleaved (goal ≥ 5×), and for one agent alone;
* the share of prefix tokens the cache reused, and the cache's size at the end;
* peak RSS of the process (both engines);
* the largest probability difference between the two runs (goal 0: bit-identical).

    python benchmarks/agent_loop.py [--models gemma qwen] [--agents 4] [--turns 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import sys
import time
from pathlib import Path

from semif_adapter.engine import DecisionEngine
from semif_adapter.model.demo_models import MODELS, ensure_model
from semif_adapter.settings import Settings, available_cores

ACTIONS = ["reply", "search", "run tool", "ask human", "wait", "stop"]
FACTS = [
    "Tool `http_get` returned status {a} after {b} ms for /api/orders?page={a}.",
    "The user said: please also check invoice {a}-{b}, it was charged twice.",
    "Log line: worker-{a} restarted, exit code {b}, queue length {a}{b}.",
    "Search result {a}: 'Refund policy, section {b}: refunds within 30 days'.",
    "Observation: the dashboard shows {a}% CPU and {b} open connections.",
    "Tool `sql` returned {a} rows; the first has status 'pending' and amount {b}.00 EUR.",
]


class Transcript:
    """An agent's growing state; lines are seeded so every run sees the same text."""

    def __init__(self, engine: DecisionEngine, agent: int, start_tokens: int, growth: int) -> None:
        self.engine = engine
        self.rng = random.Random(agent)
        self.lines = [f"Agent {agent}. Goal: resolve customer ticket #{1000 + agent} end to end."]
        self.growth = growth
        self._grow_to(start_tokens)

    def tokens(self) -> int:
        return len(self.engine.runtime.tokenize(self.text(), False))

    def text(self) -> str:
        return "\n".join(self.lines)

    def _grow_to(self, target: int) -> None:
        while self.tokens() < target:
            fact = self.rng.choice(FACTS).format(a=self.rng.randint(1, 999), b=self.rng.randint(1, 999))
            self.lines.append(f"[turn-step {len(self.lines):03d}] {fact}")

    def next_turn(self) -> None:
        self._grow_to(self.tokens() + self.growth)

    def decisions(self) -> list[dict]:
        state = self.text()
        return [
            {
                "id": "next",
                "state": state,
                "question": "What should the agent do next?",
                "options": [{"id": a} for a in ACTIONS],
            },
            {
                "id": "done",
                "state": state,
                "question": "Is the ticket resolved?",
                "options": [{"id": "yes"}, {"id": "no"}],
            },
        ]


def play(off: DecisionEngine, on: DecisionEngine, schedule: list[tuple[int, list[dict]]]) -> dict:
    """Score each request on both engines back to back; engine seconds and answers per side.

    ``steady`` leaves out each agent's first turn (a miss on both sides by construction), which is
    what a long loop converges to; one progress line per request goes to stderr.
    """
    seconds = {"off": 0.0, "on": 0.0}
    steady = {"off": 0.0, "on": 0.0}
    seen: set[int] = set()
    max_diff = 0.0
    prefix = reused = 0
    for agent, decisions in schedule:
        t0 = time.perf_counter()
        cold = off.score(decisions)
        t1 = time.perf_counter()
        warm = on.score(decisions)
        t2 = time.perf_counter()
        seconds["off"] += t1 - t0
        seconds["on"] += t2 - t1
        if agent in seen:
            steady["off"] += t1 - t0
            steady["on"] += t2 - t1
        seen.add(agent)
        print(
            f"agent {agent} prefix {warm.timing.prefix_tokens} reused {warm.timing.prefix_reused_tokens}: "
            f"off {t1 - t0:.2f} s, on {t2 - t1:.2f} s",
            file=sys.stderr,
            flush=True,
        )
        prefix += warm.timing.prefix_tokens
        reused += warm.timing.prefix_reused_tokens
        for a, b in zip(cold.results, warm.results, strict=True):
            max_diff = max(
                max_diff, *(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True))
            )
    return {
        "requests": len(schedule),
        "off_s": seconds["off"],
        "on_s": seconds["on"],
        "speedup": seconds["off"] / seconds["on"],
        "steady_speedup": steady["off"] / steady["on"] if steady["on"] else None,
        "reused_share": reused / prefix,
        "max_abs_diff": max_diff,
    }


def schedule_for(
    engine: DecisionEngine, agents: int, turns: int, start: int, growth: int
) -> list[tuple[int, list[dict]]]:
    """Round-robin turns: agent 0, 1, ..., n-1, then everyone's next turn."""
    transcripts = [Transcript(engine, a, start, growth) for a in range(agents)]
    schedule = []
    for turn in range(turns):
        for a, t in enumerate(transcripts):
            if turn:
                t.next_turn()
            schedule.append((a, t.decisions()))
    return schedule


def bench_model(key: str, args: argparse.Namespace) -> dict:
    common = {"n_ctx": args.n_ctx, "n_threads": args.threads, "verify_manifest": False}
    if args.block:
        common["prefix_block_tokens"] = args.block
    off = DecisionEngine.load(Settings(prefix_cache_tokens=0, **common), ensure_model(key))
    on = DecisionEngine.load(Settings(prefix_cache_tokens=1 << 16, **common), ensure_model(key))
    try:
        schedule = schedule_for(on, args.agents, args.turns, args.start_tokens, args.growth)
        off.score(schedule[0][1])  # warm threads and pages once on both sides
        on.score(schedule[0][1])
        on.reset_prefix_cache()
        off.reset_prefix_cache()
        alone = play(off, on, [s for s in schedule if s[0] == 0][: args.alone_turns or None])
        on.reset_prefix_cache()
        together = play(off, on, schedule)
        stats = on.prefix_cache_stats()
        first = len(on.prompt_tokens(schedule[0][1])[0])
        last = len(on.prompt_tokens(schedule[-1][1])[0])
        return {
            "model": MODELS[key].filename,
            "block_tokens": on.block_tokens,
            "prefix_tokens_first_last": [first, last],
            "agents": args.agents,
            "turns": args.turns,
            "alone": alone,
            "interleaved": together,
            "cache_entries": stats.entries,
            "cache_mib": stats.bytes / 2**20,
            "evictions": stats.evictions,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    finally:
        off.close()
        on.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["gemma", "qwen"], choices=sorted(MODELS))
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--start-tokens", type=int, default=1500)
    parser.add_argument("--growth", type=int, default=50)
    parser.add_argument(
        "--alone-turns", type=int, default=0, help="turns of the one-agent run (default: all)"
    )
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--block", type=int, default=0, help="prefix block tokens (default: the setting's)")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = []
    for key in args.models:
        rows.append(bench_model(key, args))
        print(json.dumps(rows[-1]), flush=True)
    print(
        f"\nmachine: {platform.machine()}, {args.threads} threads; {args.agents} agents × {args.turns} turns"
    )
    print(
        "| model | prefix tokens (first→last) | block | interleaved: off s / on s | off÷on (goal ≥ 5) "
        "| steady state off÷on | one agent: off÷on | prefix reused | max abs Δp | cache at end | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        i, a = r["interleaved"], r["alone"]
        diff = max(i["max_abs_diff"], a["max_abs_diff"])
        print(
            f"| {r['model']} | {r['prefix_tokens_first_last'][0]}→{r['prefix_tokens_first_last'][1]} "
            f"| {r['block_tokens']} | {i['off_s']:.1f} / {i['on_s']:.1f} | {i['speedup']:.2f}× "
            f"| {i['steady_speedup']:.2f}× | {a['speedup']:.2f}× | {i['reused_share']:.1%} | {diff:.1e} "
            f"| {r['cache_entries']} states, {r['cache_mib']:.0f} MiB | {r['peak_rss_mib']:.0f} MiB |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
