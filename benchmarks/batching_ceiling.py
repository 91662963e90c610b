"""How much faster can sharing a call make short pieces? The kernels' own answer, without the engine.

Issue 28 asks that four agents' warm turns run ≥ 1.5× faster batched into shared calls than one at a
time. A warm turn is short pieces only (an agent's new event, each decision's suffix: ~40 tokens each),
each on a transcript of its own. On a CPU, sharing a call saves what a call costs beyond its rows
(reading the weights once per call instead of once per sequence, the per-call graph), not the rows'
arithmetic, so there is a ceiling to what any engine can get from batching on a given machine and
model. This benchmark measures it on the engine's own runtime in the served invariant context (one KV
stream per sequence; ``Settings`` defaults): each of ``--sequences`` streams first holds a transcript
of its own (``--prefix`` tokens, decoded once, untimed); then, per piece size, the same pieces are
decoded **apart** (one ``llama_decode`` per sequence) and **together** (one call, one stream each),
alternating, and every stream is dropped back to its transcript after each. It reports apart ÷
together — the most a batched warm turn of such pieces can gain over the same pieces one at a time —
and checks that each piece's logits are bit-identical both ways (the invariance sharing relies on).

    python -m benchmarks.batching_ceiling [--models qwen gemma] [--repeats 5] [--json F]
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

#: rows per sequence in a piece: 8 (the shortest piece invariant numerics allows) up to a full call
PIECES = (8, 16, 40, 64, 128)
TEXT = (
    "Step {i} of agent {a}: the tool returned {d} rows in {l} ms, and the agent noted that the "
    "ticket still waits on the customer's reply before it can be closed. "
)


def _runtime(gguf: Path, threads: int) -> Any:
    """The engine's runtime in the served invariant context shape, as ``attention_configs`` builds it
    (``Settings`` defaults, flash attention off)."""
    from benchmarks.attention_configs import _context_shapes
    from benchmarks.attention_configs import _runtime as invariant_runtime

    n_ctx, n_seq_max = _context_shapes()["served"]
    return invariant_runtime(gguf, False, threads, n_ctx, n_seq_max)


def transcript(runtime: Any, agent: int, tokens: int) -> list[int]:
    """The first ``tokens`` tokens of agent ``agent``'s transcript: events of one shape whose numbers
    differ per agent and step, so no two sequences share a prefix (``shared_call_budget`` uses it too)."""
    events = range(tokens // 6 + 8)  # an event is ~30 tokens: the text runs well past the cut
    text = "".join(TEXT.format(i=i, a=agent, d=3 + 7 * i, l=20 + 13 * i + agent) for i in events)
    ids = runtime.tokenize(text, False)[:tokens]
    if len(ids) < tokens:
        raise SystemExit(f"the transcript text gave {len(ids)} tokens, fewer than {tokens}")
    return ids


def _transcripts(runtime: Any, sequences: int, prefix: int, piece: int) -> list[list[int]]:
    """Per sequence, ``prefix + piece`` tokens of a transcript of its own."""
    return [transcript(runtime, a, prefix + piece) for a in range(sequences)]


def _decode(runtime: Any, parts: list[Any], together: bool) -> tuple[float, list[np.ndarray]]:
    """Seconds to decode ``parts`` in one call or one call each; each part's last logits (copies)."""
    t0 = time.perf_counter()
    logits = []
    if together:
        rows = runtime.decode_parts(parts)
        seconds = time.perf_counter() - t0
        logits = [runtime.logits_at(row).copy() for row in rows]
    else:
        seconds = 0.0
        for part in parts:
            t1 = time.perf_counter()
            (row,) = runtime.decode_parts([part])
            seconds += time.perf_counter() - t1
            logits.append(runtime.logits_at(row).copy())
    for part in parts:
        runtime.drop(part.seq, part.start_pos)
    return seconds, logits


