"""Flash attention without padding: one unified KV stream, each decision's cells from a KV-tile line.

The invariant numerics (``semif_adapter.engine.numerics``) keep flash attention off by default because its
CPU kernel takes a per-row F16 path when a KV stream brings fewer than 64 query rows to a call and a
tiled F32 path from 64 rows on; the opt-in padded mode pads every stream's piece to 64 rows, which costs
the short pieces of warm turns more than the cold prompts gain. This benchmark measures a layout that
needs no padding, on the stock kernels, before the engine is built around it.

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

#: the CPU flash-attention kernel's query rows per tile (``GGML_FA_TILE_Q``: fewer rows take the per-row
#: F16 path) and KV cells per tile (``GGML_FA_TILE_KV``), both 64 in this llama.cpp
TILE = 64
#: tokens of the state the decisions are about (the cost part) and of the invariance part's prefix:
#: neither a multiple of the tile, so the prefix's last tile is partial
STATE_TOKENS = 1200
CHECK_PREFIX = 1000
#: the four suffix lengths of the invariance checks
SUFFIXES = (30, 40, 27, 45)
#: sequence ids: 0 the prefix, 1.. the decisions, then the spacers and a filler that pads short calls
FIRST_SPACER = 12
SPACERS = 20
FILLER = FIRST_SPACER + SPACERS
N_SEQ = FILLER + 1


def tile_line(cell: int) -> int:
    """The first tile line at or after ``cell``."""
    return -(-cell // TILE) * TILE


def _unified_runtime(gguf: Path, threads: int, n_ctx: int) -> Any:
    """The engine's runtime class on one unified KV stream with flash attention and plain weights."""
    from semif_adapter.engine.llama_backend import LlamaRuntime

    class Unified(LlamaRuntime):
        def _context_params(self, *args: Any) -> Any:
            cparams = super()._context_params(*args)
            cparams.n_seq_max = N_SEQ
            cparams.kv_unified = True
            cparams.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
            return cparams

    return Unified(gguf, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_gpu_layers=0, extra_buffers="off")


