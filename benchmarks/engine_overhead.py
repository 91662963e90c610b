"""Engine benchmarks, measured side by side in one run on one machine.

(a) overhead: engine time for one decision ÷ raw ``llama_decode`` of exactly the same tokens with the
    same split (prefix chunks, then the suffix) — goal ≤ 1.05;
(b) sharing: 8 decisions over one ≈1,500-token state sent as 8 separate calls ÷ one shared call
    (both cold, i.e. the state is prefilled per call as a server without sharing would) — goal ≥ 5×.
    A third row shows 8 separate calls that hit the kept prefix (the engine's cross-request reuse).
(c) split sensitivity: the largest change of any option probability when a decision's prompt is
    decoded as one token stream instead of the engine's prefix-then-suffix split — why the split is fixed.

    python benchmarks/engine_overhead.py [--models qwen gemma] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.chunking import chunks
from semif_adapter.engine.llama_backend import PREFIX_SEQ
from semif_adapter.model.demo_models import MODELS, ensure_model
from semif_adapter.settings import Settings, available_cores

SENTENCES = [
    "The payment service returned HTTP 502 for 4% of requests between 09:10 and 09:40.",
    "Customers on the Business plan opened 37 tickets about duplicate invoices this week.",
    "The on-call engineer rolled back the search indexer after memory grew without bound.",
    "A partner reported that webhooks arrived twice, about ninety seconds apart.",
    "The database failover finished in eleven seconds and no writes were lost.",
    "Sales asked whether the enterprise contract allows a second data region.",
]
QUESTIONS = [
    ("Which team should own the follow-up?", ["billing", "platform", "sales", "support"]),
    ("How severe is the situation overall?", ["low", "medium", "high", "critical"]),
    ("Is a customer-facing status update needed?", ["yes", "no"]),
    ("What is the most likely root cause area?", ["network", "database", "application", "third party"]),
    ("How urgent is a reply to the partner?", ["today", "this week", "whenever"]),
    ("Should the incident be escalated to management?", ["yes", "no"]),
    ("Which metric best tracks recovery?", ["error rate", "latency", "ticket volume"]),
    ("What should happen next?", ["monitor", "roll back", "hotfix", "postmortem"]),
]


def make_state(engine: DecisionEngine, target_tokens: int) -> str:
    parts: list[str] = []
    i = 0
    while True:
        parts.append(f"[{i:03d}] {SENTENCES[i % len(SENTENCES)]}")
        i += 1
        if i % 8 == 0 and len(engine.runtime.tokenize(" ".join(parts), False)) >= target_tokens:
            return " ".join(parts)


def decisions_for(state: str) -> list[dict]:
    return [
        {"id": f"q{i}", "state": state, "question": q, "options": [{"id": o} for o in opts]}
        for i, (q, opts) in enumerate(QUESTIONS)
    ]


def raw_decode_seconds(engine: DecisionEngine, decision: dict) -> float:
    """The same tokens in the same chunks as the engine's cold prefill, as bare llama_decode calls."""
    runtime = engine.runtime
    prefix, (suffix,) = engine.prompt_tokens([decision])
    cuts = engine.prefix_cuts([decision])
    last = cuts[-1] if cuts else 0
    engine.reset_prefix_cache()
    t0 = time.perf_counter()
    for start, end in chunks(cuts, 0, last):
        runtime.decode(prefix[start:end], start, PREFIX_SEQ, want_logits=False, chunk_size=end - start)
    runtime.decode(prefix[last:], last, PREFIX_SEQ, want_logits=False, chunk_size=engine.block_tokens)
    runtime.decode(suffix, len(prefix), PREFIX_SEQ, want_logits=True)
    runtime.last_logits()
    return time.perf_counter() - t0


def one_stream_probabilities(engine: DecisionEngine, decision: dict) -> list[float]:
    """The same prompt decoded as one stream (chunked from position 0), not prefix-then-suffix."""
    import numpy as np

    prefix, suffixes = engine.prompt_tokens([decision])
    engine.reset_prefix_cache()
    engine.runtime.decode(prefix + suffixes[0], 0, PREFIX_SEQ, True, engine.block_tokens)
    logits = engine.runtime.last_logits()[engine.label_token_ids(len(decision["options"]))].astype(np.float64)
    engine.reset_prefix_cache()
    exp = np.exp(logits - logits.max())
    return list(exp / exp.sum())


