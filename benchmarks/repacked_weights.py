"""Repacked weights in invariant numerics: which call shapes keep a row's logits fixed, and what repacking
is worth on this CPU.

Invariant numerics load the weights without llama.cpp's extra buffer types (``kernels.extra_buffers``), so
no weight is repacked. Repacked quantized weights (``CPU_REPACK``: Q4_K, Q6_K, Q4_0, … interleaved for the
CPU's gemm kernels) are multiplied by ggml-cpu's ``repack.cpp``: the rows of a matrix product up to the last
multiple of 4 go through a gemm kernel, the 1–3 rows left through a gemv kernel, and the two may round
differently. A row's numbers then follow its place in the call, unless every product has a multiple of 4
rows. In a transformer call that is every weight product of the call's rows (all but the last layer) and
of its output rows (the last layer after ``inp_out_ids`` and the output head): the rule to test is
**calls of a multiple of 4 rows, with a multiple of 4 output rows** (extra output rows on filler or on the
prefix's last tokens cost little).

Part 1, invariance (raw runtime, bit for bit, max |Δ| over the whole logit row of the suffix's last
token, sequence 0 alone, the served invariant context with repacking on): a prefix of 512 tokens in calls
of 128, 64, 256 and 100+…+12 tokens, the suffix's call with 4, 8 and 16 output rows, the prefix's last 12
tokens in the suffix's call; controls that should move if the rule is needed: prefix calls of 101 tokens,
one or two output rows. The same ways with repacking off (today's invariant context) must all give 0.

Part 2, cost, side by side in one process: a cold 1,200-token prompt in 512-token calls (its last call
with 4 output rows), plain weights vs repacked; medians of ``--repeats`` alternations.

    python -m benchmarks.repacked_weights [--models qwen gemma] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attention_configs import TEXT
from benchmarks.model_runs import run_models
from semif_adapter.engine import kernels, llama_backend
from semif_adapter.engine.llama_backend import PREFIX_SEQ, LlamaRuntime
from semif_adapter.model.demo_models import ensure_model

PREFIX = 512
SUFFIX = 40
STATE_TOKENS = 1200

#: (name, prefix call lengths, output rows of the suffix's call, prefix tokens moved into that call);
#: the rule holds for all but the controls
WAYS: tuple[tuple[str, tuple[int, ...], int, int], ...] = (
    ("reference: prefix in 128-token calls, 4 output rows", (128,) * 4, 4, 0),
    ("prefix in 64-token calls", (64,) * 8, 4, 0),
    ("prefix in 256-token calls", (256, 256), 4, 0),
    ("prefix in calls of 100 and 12 tokens", (100,) * 5 + (12,), 4, 0),
    ("8 output rows", (128,) * 4, 8, 0),
    ("16 output rows", (128,) * 4, 16, 0),
    ("the prefix's last 12 tokens in the suffix's call", (128, 128, 128, 116), 4, 12),
    ("control: prefix in calls of 101 and 108 tokens", (101,) * 4 + (108,), 4, 0),
    ("control: 1 output row", (128,) * 4, 1, 0),
    ("control: 2 output rows", (128,) * 4, 2, 0),
)


@contextmanager
def weights(repacked: bool) -> Iterator[None]:
    """Load the invariant context with repacking on or off (the served loader keeps it off)."""
    chosen = kernels.ExtraBuffers(repacked, "benchmark: repacked" if repacked else "benchmark: plain")
    saved = kernels.extra_buffers
    kernels.extra_buffers = lambda *a, **k: chosen
    try:
        yield
    finally:
        kernels.extra_buffers = saved


def load(gguf: Path, repacked: bool, threads: int) -> LlamaRuntime:
    with weights(repacked):
        return llama_backend.LlamaRuntime(
            gguf, n_ctx=2048, n_batch=512, n_threads=threads, n_gpu_layers=0, invariant=True, n_seq_max=2
        )


def call(rt: LlamaRuntime, tokens: Sequence[int], start: int, outputs: int) -> np.ndarray | None:
    """One ``llama_decode`` on sequence 0, its last ``outputs`` rows flagged for logits; the last row's."""
    batch = rt.batch
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0] = PREFIX_SEQ
        batch.logits[i] = i >= len(tokens) - outputs
    batch.n_tokens = len(tokens)
    if rt.abi.decode(rt.ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    return rt.logits_at(len(tokens) - 1).copy() if outputs else None


def answer(rt: LlamaRuntime, ids: list[int], splits: Sequence[int], outputs: int, moved: int) -> np.ndarray:
    rt.clear()
    pos = 0
    for n in splits:
        call(rt, ids[pos : pos + n], pos, 0)
        pos += n
    last = call(rt, ids[pos : PREFIX + SUFFIX], pos, outputs)
    assert last is not None and pos == PREFIX - moved
    return last


def invariance(rt: LlamaRuntime, ids: list[int]) -> list[dict[str, Any]]:
    reference = answer(rt, ids, *WAYS[0][1:])
    return [
        {"way": name, "max_abs": float(np.max(np.abs(answer(rt, ids, splits, outs, moved) - reference)))}
        for name, splits, outs, moved in WAYS
    ]


def cold(rt: LlamaRuntime, ids: list[int]) -> float:
    rt.clear()
    t = time.perf_counter()
    for start in range(0, STATE_TOKENS, 512):
        end = min(start + 512, STATE_TOKENS)
        call(rt, ids[start:end], start, 4 if end == STATE_TOKENS else 0)
    return time.perf_counter() - t


def bench_model(key: str, args: argparse.Namespace) -> dict[str, Any]:
    gguf = ensure_model(key)
    plain, repacked = load(gguf, False, args.threads), load(gguf, True, args.threads)
    try:
        ids = repacked.tokenize(TEXT * 40, special=False)
        if len(ids) < STATE_TOKENS:
            raise SystemExit(f"{key}: the text gives {len(ids)} tokens, fewer than {STATE_TOKENS}")
        result: dict[str, Any] = {
            "model": gguf.name,
            "weight_buffers": {"plain": plain.weight_buffers, "repacked": repacked.weight_buffers},
            "invariance": {"repacked": invariance(repacked, ids), "plain": invariance(plain, ids)},
        }
        times: dict[str, list[float]] = {"plain": [], "repacked": []}
        for _ in range(args.repeats):
            times["plain"].append(cold(plain, ids))
            times["repacked"].append(cold(repacked, ids))
        medians = {k: statistics.median(v) for k, v in times.items()}
        result["cold_prompt_s"] = {
            **medians,
            "runs": times,
            "repacked_speedup": medians["plain"] / medians["repacked"],
        }
        return result
    finally:
        plain.close()
        repacked.close()


def render(report: dict[str, Any]) -> str:
    lines = [
        f"machine: {report['machine']}, {report['threads']} threads; invariant context (a KV stream per "
        "sequence, flash attention off), plain weights vs repacked (llama.cpp's extra buffer types)",
        "",
        "| model | way of decoding | max abs logit change, repacked | plain |",
        "|---|---|---|---|",
    ]
    for row in report["models"]:
        for r, p in zip(row["invariance"]["repacked"], row["invariance"]["plain"], strict=True):
            lines.append(f"| {row['model']} | {r['way']} | {r['max_abs']:.3g} | {p['max_abs']:.3g} |")
    lines += [
        "",
        f"Cost, a cold {STATE_TOKENS}-token prompt in 512-token calls, medians of {report['repeats']}:",
        "",
        "| model | weight buffers (repacked) | plain s | repacked s | plain ÷ repacked |",
        "|---|---|---|---|---|",
    ]
    for row in report["models"]:
        c = row["cold_prompt_s"]
        buffers = ", ".join(row["weight_buffers"]["repacked"])
        lines.append(
            f"| {row['model']} | {buffers} | {c['plain']:.3f} | {c['repacked']:.3f} "
            f"| **{c['repacked_speedup']:.3f}** |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    run_models(__doc__ or "", bench_model, render, repeats=3)


if __name__ == "__main__":
    main()
