"""Engine timings on one model, for the GPU check (scripts/gpu_check.sh), all measured in one run.

Run on the random-weight model with Qwen3.5-4B's shapes (compute does not depend on the weights' values):

* cold decisions: every devset task (tests/data/decision-devset.jsonl: its state lengths and option counts)
  as its own request with nothing kept, ``--rounds`` times: p50 / p95 / mean seconds;
* sharing: 8 decisions over one ~1,500-token state as 8 cold calls ÷ one shared call;
* agent loop: a transcript growing ~150 tokens a turn, each turn scored warm (prefix cache on) and cold;
* state save/restore (``llama_state_seq_get_data`` / ``set_data``) at several prefix lengths;
* raw prefill tokens/s of the same library in the engine's 128-token blocks and in whole ``n_batch`` chunks,
  against the engine's own prefill rate: how close the engine runs to the device's prefill limit;
* deadline and disconnect: a timer cancels a long request part-way, as the HTTP layer's timer does; how long
  after the cancel the work actually stopped (on CUDA the abort callback is not consulted mid-graph, so
  only the check before each decode chunk can stop it).

    python benchmarks/gpu_timings.py MODEL.gguf --json out.json [--n-gpu-layers -1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from agent_loop import Transcript  # noqa: E402
from engine_overhead import decisions_for, make_state  # noqa: E402

from semif_adapter.engine import DecisionEngine  # noqa: E402
from semif_adapter.engine.deadline import DEADLINE, DISCONNECTED, Deadline  # noqa: E402
from semif_adapter.engine.llama_backend import PREFIX_SEQ  # noqa: E402
from semif_adapter.errors import SemifError  # noqa: E402
from semif_adapter.eval.mapping import task_to_decision  # noqa: E402
from semif_adapter.eval.tasks import load_tasks  # noqa: E402
from semif_adapter.settings import Settings, available_cores  # noqa: E402

DEVSET = ROOT / "tests" / "data" / "decision-devset.jsonl"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": percentile(values, 50),
        "p95_s": percentile(values, 95),
        "mean_s": statistics.fmean(values),
        "max_s": max(values),
    }


def timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def cold_decisions(engine: DecisionEngine, rounds: int, limit: int | None = None) -> dict[str, Any]:
    decisions = [task_to_decision(task) for task in load_tasks(DEVSET)][:limit]
    tokens = []
    for d in decisions:
        prefix, suffixes = engine.prompt_tokens([d])
        tokens.append(len(prefix) + len(suffixes[0]))
    engine.score(decisions[:1])  # one warm-up (kernels, allocations)
    seconds: list[float] = []
    for _ in range(rounds):
        for d in decisions:
            engine.reset_prefix_cache()
            seconds.append(timed(engine.score, [d]))
    return {
        **summary(seconds),
        "tasks": len(decisions),
        "rounds": rounds,
        "options": {
            "min": min(len(d["options"]) for d in decisions),
            "max": max(len(d["options"]) for d in decisions),
        },
        "input_tokens": {"p50": percentile(tokens, 50), "max": max(tokens), "mean": statistics.fmean(tokens)},
        "tokens_per_s": sum(tokens) * rounds / sum(seconds),
    }


def sharing(engine: DecisionEngine, state_tokens: int, repeats: int) -> dict[str, Any]:
    decisions = decisions_for(make_state(engine, state_tokens))
    separate, shared = [], []
    for _ in range(repeats):
        cold = 0.0
        for d in decisions:
            engine.reset_prefix_cache()
            cold += timed(engine.score, [d])
        separate.append(cold)
        engine.reset_prefix_cache()
        shared.append(timed(engine.score, decisions))
    med = statistics.median
    prefix, _ = engine.prompt_tokens(decisions)
    return {
        "decisions": len(decisions),
        "prefix_tokens": len(prefix),
        "separate_s": med(separate),
        "shared_s": med(shared),
        "speedup": med(separate) / med(shared),
    }


def agent_loop(engine: DecisionEngine, start: int, growth: int, turns: int) -> dict[str, Any]:
    transcript = Transcript(engine, 0, start, growth)
    engine.reset_prefix_cache()
    engine.score(transcript.decisions())  # the first turn fills the cache
    warm, cold, reused = [], [], []
    for _ in range(turns):
        transcript.next_turn()
        decisions = transcript.decisions()
        t0 = time.perf_counter()
        result = engine.score(decisions)
        warm.append(time.perf_counter() - t0)
        reused.append(result.timing.prefix_reused_tokens / max(1, result.timing.prefix_tokens))
        engine.reset_prefix_cache()
        cold.append(timed(engine.score, decisions))  # refills the cache: the next warm turn extends it
    med = statistics.median
    return {
        "turns": turns,
        "start_tokens": start,
        "growth_tokens": growth,
        "warm_turn_s": med(warm),
        "cold_turn_s": med(cold),
        "speedup": med(cold) / med(warm),
        "reused_share": med(reused),
    }


def state_io(engine: DecisionEngine, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    runtime = engine.runtime
    vocab = max(16, runtime.n_vocab // 2)
    rows = []
    for n in lengths:
        if n + 8 > runtime.n_ctx:
            continue
        tokens = [(i * 7919) % vocab for i in range(n)]
        engine.reset_prefix_cache()
        runtime.decode(tokens, 0, PREFIX_SEQ, want_logits=False, chunk_size=runtime.n_batch)
        saves, restores = [], []
        size = 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            data = runtime.save_seq(PREFIX_SEQ)
            t1 = time.perf_counter()
            runtime.restore_seq(PREFIX_SEQ, data)
            t2 = time.perf_counter()
            saves.append(t1 - t0)
            restores.append(t2 - t1)
            size = len(data)
        rows.append(
            {
                "prefix_tokens": n,
                "bytes": size,
                "save_ms": 1000 * statistics.median(saves),
                "restore_ms": 1000 * statistics.median(restores),
            }
        )
    engine.reset_prefix_cache()
    return rows


def raw_prefill(engine: DecisionEngine, tokens: int, repeats: int) -> list[dict[str, Any]]:
    """Raw ``llama_decode`` of ``tokens`` from empty memory, in the engine's blocks and in n_batch chunks."""
    runtime = engine.runtime
    vocab = max(16, runtime.n_vocab // 2)
    ids = [(i * 104729) % vocab for i in range(min(tokens, runtime.n_ctx - 8))]
    rows = []
    for chunk in sorted({engine.block_tokens, runtime.n_batch}):
        seconds = []
        for _ in range(repeats):
            engine.reset_prefix_cache()
            seconds.append(timed(runtime.decode, ids, 0, PREFIX_SEQ, False, chunk))
        rows.append(
            {"chunk": chunk, "tokens": len(ids), "tokens_per_s": len(ids) / statistics.median(seconds)}
        )
    engine.reset_prefix_cache()
    return rows


def engine_prefill_rate(engine: DecisionEngine, tokens: int, repeats: int) -> dict[str, Any]:
    """Tokens/s of one cold decision whose state is ~``tokens`` long (prefix blocks + suffix + readout)."""
    decision = decisions_for(make_state(engine, tokens))[0]
    prefix, suffixes = engine.prompt_tokens([decision])
    n = len(prefix) + len(suffixes[0])
    seconds = []
    for _ in range(repeats):
        engine.reset_prefix_cache()
        seconds.append(timed(engine.score, [decision]))
    return {
        "tokens": n,
        "seconds": statistics.median(seconds),
        "tokens_per_s": n / statistics.median(seconds),
    }


def overshoot(engine: DecisionEngine, tokens: int, fractions: list[float]) -> list[dict[str, Any]]:
    """Cancel a long cold request from a timer at fractions of its full time; how late did it stop?"""
    decisions = decisions_for(make_state(engine, tokens))[:2]
    runs = []
    for _ in range(2):
        engine.reset_prefix_cache()
        runs.append(timed(engine.score, decisions))
    full = min(runs)
    rows = []
    for reason in (DEADLINE, DISCONNECTED):
        for fraction in fractions:
            engine.reset_prefix_cache()
            after = full * fraction
            token = Deadline(None)
            timer = threading.Timer(after, token.cancel, kwargs={"reason": reason})
            started = time.perf_counter()
            timer.start()
            stopped, error = None, None
            try:
                engine.score(decisions, cancel=token)
            except SemifError as exc:
                error = exc.code
            stopped = time.perf_counter() - started
            timer.cancel()
            rows.append(
                {
                    "reason": reason,
                    "cancel_after_s": after,
                    "stopped_after_s": stopped,
                    "overshoot_s": stopped - after if error else None,
                    "error": error,
                    "tokens_done": token.tokens_done,
                    "tokens_needed": token.tokens_needed,
                    "max_chunk_s": token.max_chunk_seconds,
                }
            )
    engine.reset_prefix_cache()
    return [{"full_request_s": full, "decisions": len(decisions)}, *rows]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=4, help="passes over the 60 devset tasks")
    parser.add_argument("--quick", action="store_true", help="small sizes (the CPU dry run)")
    args = parser.parse_args()
    quick = args.quick
    settings = Settings(
        n_ctx=args.n_ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers, verify_manifest=False
    )
    t0 = time.perf_counter()
    engine = DecisionEngine.load(settings, args.model)
    load_s = time.perf_counter() - t0
    info = engine.model_info
    out: dict[str, Any] = {
        "model": {
            "file": args.model.name,
            "bytes": args.model.stat().st_size,
            "architecture": info.architecture,
        },
        "engine": {
            "n_gpu_layers": args.n_gpu_layers,
            "gpu_offload": info.gpu_offload,
            "n_ctx": info.n_ctx,
            "n_batch": info.n_batch,
            "block_tokens": engine.block_tokens,
            "threads": args.threads,
            "fork_mode": info.fork_mode,
            "numerics": info.numerics,
            "numerics_reason": info.numerics_reason,
        },
        "machine": platform.machine(),
        "load_s": load_s,
    }
    steps = [
        (
            "cold_decisions",
            lambda: cold_decisions(engine, 1 if quick else args.rounds, 12 if quick else None),
        ),
        ("sharing", lambda: sharing(engine, 200 if quick else 1500, 1 if quick else 3)),
        ("agent_loop", lambda: agent_loop(engine, 200 if quick else 2000, 150, 2 if quick else 5)),
        ("state_io", lambda: state_io(engine, [128, 512] if quick else [512, 2048, 8000], 2 if quick else 5)),
        ("raw_prefill", lambda: raw_prefill(engine, 512 if quick else 4096, 1 if quick else 3)),
        ("engine_prefill", lambda: engine_prefill_rate(engine, 200 if quick else 4000, 1 if quick else 3)),
        (
            "deadline",
            lambda: overshoot(engine, 600 if quick else 6000, [0.5] if quick else [0.2, 0.5, 0.8]),
        ),
    ]
    for name, step in steps:
        started = time.perf_counter()
        out[name] = step()
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")  # partial results survive a timeout
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