class Layout:
    """Calls on a unified stream with every decision's own cells from a tile line (see the module text).

    ``decode`` takes entries ``(token, position, sequences, wants logits)`` in the order their cells must
    follow: the prefix's new tokens first (on sequence 0 and every decision that sees them), then each
    decision's suffix. Sequence 0 holds the prefix from cell 0 and nothing else lives in the cache."""

    def __init__(self, runtime: Any, ids: list[int]) -> None:
        self.rt = runtime
        self.batch = runtime.abi.batch_init(runtime.n_batch, 0, N_SEQ)
        runtime.clear()
        runtime.decode_parts([_part(ids[:TILE], 0, FIRST_SPACER, False)])  # any tokens: never attended to
        self.spacer = runtime.save_seq(FIRST_SPACER)  # TILE cells at positions 0..TILE-1
        runtime.clear()

    def decode(
        self, prefix_end: int, runs: list[list[tuple[int, int, list[int], bool]]], pad: bool = True
    ) -> list[int]:
        """``runs[0]``: tokens that extend the prefix (cells from ``prefix_end``); ``runs[1:]``: one
        decision each, its cells from the next tile line. Pads the call to ``TILE`` rows with filler
        (``pad``), holds the gaps with spacers; returns the rows with logits."""
        holes, cell = [], prefix_end
        for k, run in enumerate(runs):
            if k:
                cell = tile_line(cell)
            holes.append((cell, cell + len(run)))
            cell += len(run)
        entries = [e for run in runs for e in run]
        short = TILE - len(entries)
        if pad and short > 0:  # filler rows right after the last run: its own cells, masked for everyone else
            holes.append((cell, cell + short))
            entries += [(entries[-1][0], i, [FILLER], False) for i in range(short)]
            cell += short
        used = [*self._hold(prefix_end, cell, holes), FILLER]
        rows = self._call(entries)
        for seq in used:
            self.rt.drop(seq)
        return rows

    def _hold(self, start: int, end: int, holes: list[tuple[int, int]]) -> list[int]:
        """Spacers over cells ``start..end`` (each TILE cells, restored in turn from the head), then the
        holes removed from them: the call's tokens go exactly into the holes."""
        used = []
        for k in range(-(-(end - start) // TILE)):
            seq = FIRST_SPACER + k
            self.rt.restore_seq(seq, self.spacer)
            used.append(seq)
        for a, b in holes:
            for k in range((a - start) // TILE, (b - 1 - start) // TILE + 1):
                base = start + k * TILE
                p0, p1 = max(a, base) - base, min(b, base + TILE) - base
                if not self.rt.lib.llama_memory_seq_rm(self.rt.memory, FIRST_SPACER + k, p0, p1):
                    raise RuntimeError(f"could not open cells {p0}..{p1} of spacer {k}")
        return used

    def _call(self, entries: list[tuple[int, int, list[int], bool]]) -> list[int]:
        batch, rows = self.batch, []
        for i, (token, pos, seqs, wants) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, len(seqs)
            for j, seq in enumerate(seqs):
                batch.seq_id[i][j] = seq
            batch.logits[i] = wants
            if wants:
                rows.append(i)
        batch.n_tokens = len(entries)
        rc = self.rt.abi.decode(self.rt.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return rows


def _part(tokens: list[int], start: int, seq: int, wants: bool = True) -> Any:
    from semif_adapter.engine.llama_backend import Part

    return Part(tokens, start, seq, wants)


def _prefill(rt: Any, tokens: list[int], per_call: int) -> None:
    rt.clear()
    for a in range(0, len(tokens), per_call):
        rt.decode_parts([_part(tokens[a : a + per_call], a, 0, False)])


def _suffix(tokens: list[int], start: int, seq: int) -> list[tuple[int, int, list[int], bool]]:
    return [(t, start + i, [seq], i == len(tokens) - 1) for i, t in enumerate(tokens)]


def _logits(rt: Any, rows: list[int]) -> list[np.ndarray]:
    return [np.array(rt.logits_at(r)) for r in rows]


def check_invariance(layout: Layout, ids: list[int]) -> dict[str, float]:
    """Max |Δ logit| of each way against each suffix decoded alone after a prefix in 512-token calls."""
    rt, n = layout.rt, CHECK_PREFIX
    prefix = ids[:n]
    suffixes = [ids[2000 + 100 * k : 2000 + 100 * k + length] for k, length in enumerate(SUFFIXES)]

    def together(
        order: list[int], per_call: int = 512, tail: int = 0, aligned: bool = True
    ) -> dict[int, Any]:
        _prefill(rt, prefix[: n - tail], per_call)
        for j in range(len(order)):
            rt.fork(0, 1 + j)
        seqs = [0, *range(1, 1 + len(order))]
        head = [(t, n - tail + i, seqs, False) for i, t in enumerate(prefix[n - tail :])]
        runs = [_suffix(suffixes[i], n, 1 + j) for j, i in enumerate(order)]
        if aligned:
            rows = layout.decode(n - tail, [head, *runs])
        else:  # control: the suffixes packed right after each other, no tile lines
            rows = layout._call([*head, *[e for run in runs for e in run]])
        return dict(zip(order, _logits(rt, rows), strict=True))

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
    _prefill(rt, prefix, 512)
    rt.fork(0, 1)
    short = layout.decode(n, [[], _suffix(suffixes[1], n, 1)], pad=False)  # 40 rows: the per-row kernel
    checks["control, must move: a call of fewer than 64 rows"] = gap({1: _logits(rt, short)[0]})
    return checks


class Workloads:
    """The three timed shapes on both contexts (``today``: the served invariant context)."""

    def __init__(self, today: Any, layout: Layout, ids: list[int]) -> None:
        self.today, self.layout = today, layout
        n = STATE_TOKENS
        self.state, self.event = ids[:n], ids[n : n + 41]
        self.two = [ids[3000:3040], ids[3100:3127]]
        self.eight = [ids[3200 + 50 * k : 3200 + 50 * k + 38] for k in range(8)]

    def cold(self, unified: bool) -> float:
        rt = self.layout.rt if unified else self.today
        t0 = time.perf_counter()
        _prefill(rt, self.state, 512)
        return time.perf_counter() - t0

    def warm_turn(self, unified: bool) -> float:
        n, event, (first, second) = len(self.state), self.event, self.two
        t0 = time.perf_counter()
        if unified:
            rt = self.layout.rt
            rt.fork(0, 1)
            rt.fork(0, 2)
            head = [(t, n + i, [0, 1, 2], False) for i, t in enumerate(event)]
            runs = [_suffix(first, n + len(event), 1), _suffix(second, n + len(event), 2)]
            self.layout.decode(n, [head, *runs])
            rt.drop(1)
            rt.drop(2)
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
            rt = self.layout.rt
            for k in range(8):
                rt.fork(0, 1 + k)
            self.layout.decode(n, [[], *[_suffix(s, n, 1 + k) for k, s in enumerate(self.eight)]])
            for k in range(8):
                rt.drop(1 + k)
        else:
            rt = self.today
            for half in (self.eight[:4], self.eight[4:]):
                for k in range(4):
                    rt.fork(0, 1 + k)
                rt.decode_parts([_part(s, n, 1 + k) for k, s in enumerate(half)])
                for k in range(4):
                    rt.drop(1 + k)
        return time.perf_counter() - t0


def measure(model: str, repeats: int, threads: int) -> dict[str, Any]:
    from semif_adapter.engine.llama_backend import LlamaRuntime
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
    unified = _unified_runtime(gguf, threads, served.n_ctx)
    try:
        text = "".join(TEXT.format(i=i, w=i % 7, d=40 + 3 * i, l=100 + 11 * i) for i in range(400))
        ids = today.tokenize(text, False)
        layout = Layout(unified, ids)
        checks = check_invariance(layout, ids)
        work = Workloads(today, layout, ids)
        shapes = {
            "cold prompt": work.cold,
            "warm turn": work.warm_turn,
            "eight on one state": work.eight_on_one_state,
        }
        times: dict[tuple[str, bool], list[float]] = {(s, u): [] for s in shapes for u in (False, True)}
        for r in range(repeats + 1):  # the first round warms caches and threads, untimed
            for flag in (False, True) if r % 2 else (True, False):
                rt = unified if flag else today
                _prefill(rt, work.state, 512)
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
        unified.close()


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