def engine_seconds(engine: DecisionEngine, decisions: list[dict], *, cold: bool) -> float:
    if cold:
        engine.reset_prefix_cache()
    t0 = time.perf_counter()
    engine.score(decisions)
    return time.perf_counter() - t0


def bench_model(key: str, repeats: int, threads: int, state_tokens: int) -> dict:
    settings = Settings(n_ctx=4096, n_batch=512, n_threads=threads, verify_manifest=False)
    engine = DecisionEngine.load(settings, ensure_model(key))
    state = make_state(engine, state_tokens)
    decisions = decisions_for(state)
    prefix, suffixes = engine.prompt_tokens(decisions[:1])
    engine_seconds(engine, decisions[:1], cold=True)  # warm caches and threads once

    engine_times, raw_times = [], []
    for _ in range(repeats):  # interleaved, so drift on a shared machine hits both sides alike
        raw_times.append(raw_decode_seconds(engine, decisions[0]))
        engine_times.append(engine_seconds(engine, decisions[:1], cold=True))
    separate_cold, shared, separate_warm = [], [], []
    for _ in range(repeats):
        separate_cold.append(sum(engine_seconds(engine, [d], cold=True) for d in decisions))
        shared.append(engine_seconds(engine, decisions, cold=True))
        engine_seconds(engine, decisions[:1], cold=True)
        separate_warm.append(sum(engine_seconds(engine, [d], cold=False) for d in decisions))
    split_shift = 0.0
    for d in decisions:
        engine.reset_prefix_cache()
        split = engine.score([d]).results[0].probabilities
        stream = one_stream_probabilities(engine, d)
        split_shift = max(split_shift, max(abs(a - b) for a, b in zip(split, stream, strict=True)))
    kernels = engine.model_info.kernels.model_dump()
    engine.close()
    med = statistics.median
    return {
        "model": MODELS[key].filename,
        "kernels": kernels,
        "prefix_tokens": len(prefix),
        "suffix_tokens": len(suffixes[0]),
        "engine_s": med(engine_times),
        "raw_decode_s": med(raw_times),
        "overhead_ratio": med(engine_times) / med(raw_times),
        "separate_cold_s": med(separate_cold),
        "shared_s": med(shared),
        "sharing_speedup": med(separate_cold) / med(shared),
        "separate_warm_s": med(separate_warm),
        "warm_speedup": med(separate_cold) / med(separate_warm),
        "split_max_abs_diff": split_shift,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--state-tokens", type=int, default=1500)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = [bench_model(key, args.repeats, args.threads, args.state_tokens) for key in args.models]
    print(
        f"machine: {platform.machine()}, {args.threads} threads; medians of {args.repeats} interleaved runs"
    )
    kernels = rows[0]["kernels"]
    print(f"CPU kernels: {kernels['variant']} ({kernels['library']}; {' '.join(kernels['features'])})")
    print("| model | prefix+suffix tokens | engine s | raw decode s | (a) engine÷raw (goal ≤ 1.05) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['prefix_tokens']}+{r['suffix_tokens']} | {r['engine_s']:.3f} | "
            f"{r['raw_decode_s']:.3f} | {r['overhead_ratio']:.3f} |"
        )
    print()
    print(
        "| model | 8 separate calls s | 1 shared call s | (b) separate÷shared (goal ≥ 5) "
        "| 8 separate, prefix kept s | separate cold÷kept |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['separate_cold_s']:.3f} | {r['shared_s']:.3f} | "
            f"{r['sharing_speedup']:.2f}× | {r['separate_warm_s']:.3f} | {r['warm_speedup']:.2f}× |"
        )
    print()
    print("| model | (c) max |Δp|, one stream vs prefix-then-suffix |")
    print("|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['split_max_abs_diff']:.2e} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
