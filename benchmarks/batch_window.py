"""The batching window over HTTP: four agents sending their turns at once, ``SEMIF_BATCH_WAIT_MS`` 0 vs 10.

Requests sent together reach the server a few milliseconds apart. Without a window the first one finds
the engine idle and starts alone; the other three wait for it and then share a batch (1 + 3). With the
window (``admission.Admission._gather``: only once requests have arrived in company) the first waits up
to the window for the others and the turn is one batch of four. In-process the engine gains most from
sharing on short turns (``benchmarks/tiled_regions.py``); this measures what reaches a served turn.

Per configuration (KV layout, decisions a turn) two servers of ours run side by side, window 0 and 10 ms,
and get the same requests, who goes first alternating turn by turn:

* a lone caller first (two other agents, one request at a time, before any company): what the window
  costs a caller that sends one request at a time (nothing: it does not open);
* then four agents at once (a thread each, the turn's four requests sent together): the warm turns'
  wall time (the first turn is cold, untimed), the engine batches they took (``semif_batch_requests``
  from ``/metrics``), and the largest |Δp| between the two servers (bit-identical answers give 0).

    python -m benchmarks.batch_window [--turns 6] [--first-events 30] [--json F] [--markdown F]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.tiled_regions import agent_turn

# the peer benchmark is a script: its imports are its folder's modules
sys.path.insert(0, str(Path(__file__).parent))
from benchmarks.peer_llama_server import Client, free_port, ours_command, running

WINDOWS_MS = (0, 10)
#: (KV layout, decisions a turn): the default layout's agent turn, and the short turns the tiled layout
#: shares in one call
CONFIGS = (("streams", 2), ("streams", 1), ("tiled", 1))
AGENTS = 4


def machine(threads: int) -> str:
    """The CPU by name and its widest vector extension, and the threads used (results name the machine)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    vectors = "AVX-512" if " avx512f" in text else "AVX2" if " avx2" in text else "no AVX2"
    cpu = name.group(1).strip() if name else platform.processor() or platform.machine()
    return f"{cpu} ({vectors}), {os.cpu_count()} CPUs, {threads} threads"


def batches(port: int) -> tuple[float, float]:
    """``semif_batch_requests``' count and sum so far (engine batches, requests in them)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    found = dict(re.findall(r"^semif_batch_requests_(count|sum) ([0-9.e+]+)$", text, re.MULTILINE))
    return float(found.get("count", 0)), float(found.get("sum", 0))


def ask(client: Client, decisions: list[dict[str, Any]]) -> dict[str, list[float]]:
    reply = client.post("/invocations", {"decisions": decisions})
    return {r["id"]: r["probabilities"] for r in reply["results"]}


def measure(layout: str, decisions: int, turns: int, first: int, threads: int, logs: Path) -> dict[str, Any]:
    from semif_adapter.model.demo_models import ensure_model

    gguf = ensure_model("qwen")  # the pinned demo file, wherever the benchmark is run from
    with ExitStack() as stack:
        clients = {}
        for window in WINDOWS_MS:
            port = free_port()
            extra = {"SEMIF_KV_LAYOUT": layout, "SEMIF_BATCH_WAIT_MS": str(window)}
            command, env = ours_command(gguf, threads, port, extra)
            log = logs / f"{layout}-{decisions}-{window}.log"
            clients[window] = stack.enter_context(running(command, env, port, "/ping", log))
        answers: dict[int, dict[str, list[float]]] = {w: {} for w in WINDOWS_MS}
        lone = dict.fromkeys(WINDOWS_MS, 0.0)
        for t in range(first, first + 3):  # a lone caller: no company yet
            for window in WINDOWS_MS if t % 2 else WINDOWS_MS[::-1]:
                for agent in (AGENTS, AGENTS + 1):
                    t0 = time.perf_counter()
                    answers[window].update(ask(clients[window], agent_turn(agent, t, decisions)))
                    lone[window] += time.perf_counter() - t0
        together = dict.fromkeys(WINDOWS_MS, 0.0)
        counted = dict.fromkeys(WINDOWS_MS, (0.0, 0.0))
        for t in range(first, first + turns + 1):
            requests = [agent_turn(agent, t, decisions) for agent in range(AGENTS)]
            for window in WINDOWS_MS if t % 2 else WINDOWS_MS[::-1]:
                client = clients[window]
                if t == first + 1:
                    counted[window] = batches(client.port)
                t0 = time.perf_counter()
                with ThreadPoolExecutor(AGENTS) as pool:
                    for part in pool.map(lambda r, c=client: ask(c, r), requests):
                        answers[window].update(part)
                if t > first:
                    together[window] += time.perf_counter() - t0
            print(f"{layout} {decisions}: turn {t - first + 1}/{turns + 1}", file=sys.stderr, flush=True)
        taken = {}
        for window in WINDOWS_MS:
            count, total = batches(clients[window].port)
            taken[window] = (count - counted[window][0], total - counted[window][1])
    off, on = WINDOWS_MS
    gap = max(abs(a - b) for key, p in answers[off].items() for a, b in zip(p, answers[on][key], strict=True))
    return {
        "layout": layout,
        "decisions_per_turn": decisions,
        "warm_turns": turns,
        "lone_caller_s": {str(w): round(s, 3) for w, s in lone.items()},
        "four_agents_s": {str(w): round(s, 3) for w, s in together.items()},
        "engine_batches": {str(w): int(c) for w, (c, _) in taken.items()},
        "requests": {str(w): int(n) for w, (_, n) in taken.items()},
        "window_off_over_on": round(together[off] / together[on], 3),
        "lone_on_over_off": round(lone[on] / lone[off], 3),
        "max_abs_probability_gap": gap,
    }


def report(rows: list[dict[str, Any]], machine: str) -> str:
    off, on = (str(w) for w in WINDOWS_MS)
    lines = [
        f"machine: {machine}; Qwen2.5-Coder-0.5B Q4_K_M; two servers of ours side by side, "
        f"`SEMIF_BATCH_WAIT_MS` {off} and {on}",
        "",
        "| layout | decisions a turn | warm turns | 4 agents at once, window off s | on s | off ÷ on "
        "| engine batches off | on | lone caller off s | on s | on ÷ off | max |Δp| |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['decisions_per_turn']} | {r['warm_turns']} | {r['four_agents_s'][off]} "
            f"| {r['four_agents_s'][on]} | {r['window_off_over_on']} | {r['engine_batches'][off]} "
            f"| {r['engine_batches'][on]} | {r['lone_caller_s'][off]} | {r['lone_caller_s'][on]} "
            f"| {r['lone_on_over_off']} | {r['max_abs_probability_gap']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The agent benchmarks' options: warm turns, the transcript's first length, threads, result files."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--first-events", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    return parser.parse_args(argv)


def publish(rows: list[dict[str, Any]], text: str, args: argparse.Namespace) -> None:
    """Print the report; write the rows (with the machine) and the report where asked."""
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(args.threads), "rows": rows}, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    with tempfile.TemporaryDirectory() as logs:
        rows = [
            measure(layout, decisions, args.turns, args.first_events, args.threads, Path(logs))
            for layout, decisions in CONFIGS
        ]
    publish(rows, report(rows, machine(args.threads)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
