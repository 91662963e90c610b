"""The two KV layouts of invariant numerics side by side over HTTP: ``SEMIF_KV_LAYOUT`` streams vs tiled.

The peer benchmark compares each layout with llama-server in runs of its own, and on these shared VMs a
ratio moves by up to 0.15 between runs, as much as the layouts differ. Whether the tiled layout should be
the default on attention-only models needs the two in ONE run: two servers of ours, one per layout, get
the peer benchmark's workloads (``peer_llama_server.workloads`` and ``four_agents``: cold singles, eight
decisions on one state, an agent loop of 4 agents × 6 turns, four agents sending their turns at once),
each item to both servers back to back, who goes first alternating item by item.

Reported per workload: each layout's seconds and tiled ÷ streams (below 1: tiled faster); the agent loop
also as its first turns (cold prompts) and warm turns. The layouts answer under scoring versions of their
own (flash attention's kernels), so the largest |Δp| between them is shown for scale, not as a defect.

    python -m benchmarks.kv_layouts [--models qwen gemma] [--json F] [--markdown F]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.batch_window import machine, publish

# the peer benchmark is a script: its imports are its folder's modules
sys.path.insert(0, str(Path(__file__).parent))
from benchmarks.peer_llama_server import (
    Client,
    ask_ours,
    four_agents,
    free_port,
    ours_command,
    running,
    workloads,
)

LAYOUTS = ("streams", "tiled")


def served(stack: ExitStack, gguf: Path, threads: int, logs: Path) -> dict[str, Client]:
    """One server of ours per layout; four requests at once queue where a layout shares fewer."""
    clients = {}
    for layout in LAYOUTS:
        port = free_port()
        extra = {"SEMIF_KV_LAYOUT": layout, "SEMIF_MAX_QUEUE": "4"}
        command, env = ours_command(gguf, threads, port, extra)
        clients[layout] = stack.enter_context(running(command, env, port, "/ping", logs / f"{layout}.log"))
    return clients


def alternate(
    clients: dict[str, Client], index: int, send: Any, answers: dict[str, dict[str, list[float]]]
) -> dict[str, float]:
    """``send(client)`` on both servers, the first alternating with ``index``; seconds per layout."""
    seconds = {}
    for layout in LAYOUTS if index % 2 == 0 else LAYOUTS[::-1]:
        t0 = time.perf_counter()
        answers[layout].update(send(clients[layout]))
        seconds[layout] = time.perf_counter() - t0
    return seconds


def together(client: Client, requests: list[list[dict]]) -> dict[str, list[float]]:
    """The four agents' requests of one turn sent at once."""
    out: dict[str, list[float]] = {}
    with ThreadPoolExecutor(len(requests)) as pool:
        for part in pool.map(lambda r: ask_ours(client, r), requests):
            out.update(part)
    return out


def measure(key: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    from semif_adapter.engine.decision_engine import DecisionEngine
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import Settings

    gguf = ensure_model(key)
    engine = DecisionEngine.load(Settings(n_threads=1, verify_manifest=False, prefix_cache_tokens=0), gguf)
    try:  # the peer benchmark's items, built with the model's tokenizer
        plan, at_once = workloads(engine, args), four_agents(engine, args)
    finally:
        engine.close()
    answers: dict[str, dict[str, list[float]]] = {layout: {} for layout in LAYOUTS}
    times: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        clients = served(stack, gguf, args.threads, logs)
        n = 0
        for workload, items in plan.items():
            for i, item in enumerate(items):
                took = alternate(clients, n, lambda c, d=item: ask_ours(c, d), answers)
                n += 1
                part = (
                    workload
                    if workload != "agent_loop"
                    else ("first_turns" if i < args.agents else "warm_turns")
                )
                for layout, s in took.items():
                    times.setdefault(part, dict.fromkeys(LAYOUTS, 0.0))[layout] += s
            print(f"{key}: {workload} done", file=sys.stderr, flush=True)
        for t, requests in enumerate(at_once):
            took = alternate(clients, t, lambda c, r=requests: together(c, r), answers)
            if t:  # the first turn is every agent's cold prompt
                for layout, s in took.items():
                    times.setdefault("four_agents_warm_turns", dict.fromkeys(LAYOUTS, 0.0))[layout] += s
        print(f"{key}: four agents at once done", file=sys.stderr, flush=True)
    streams, tiled = LAYOUTS
    rows = {
        part: {
            **{layout: round(s, 3) for layout, s in by.items()},
            "tiled_over_streams": round(by[tiled] / by[streams], 3),
        }
        for part, by in times.items()
    }
    gap = max(
        abs(a - b) for k, p in answers[streams].items() for a, b in zip(p, answers[tiled][k], strict=True)
    )
    return {"model": gguf.name, "workloads": rows, "max_abs_probability_gap_between_layouts": gap}


def report(results: list[dict[str, Any]], machine_line: str) -> str:
    lines = [
        f"machine: {machine_line}; two servers of ours side by side, `SEMIF_KV_LAYOUT` streams and tiled, "
        "each item to both, who goes first alternating",
        "",
        "| model | workload | streams s | tiled s | tiled ÷ streams |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for part, row in r["workloads"].items():
            lines.append(
                f"| {r['model']} | {part} | {row['streams']} | {row['tiled']} | {row['tiled_over_streams']} |"
            )
    lines.append("")
    lines.append(
        "Largest |Δp| between the layouts (other kernels, other scoring versions; for scale): "
        + ", ".join(f"{r['model']} {r['max_abs_probability_gap_between_layouts']:.2e}" for r in results)
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--singles", type=int, default=6)
    parser.add_argument("--state-tokens", type=int, default=1200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--agent-state", choices=["json", "text"], default="json")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as logs:
        results = [measure(key, args, Path(logs)) for key in args.models]
    publish(results, report(results, machine(args.threads)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
