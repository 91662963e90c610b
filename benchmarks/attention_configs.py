"""Flash attention in the invariant context: what it would save, and what the numerics probe says of it.

The invariant configuration (``semif_adapter.engine.numerics``) runs flash attention off, because the
probe finds that it moves answers when tokens are grouped into calls differently. This benchmark puts a
number on that choice: one process loads the model twice on the loaded kernels, both in the invariant
context (one KV stream per sequence, weight repacking off), one with flash attention off and one with it
on, and times bare ``llama_decode`` over the same tokens in three call shapes (a cold prompt in
512-token calls, a prefix in 128-token calls, short 32-token calls like an agent's event or a decision's
suffix). The two contexts alternate, so drift on a shared machine hits both alike; the best of the
repeats counts. Then the probe runs on each (its verdict cache bypassed) and its checks are reported.

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

SHAPES = ((1244, 512), (896, 128), (512, 32))  # (tokens, tokens per call)
TEXT = (
    "Event {i}: worker-{w} reported queue depth {d} and p95 latency {l} ms; the scheduler moved two "
    "jobs to the spare pool and asked the on-call engineer to confirm the change. "
)


def _runtime(gguf: Path, flash: bool, threads: int, n_ctx: int) -> Any:
    from semif_adapter.engine.llama_backend import LlamaRuntime

    return LlamaRuntime(
        gguf,
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=threads,
        n_gpu_layers=0,
        invariant=True,
        n_seq_max=2,
        flash_attention=flash,
    )


def _time(runtime: Any, ids: list[int], per_call: int) -> float:
    from semif_adapter.engine.llama_backend import PREFIX_SEQ

    runtime.clear()
    t0 = time.perf_counter()
    runtime.decode(ids, 0, PREFIX_SEQ, want_logits=True, chunk_size=per_call)
    runtime.last_logits()
    return time.perf_counter() - t0


def _verdict(gguf: Path, flash: bool, threads: int) -> dict[str, Any]:
    """The numerics probe's verdict on the invariant context with flash attention ``flash``."""
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.settings import Settings

    settings = Settings(
        n_ctx=4096,
        n_batch=512,
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
    n_ctx = max(tokens for tokens, _ in SHAPES) + 64
    contexts = {flash: _runtime(gguf, flash, threads, n_ctx) for flash in (False, True)}
    try:
        events = range(max(tokens for tokens, _ in SHAPES) // 8)
        text = "".join(TEXT.format(i=i, w=i % 7, d=40 + 3 * i, l=100 + 11 * i) for i in events)
        ids = contexts[False].tokenize(text, False)
        shapes = []
        for tokens, per_call in SHAPES:
            if len(ids) < tokens:
                raise SystemExit(f"the text gave {len(ids)} tokens, fewer than {tokens}")
            best = {flash: float("inf") for flash in contexts}
            _time(contexts[False], ids[:tokens], per_call)  # warm caches and threads
            for _ in range(repeats):
                for flash, runtime in contexts.items():
                    best[flash] = min(best[flash], _time(runtime, ids[:tokens], per_call))
            shapes.append(
                {
                    "tokens": tokens,
                    "per_call": per_call,
                    "off_s": best[False],
                    "on_s": best[True],
                    "on_over_off": best[True] / best[False],
                }
            )
        library = contexts[False].cpu_library
    finally:
        for runtime in contexts.values():
            runtime.close()
    verdicts = {("on" if flash else "off"): _verdict(gguf, flash, threads) for flash in (False, True)}
    return {"model": model, "gguf": gguf.name, "cpu_library": library, "shapes": shapes, "verdicts": verdicts}


def report(rows: list[dict[str, Any]], repeats: int, threads: int) -> str:
    lines = [
        f"machine: {platform.machine()}, {threads} threads; invariant context (one KV stream per sequence, "
        f"repacking off), flash attention off vs on in one process; best of {repeats} alternations",
        "",
        "| model | tokens | per call | flash off s | flash on s | on ÷ off |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for s in row["shapes"]:
            lines.append(
                f"| {row['gguf']} | {s['tokens']} | {s['per_call']} | {s['off_s']:.3f} | {s['on_s']:.3f} "
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
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two contexts")
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
