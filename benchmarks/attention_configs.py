"""Flash attention in the invariant context: what it would save, and what the numerics probe says of it.

The invariant configuration (``semif_adapter.engine.numerics``) runs flash attention off, because the
probe finds that it moves answers when tokens are grouped into calls differently. This benchmark puts a
number on that choice. One process loads the model four times on the loaded kernels, all in the
invariant context (one KV stream per sequence, weight repacking off): flash attention off and on, each
in two context shapes, because the cost of attention without flash attention depends on the shape:

* **served**: what the engine runs with default settings (``n_ctx`` cells per stream, one stream for
  the prefix and one per decision of a shared call);
* **small**: two streams just large enough for the tokens timed (what this benchmark used before).

It times bare ``llama_decode`` over the same tokens in five call shapes: a cold prompt in 512-token
calls; after that prompt, 64-token calls (an agent's event with a decision's suffix) and 40-token calls
(a lone suffix); a prefix in 128-token calls; short 32-token calls. With flash attention on, the runtime
pads every piece to 64 rows (``LlamaRuntime.min_rows``), so the 40- and 32-token calls show what that
padding costs against unpadded calls without flash attention. The contexts alternate, so drift on a
shared machine hits all alike; the best of the repeats counts. Then the probe runs on the served shape
with each setting (its verdict cache bypassed) and its checks are reported.

    python -m benchmarks.attention_configs [--models qwen gemma] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

#: (name, tokens decoded before the timed calls and kept, tokens timed, tokens per call); a shape with a
#: prefix runs after the one before it, on the prefix that one left
SHAPES = (
    ("cold prompt", 0, 1244, 512),
    ("64-token calls after it", 1244, 256, 64),
    ("40-token calls after it", 1244, 160, 40),
    ("prefix in 128-token calls", 0, 896, 128),
    ("32-token calls", 0, 512, 32),
)
#: the tokens the longest shape keeps in a stream
LONGEST = max(start + tokens for _, start, tokens, _ in SHAPES)
TEXT = (
    "Event {i}: worker-{w} reported queue depth {d} and p95 latency {l} ms; the scheduler moved two "
    "jobs to the spare pool and asked the on-call engineer to confirm the change. "
)


def _context_shapes() -> dict[str, tuple[int, int]]:
    """Cells per stream and streams: the engine's defaults, and a small context that just fits."""
    from semif_adapter.settings import Settings

    served = Settings(verify_manifest=False)
    return {"served": (served.n_ctx, 1 + served.batch_sequences), "small": (LONGEST + 64, 2)}


def _runtime(gguf: Path, flash: bool, threads: int, n_ctx: int, n_seq_max: int) -> Any:
    from semif_adapter.engine.llama_backend import LlamaRuntime

    return LlamaRuntime(
        gguf,
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=threads,
        n_gpu_layers=0,
        invariant=True,
        n_seq_max=n_seq_max,
        flash_attention=flash,
    )


def _time(runtime: Any, ids: list[int], start: int, tokens: int, per_call: int) -> float:
    """Seconds to decode ``ids[start:start + tokens]`` in calls of ``per_call``; with ``start``, on the
    prefix the shape before left (dropped back to it afterwards), else on an empty context."""
    from semif_adapter.engine.llama_backend import PREFIX_SEQ

    if start == 0:
        runtime.clear()
    t0 = time.perf_counter()
    runtime.decode(ids[start : start + tokens], start, PREFIX_SEQ, want_logits=True, chunk_size=per_call)
    runtime.last_logits()
    seconds = time.perf_counter() - t0
    if start:
        runtime.drop(PREFIX_SEQ, start)
    return seconds


def _verdict(gguf: Path, flash: bool, threads: int) -> dict[str, Any]:
    """The numerics probe's verdict on the invariant context with flash attention ``flash``."""
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.settings import Settings

    settings = Settings(
        n_threads=threads,
        numerics="auto",
        numerics_probe_cache=False,
        flash_attention=flash,
        verify_manifest=False,
    )
    engine = DecisionEngine.load(settings, gguf)
    try:
        return engine.verdict.to_json()
    finally:
        engine.close()


def measure(model: str, repeats: int, threads: int) -> dict[str, Any]:
    from semif_adapter.model.demo_models import ensure_model

    gguf = ensure_model(model)
    contexts = {
        (shape, flash): _runtime(gguf, flash, threads, n_ctx, n_seq_max)
        for shape, (n_ctx, n_seq_max) in _context_shapes().items()
        for flash in (False, True)
    }
    try:
        first = next(iter(contexts.values()))
        events = range(LONGEST // 8)
        text = "".join(TEXT.format(i=i, w=i % 7, d=40 + 3 * i, l=100 + 11 * i) for i in events)
        ids = first.tokenize(text, False)
        if len(ids) < LONGEST:
            raise SystemExit(f"the text gave {len(ids)} tokens, fewer than {LONGEST}")
        best = {(key, name): float("inf") for key in contexts for name, *_ in SHAPES}
        for _, start, tokens, per_call in SHAPES:
            _time(first, ids, start, tokens, per_call)  # warm caches and threads
        for _ in range(repeats):
            for key, runtime in contexts.items():
                for name, start, tokens, per_call in SHAPES:
                    seconds = _time(runtime, ids, start, tokens, per_call)
                    best[key, name] = min(best[key, name], seconds)
        shapes = []
        for context, (n_ctx, n_seq_max) in _context_shapes().items():
            for name, start, tokens, per_call in SHAPES:
                off, on = best[(context, False), name], best[(context, True), name]
                shapes.append(
                    {
                        "context": context,
                        "n_ctx": n_ctx,
                        "n_seq_max": n_seq_max,
                        "shape": name,
                        "start": start,
                        "tokens": tokens,
                        "per_call": per_call,
                        "off_s": off,
                        "on_s": on,
                        "on_over_off": on / off,
                    }
                )
        library = first.cpu_library
    finally:
        for runtime in contexts.values():
            runtime.close()
    verdicts = {("on" if flash else "off"): _verdict(gguf, flash, threads) for flash in (False, True)}
    return {"model": model, "gguf": gguf.name, "cpu_library": library, "shapes": shapes, "verdicts": verdicts}


def report(rows: list[dict[str, Any]], repeats: int, threads: int) -> str:
    lines = [
        f"machine: {platform.machine()}, {threads} threads; invariant context (one KV stream per sequence, "
        f"repacking off), flash attention off vs on in one process; best of {repeats} alternations. "
        "Context shapes: served = the engine's defaults, small = two streams just large enough",
        "",
        "| model | context (cells per stream × streams) | calls | tokens | per call | flash off s "
        "| flash on s | on ÷ off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for s in row["shapes"]:
            lines.append(
                f"| {row['gguf']} | {s['context']} ({s['n_ctx']} × {s['n_seq_max']}) | {s['shape']} "
                f"| {s['tokens']} | {s['per_call']} | {s['off_s']:.3f} | {s['on_s']:.3f} "
                f"| **{s['on_over_off']:.3f}** |"
            )
    lines += ["", "| model | flash attention | probe's mode | checks that moved (max abs logit change) |"]
    lines.append("|---|---|---|---|")
    for row in rows:
        for flash, verdict in row["verdicts"].items():
            moved = ", ".join(f"{name} {gap:.3g}" for name, gap in verdict["checks"].items() if gap) or "none"
            lines.append(f"| {row['gguf']} | {flash} | {verdict['mode']} | {moved} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the four contexts")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    rows = [measure(model, args.repeats, args.threads) for model in args.models]
    print(report(rows, args.repeats, args.threads))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
