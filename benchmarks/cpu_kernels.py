"""Raw prefill on the loaded CPU kernels against the reference (portable AVX2) kernels, side by side.

The local wheel is compiled for the machine it is built on (``LLAMA_KERNELS=native``: AVX-512 where the
CPU has it); the reference is the same llama.cpp built the way the DLC builds it, with its portable x64
and AVX2 (``haswell``) CPU plugins (``scripts.golden.reference_library``), the kernels the stand-in
image runs. Each measurement is a fresh subprocess (llama.cpp is loaded once per process) that loads one
test model and times bare ``llama_decode`` calls over the same tokens in 128-token calls; the two sides
alternate, so drift on a shared machine hits both alike, and the best of the repeats counts.

Both numerics configurations are measured: ``invariant`` (weight repacking off: what the engine runs
once the probe at load proves the numerics) and ``fixed-split`` (repacking on, llama.cpp's default).

    python benchmarks/cpu_kernels.py [--models qwen gemma] [--repeats 3] [--tokens 875] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("loaded", "reference")
CONFIGS = ("invariant", "fixed-split")
TEXT = (
    "Ticket {i}: the customer reports that the invoice for order {i} was charged twice and asks for a "
    "refund; support checked the payment log, found two captures a minute apart, and escalated. "
)


def child(model: str, config: str, tokens: int, threads: int, calls: int) -> dict[str, object]:
    """Load ``model`` on the kernels this process loads and time ``calls`` prefills of ``tokens``."""
    from semif_adapter.engine import kernels
    from semif_adapter.engine.llama_backend import PREFIX_SEQ, LlamaRuntime
    from semif_adapter.model.demo_models import ensure_model

    runtime = LlamaRuntime(
        ensure_model(model),
        n_ctx=tokens + 64,
        n_batch=128,
        n_threads=threads,
        n_gpu_layers=0,
        invariant=config == "invariant",
        n_seq_max=2,
    )
    try:
        text = "".join(TEXT.format(i=i) for i in range(tokens // 8))
        ids = runtime.tokenize(text, False)[:tokens]
        if len(ids) < tokens:
            raise SystemExit(f"the text gave {len(ids)} tokens, fewer than {tokens}")
        seconds = []
        for _ in range(calls + 1):  # the first warms caches and threads
            runtime.clear()
            t0 = time.perf_counter()
            runtime.decode(ids, 0, PREFIX_SEQ, want_logits=True, chunk_size=128)
            runtime.last_logits()
            seconds.append(time.perf_counter() - t0)
        return {
            "variant": kernels.cpu_variant(runtime.cpu_features),
            "features": runtime.cpu_features,
            "library": runtime.cpu_library,
            "weight_buffers": runtime.weight_buffers,
            "seconds": seconds[1:],
        }
    finally:
        runtime.close()


def run_side(side: str, model: str, config: str, args: argparse.Namespace, lib: Path) -> dict:
    from scripts.golden import library_env

    env = library_env(lib) if side == "reference" else dict(os.environ)
    cmd = [sys.executable, "-m", "benchmarks.cpu_kernels", "--child", model, config]
    cmd += ["--tokens", str(args.tokens), "--threads", str(args.threads), "--calls", str(args.calls)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} {model} {config} failed:\n{done.stderr[-3000:]}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    from semif_adapter.settings import available_cores

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two sides")
    parser.add_argument("--calls", type=int, default=1, help="timed prefills per subprocess")
    parser.add_argument("--tokens", type=int, default=875)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.tokens, args.threads, args.calls)))
        return 0

    from scripts.golden import reference_library

    lib = reference_library()
    rows = []
    for model in args.models:
        for config in args.configs:
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for _ in range(args.repeats):
                for side in SIDES:
                    runs[side].append(run_side(side, model, config, args, lib))
            best = {side: min(s for r in runs[side] for s in r["seconds"]) for side in SIDES}
            rows.append(
                {
                    "model": model,
                    "config": config,
                    "tokens": args.tokens,
                    "sides": {
                        side: {k: v for k, v in runs[side][0].items() if k != "seconds"}
                        | {"seconds": [s for r in runs[side] for s in r["seconds"]], "best_s": best[side]}
                        for side in SIDES
                    },
                    "speedup": best["reference"] / best["loaded"],
                }
            )
    print(
        f"machine: {platform.machine()}, {args.threads} threads; {args.tokens}-token prefill in 128-token "
        f"calls; best of {args.repeats} alternations"
    )
    print("| model | numerics | loaded kernels | s | reference kernels | s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        loaded, reference = r["sides"]["loaded"], r["sides"]["reference"]
        print(
            f"| {r['model']} | {r['config']} | {loaded['variant']} ({loaded['library']}) "
            f"| {loaded['best_s']:.3f} | {reference['variant']} ({reference['library']}) "
            f"| {reference['best_s']:.3f} "
            f"| **{r['speedup']:.2f}×** |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
