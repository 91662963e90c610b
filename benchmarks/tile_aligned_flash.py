"""Flash attention without padding: one unified KV stream, each decision's cells from a KV-tile line.

The invariant numerics (``semif_adapter.engine.numerics``) keep flash attention off by default because its
CPU kernel takes a per-row F16 path when a KV stream brings fewer than 64 query rows to a call and a
tiled F32 path from 64 rows on; the opt-in padded mode pads every stream's piece to 64 rows, which costs
the short pieces of warm turns more than the cold prompts gain. This benchmark measures a layout that
needs no padding, on the stock kernels, before the engine is built around it: the runtime class
``semif_adapter.engine.tile_layout.TiledRuntime`` (proven bit for bit in
``tests/engine/test_tile_layout.py``).

The tiled kernel (``ggml_compute_forward_flash_attn_ext_tiled``, llama.cpp of llama-cpp-python 0.3.36)
computes each query row on its own (its own running maximum and sum), walks the KV cells in 64-cell tiles
from cell 0, skips a tile whose cells are all masked for the tile's rows, and gives masked cells an
exact zero weight. So a row's numbers depend only on where its own visible cells sit relative to the
tile lines. In ONE unified KV stream (``kv_unified``) all sequences of a call are one stream, so the
call takes the tiled path once it has 64 rows in all, whatever each sequence brings; a fork is free
(``llama_memory_seq_cp`` tags the prefix's cells, nothing is copied); and where every decision's own
cells start at a tile line, with its prefix from cell 0, each decision sees the same tiles alone as
beside others. llama.cpp places a call's tokens in the first free cells from its cache head, so the
gaps up to each tile line are held by **spacer** cells during the call: saved 64-cell states restored
into spare sequences, the holes for the call's tokens then removed from them (the head moves back to
the first hole), everything but the prefix dropped after the call.

Part 1, invariance (raw runtime, bit for bit, max |Δ| over the whole logit row): four suffixes of 27-45
tokens each alone on a prefix decoded in 512-, 256- and 128-token calls; two to four of them in one call,
in several orders; a prefix tail decoded in the suffixes' call, its tokens on every decision's sequence.
Controls that must move: the suffixes packed without the tile lines, a call of fewer than 64 rows.

Part 2, cost, side by side in one process (today's invariant context: a KV stream per sequence, flash
attention off, the served shape): a cold 1,200-token prompt in 512-token calls; an agent's warm turn
(a 41-token event and two suffixes of 40 and 27 tokens: today the event with one suffix on sequence 0,
then the other suffix in a forked stream; unified, one call) and eight 38-token suffixes on one state
(today two calls of four streams; unified, one call). Unified times include placing the spacers.
Medians of ``--repeats`` alternations.

    python -m benchmarks.tile_aligned_flash [--models qwen gemma] [--repeats 5] [--json F]
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

from benchmarks.attention_configs import TEXT  # the same event lines

#: tokens of the state the decisions are about (the cost part) and of the invariance part's prefix:
#: neither a multiple of the 64-cell tile, so the prefix's last tile is partial
STATE_TOKENS = 1200
CHECK_PREFIX = 1000
#: the four suffix lengths of the invariance checks
SUFFIXES = (30, 40, 27, 45)
#: decisions one tiled call may hold (the eight on one state)
DECISIONS = 8


def _part(tokens: list[int], start: int, seq: int, wants: bool = True) -> Any:
    from semif_adapter.engine.llama_backend import Part

    return Part(tokens, start, seq, wants)


def _prefill(rt: Any, tokens: list[int], per_call: int) -> None:
    rt.clear()
    for a in range(0, len(tokens), per_call):
        rt.decode_parts([_part(tokens[a : a + per_call], a, 0, False)])


def _runs(suffixes: list[list[int]], start: int) -> list[Any]:
    """One run per suffix from position ``start``, on decision sequences 1, 2, … (forked here)."""
    from semif_adapter.engine.tile_layout import Run

    return [Run(tokens, start, 1 + k) for k, tokens in enumerate(suffixes)]


def _fork(rt: Any, count: int) -> None:
    for k in range(count):
        rt.fork(0, 1 + k)


def _drop(rt: Any, count: int) -> None:
    for k in range(count):
        rt.drop(1 + k)


def _logits(rt: Any, rows: list[int]) -> list[np.ndarray]:
    return [np.array(rt.logits_at(r)) for r in rows]


def check_invariance(tiled: Any, ids: list[int]) -> dict[str, float]:
    """Max |Δ logit| of each way against each suffix decoded alone after a prefix in 512-token calls."""
    n = CHECK_PREFIX
    prefix = ids[:n]
    suffixes = [ids[2000 + 100 * k : 2000 + 100 * k + length] for k, length in enumerate(SUFFIXES)]

    def together(
        order: list[int], per_call: int = 512, tail: int = 0, aligned: bool = True
    ) -> dict[int, Any]:
        _prefill(tiled, prefix[: n - tail], per_call)
        _fork(tiled, len(order))
        runs = _runs([suffixes[i] for i in order], n)
        if aligned:
            rows = tiled.decode_tiled(n - tail, prefix[n - tail :], runs)
        else:  # control: the suffixes packed right after the prefix and each other, 64+ rows in all
            rows = tiled.decode_parts([_part(list(r.tokens), n, r.seq) for r in runs])
        got = dict(zip(order, _logits(tiled, rows), strict=True))
        _drop(tiled, len(order))
        return got

    reference = {i: together([i])[i] for i in range(len(SUFFIXES))}

    def gap(got: dict[int, Any]) -> float:
        return max(float(np.abs(got[i] - reference[i]).max()) for i in got)

    checks = {
        "alone, prefix in 256-token calls": max(gap(together([i], 256)) for i in range(len(SUFFIXES))),
        "alone, prefix in 128-token calls": max(gap(together([i], 128)) for i in range(len(SUFFIXES))),
    }
    for order in ([0, 1], [1, 0], [0, 1, 2], [2, 1, 0], [3, 0, 2, 1]):
        checks[f"suffixes {order} in one call"] = gap(together(order))
    checks["a 100-token prefix tail in the suffixes' call"] = gap(together([2, 0, 3], tail=100))
    checks["control, must move: suffixes without tile lines"] = gap(together([0, 1, 2], aligned=False))
    checks["control, must move: a 40-row call right after the prefix"] = gap(together([1], aligned=False))
    return checks


class Workloads:
    """The three timed shapes on both runtimes (``today``: the served invariant context)."""

    def __init__(self, today: Any, tiled: Any, ids: list[int]) -> None:
        self.today, self.tiled = today, tiled
        n = STATE_TOKENS
        self.state, self.event = ids[:n], ids[n : n + 41]
        self.two = [ids[3000:3040], ids[3100:3127]]
        self.eight = [ids[3200 + 50 * k : 3200 + 50 * k + 38] for k in range(DECISIONS)]

    def cold(self, unified: bool) -> float:
        rt = self.tiled if unified else self.today
        t0 = time.perf_counter()
        _prefill(rt, self.state, 512)
        return time.perf_counter() - t0

    def warm_turn(self, unified: bool) -> float:
        n, event, (first, second) = len(self.state), self.event, self.two
        t0 = time.perf_counter()
        if unified:
            rt = self.tiled
            _fork(rt, 2)
            rt.decode_tiled(n, event, _runs([first, second], n + len(event)))
            _drop(rt, 2)
        else:
            rt = self.today
            rt.decode_parts([_part(event + first, n, 0)])
            rt.drop(0, n + len(event))
            rt.fork(0, 1)
            rt.decode_parts([_part(second, n + len(event), 1)])
            rt.drop(1)
        seconds = time.perf_counter() - t0
        rt.drop(0, n)  # the next shape starts from the state again
        return seconds

    def eight_on_one_state(self, unified: bool) -> float:
        n = len(self.state)
        t0 = time.perf_counter()
        if unified:
            _fork(self.tiled, DECISIONS)
            self.tiled.decode_tiled(n, [], _runs(self.eight, n))
            _drop(self.tiled, DECISIONS)
        else:
            rt = self.today
            for half in (self.eight[:4], self.eight[4:]):
                _fork(rt, 4)
                rt.decode_parts([_part(s, n, 1 + k) for k, s in enumerate(half)])
                _drop(rt, 4)
        return time.perf_counter() - t0


def measure(model: str, repeats: int, threads: int) -> dict[str, Any]:
    from semif_adapter.engine.llama_backend import LlamaRuntime
    from semif_adapter.engine.tile_layout import TiledRuntime
    from semif_adapter.model.demo_models import ensure_model
    from semif_adapter.settings import Settings

    gguf = ensure_model(model)
    served = Settings(verify_manifest=False)
    today = LlamaRuntime(
        gguf,
        n_ctx=served.n_ctx,
        n_batch=512,
        n_threads=threads,
        n_gpu_layers=0,
        invariant=True,
        n_seq_max=1 + served.batch_sequences,
    )
    tiled = TiledRuntime(gguf, n_ctx=served.n_ctx, n_batch=512, n_threads=threads, n_seq_max=1 + DECISIONS)
    try:
        text = "".join(TEXT.format(i=i, w=i % 7, d=40 + 3 * i, l=100 + 11 * i) for i in range(400))
        ids = today.tokenize(text, False)
        checks = check_invariance(tiled, ids)
        work = Workloads(today, tiled, ids)
        shapes = {
            "cold prompt": work.cold,
            "warm turn": work.warm_turn,
            "eight on one state": work.eight_on_one_state,
        }
        times: dict[tuple[str, bool], list[float]] = {(s, u): [] for s in shapes for u in (False, True)}
        for r in range(repeats + 1):  # the first round warms caches and threads, untimed
            for flag in (False, True) if r % 2 else (True, False):
                _prefill(tiled if flag else today, work.state, 512)
                for name, shape in shapes.items():
                    seconds = shape(flag)
                    if r:
                        times[name, flag].append(seconds)
        costs = []
        for name in shapes:
            old, new = statistics.median(times[name, False]), statistics.median(times[name, True])
            costs.append({"shape": name, "today_s": old, "unified_s": new, "unified_over_today": new / old})
        return {
            "model": model,
            "gguf": gguf.name,
            "cpu_library": today.cpu_library,
            "checks": checks,
            "costs": costs,
        }
    finally:
        today.close()
        tiled.close()


def report(rows: list[dict[str, Any]], repeats: int, threads: int, load: list[float]) -> str:
    lines = [
        f"machine: {platform.machine()}, {threads} threads, load average {load} before; plain weights (no "
        "repacking) on both sides; today = the served invariant context (a KV stream per sequence, flash "
        "attention off); unified = one KV stream, flash attention on, decisions' cells from 64-cell tile "
        "lines (spacer cells restored from a saved state), calls of 64+ rows",
        "",
        "| model | way of decoding | max abs logit change against the decision alone |",
        "|---|---|---|",
    ]
    for row in rows:
        for name, gap in row["checks"].items():
            lines.append(f"| {row['gguf']} | {name} | {gap:.3g} |")
    lines += [
        "",
        f"Cost, medians of {repeats} alternations:",
        "",
        "| model | shape | today s | unified s | unified ÷ today |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for c in row["costs"]:
            lines.append(
                f"| {row['gguf']} | {c['shape']} | {c['today_s']:.3f} | {c['unified_s']:.3f} "
                f"| **{c['unified_over_today']:.3f}** |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--repeats", type=int, default=5, help="alternations of the two contexts")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = [measure(model, args.repeats, args.threads) for model in args.models]
    print(report(rows, args.repeats, args.threads, load))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
