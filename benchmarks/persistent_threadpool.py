"""A persistent CPU threadpool against ggml's per-call one: what llama-server has that our context lacks.

llama-server (llama.cpp's ``common_init_from_params``) creates a ggml threadpool once and attaches it to its
context (``llama_attach_threadpool``). Our engine creates its context through the plain C API and attaches
none, so ggml-cpu makes a disposable threadpool for every graph it computes: its worker threads are
created and joined once per ``llama_decode`` micro-batch. This benchmark times the served invariant
context (a KV stream per sequence, plain weights) both ways in one process, alternating, on the same
tokens:

* a cold 1,200-token prompt in 512-token calls;
* ten 40-token calls after it (the shape of decision suffixes and agents' events: the per-call cost
  weighs more there).

It also checks that the logits are bit-identical both ways (a threadpool changes which thread computes a
chunk, never how a chunk is computed). The pool is made as llama.cpp's own tools make it: the CPU
backend's ``ggml_threadpool_new`` (found through the backend registry, as ``common.cpp`` does) with
``ggml_threadpool_params_default(n_threads)``.

    python -m benchmarks.persistent_threadpool [--models qwen gemma] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attention_configs import TEXT
from benchmarks.model_runs import run_models
from semif_adapter.engine.llama_backend import PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.model.demo_models import ensure_model

STATE_TOKENS = 1200
SHORT_CALLS, SHORT_TOKENS = 10, 40
GGML_MAX_N_THREADS = 512
GGML_BACKEND_DEVICE_TYPE_CPU = 0


class ThreadpoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (ggml.h)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


class Pools:
    """Create, attach and detach a persistent threadpool on a context (llama.cpp's C API)."""

    def __init__(self, runtime: LlamaRuntime, n_threads: int) -> None:
        libdir = Path(runtime.lib.llama_cpp._lib._name).parent
        base = ctypes.CDLL(str(libdir / "libggml-base.so"))
        ggml = ctypes.CDLL(str(libdir / "libggml.so"))
        self.llama = runtime.lib.llama_cpp._lib
        base.ggml_threadpool_params_default.restype = ThreadpoolParams
        base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
        ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        reg = base.ggml_backend_dev_backend_reg(ggml.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))
        address = base.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_new")
        if not address:
            raise SystemExit("the CPU backend exports no ggml_threadpool_new")
        new = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ThreadpoolParams))(address)
        self.params = base.ggml_threadpool_params_default(n_threads)
        self.pool = new(ctypes.byref(self.params))
        if not self.pool:
            raise SystemExit("ggml_threadpool_new failed")
        self.llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.llama.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
        self.ctx = runtime.ctx

    def attach(self) -> None:
        self.llama.llama_attach_threadpool(self.ctx, self.pool, None)

    def detach(self) -> None:
        self.llama.llama_detach_threadpool(self.ctx)


def run(rt: LlamaRuntime, ids: list[int]) -> tuple[float, float, np.ndarray]:
    """Seconds of the cold prompt, of the short calls, and the last call's logits."""
    rt.clear()
    t = time.perf_counter()
    for start in range(0, STATE_TOKENS, 512):
        end = min(start + 512, STATE_TOKENS)
        rt.decode_parts([Part(ids[start:end], start, PREFIX_SEQ, end == STATE_TOKENS)])
    cold = time.perf_counter() - t
    t, pos = time.perf_counter(), STATE_TOKENS
    for _ in range(SHORT_CALLS):
        (row,) = rt.decode_parts([Part(ids[pos : pos + SHORT_TOKENS], pos, PREFIX_SEQ)])
        pos += SHORT_TOKENS
    short = time.perf_counter() - t
    return cold, short, rt.logits_at(row).copy()


def bench_model(key: str, args: argparse.Namespace) -> dict[str, Any]:
    gguf = ensure_model(key)
    rt = LlamaRuntime(
        gguf, n_ctx=4096, n_batch=512, n_threads=args.threads, n_gpu_layers=0, invariant=True, n_seq_max=5
    )
    try:
        pools = Pools(rt, args.threads)
        ids = rt.tokenize(TEXT * 60, special=False)
        need = STATE_TOKENS + SHORT_CALLS * SHORT_TOKENS
        if len(ids) < need:
            raise SystemExit(f"{key}: the text gives {len(ids)} tokens, fewer than {need}")
        times: dict[str, dict[str, list[float]]] = {
            w: {"cold": [], "short": []} for w in ("per_call", "persistent")
        }
        logits: dict[str, np.ndarray] = {}
        run(rt, ids)  # warm the page cache and the allocator
        for _ in range(args.repeats):
            for way in ("per_call", "persistent"):
                if way == "persistent":
                    pools.attach()
                else:
                    pools.detach()
                cold, short, last = run(rt, ids)
                times[way]["cold"].append(cold)
                times[way]["short"].append(short)
                logits[way] = last
        pools.detach()
        med = {w: {k: statistics.median(v) for k, v in t.items()} for w, t in times.items()}
        return {
            "model": gguf.name,
            "runs": times,
            "medians": med,
            "cold_speedup": med["per_call"]["cold"] / med["persistent"]["cold"],
            "short_speedup": med["per_call"]["short"] / med["persistent"]["short"],
            "max_abs_logit_change": float(np.max(np.abs(logits["per_call"] - logits["persistent"]))),
        }
    finally:
        rt.close()


def render(report: dict[str, Any]) -> str:
    lines = [
        f"machine: {report['machine']}, {report['threads']} threads, load average "
        f"{report['load_average_before']} before; the served invariant context; "
        f"medians of {report['repeats']} alternations",
        "",
        f"| model | cold {STATE_TOKENS} tokens, per-call pool s | persistent s | speed-up "
        f"| {SHORT_CALLS} × {SHORT_TOKENS}-token calls, per-call s | persistent s | speed-up "
        "| max abs logit change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        m = row["medians"]
        lines.append(
            f"| {row['model']} | {m['per_call']['cold']:.3f} | {m['persistent']['cold']:.3f} "
            f"| **{row['cold_speedup']:.3f}×** | {m['per_call']['short']:.3f} "
            f"| {m['persistent']['short']:.3f} "
            f"| **{row['short_speedup']:.3f}×** | {row['max_abs_logit_change']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    run_models(__doc__ or "", bench_model, render, repeats=5)


if __name__ == "__main__":
    main()