def measure(model: str, sequences: int, prefix: int, repeats: int, threads: int) -> dict[str, Any]:
    from semif_adapter.engine.llama_backend import Part
    from semif_adapter.model.demo_models import ensure_model

    gguf = ensure_model(model)
    runtime = _runtime(gguf, threads)
    try:
        if sequences > runtime.n_seq_max - 1:
            raise SystemExit(
                f"{sequences} sequences need {sequences + 1} streams; the context has {runtime.n_seq_max}"
            )
        if sequences * max(PIECES) > runtime.n_batch:
            raise SystemExit(f"{sequences} pieces of {max(PIECES)} tokens exceed n_batch {runtime.n_batch}")
        seqs = list(range(1, sequences + 1))  # stream 0 is the engine's prefix stream: left empty
        ids = _transcripts(runtime, sequences, prefix, max(PIECES))
        for seq, tokens in zip(seqs, ids, strict=True):
            runtime.decode(tokens[:prefix], 0, seq, want_logits=False, chunk_size=256)
        rows = []
        for piece in PIECES:
            parts = [Part(t[prefix : prefix + piece], prefix, s) for s, t in zip(seqs, ids, strict=True)]
            _decode(runtime, parts, together=True)  # warm the threads and this shape's buffers
            times: dict[str, list[float]] = {"apart": [], "together": []}
            gap = 0.0
            for r in range(repeats):
                order = (False, True) if r % 2 else (True, False)
                got = {}
                for together in order:
                    seconds, got[together] = _decode(runtime, parts, together)
                    times["together" if together else "apart"].append(seconds)
                gap = max(
                    gap, *(float(np.max(np.abs(a - b))) for a, b in zip(got[True], got[False], strict=True))
                )
            apart, together = statistics.median(times["apart"]), statistics.median(times["together"])
            rows.append(
                {
                    "piece_tokens": piece,
                    "calls_apart": sequences,
                    "apart_s": round(apart, 4),
                    "together_s": round(together, 4),
                    "apart_over_together": round(apart / together, 3),
                    "ms_per_token_apart": round(1000 * apart / (piece * sequences), 3),
                    "ms_per_token_together": round(1000 * together / (piece * sequences), 3),
                    "max_abs_logit_gap": gap,
                }
            )
        library = runtime.cpu_library
    finally:
        runtime.close()
    return {"model": model, "gguf": gguf.name, "cpu_library": library, "pieces": rows}


def report(
    results: list[dict[str, Any]], args: argparse.Namespace, load: tuple[list[float], list[float]]
) -> str:
    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {args.threads} threads; load average "
        f"{load[0]} before, {load[1]} after; served invariant context, {args.sequences} sequences each on a "
        f"{args.prefix}-token transcript of its own; medians of {args.repeats} alternations",
        "",
        "| model | tokens per sequence | apart s (one call each) | together s (one call) "
        "| apart ÷ together | ms per token apart | together | max abs logit gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["pieces"]:
            lines.append(
                f"| {result['gguf']} | {row['piece_tokens']} | {row['apart_s']:.3f} "
                f"| {row['together_s']:.3f} | **{row['apart_over_together']:.3f}** "
                f"| {row['ms_per_token_apart']:.2f} "
                f"| {row['ms_per_token_together']:.2f} | {row['max_abs_logit_gap']:.3g} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--sequences", type=int, default=4, help="sequences sharing a call (4 agents)")
    parser.add_argument("--prefix", type=int, default=1200, help="tokens of each sequence's transcript")
    parser.add_argument("--repeats", type=int, default=5, help="alternations of apart and together")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    before = [round(x, 2) for x in os.getloadavg()]
    results = [measure(m, args.sequences, args.prefix, args.repeats, args.threads) for m in args.models]
    load = (before, [round(x, 2) for x in os.getloadavg()])
    print(report(results, args, load))
    if args.json:
        meta = {
            "threads": args.threads,
            "sequences": args.sequences,
            "prefix": args.prefix,
            "repeats": args.repeats,
        }
        args.json.write_text(json.dumps({**meta, "load_average": load, "models": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
