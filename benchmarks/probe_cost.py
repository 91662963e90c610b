"""What the numerics probe adds to a cold start, per model and configuration.

The probe (``numerics.probe``, ``numerics.probe_tiled``) decodes one prompt of real decisions several ways
before the engine serves anything. Its verdict is kept per library file, model file and configuration
(``SEMIF_NUMERICS_PROBE_CACHE``), so only a start without a kept verdict pays for it: every fresh
container, every new endpoint instance. This benchmark loads the engine with the served defaults
(``EngineSettings``) in each configuration an operator can choose — the stream layout with flash
attention off (the default) and on, and the tiled layout — once with an empty verdict cache (the probe
runs) and once with the verdict it kept, alternating, in one process; the difference is the probe's cost.

    python -m benchmarks.probe_cost [--models qwen gemma] [--repeats 2] [--json F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.model_runs import machine_line, run_models
from semif_adapter.engine import DecisionEngine
from semif_adapter.model.demo_models import ensure_model
from semif_adapter.settings import EngineSettings

CONFIGS: dict[str, dict[str, Any]] = {
    "streams": {},
    "streams, flash attention": {"flash_attention": True},
    "tiled": {"kv_layout": "tiled"},
}


def load_seconds(settings: EngineSettings, cache_home: Path) -> tuple[float, DecisionEngine]:
    """One engine load with the verdict cache under ``cache_home``; the engine stays open."""
    os.environ["XDG_CACHE_HOME"] = str(cache_home)
    started = time.perf_counter()
    engine = DecisionEngine.load(settings)
    return time.perf_counter() - started, engine


def bench_model(key: str, args: argparse.Namespace) -> dict[str, Any]:
    gguf = ensure_model(key)
    saved_home = os.environ.get("XDG_CACHE_HOME")
    rows = []
    try:
        for name, extra in CONFIGS.items():
            settings = EngineSettings(gguf_path=gguf, n_threads=args.threads, **extra)
            probed, kept, verdicts = [], [], []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as home:
                    seconds, engine = load_seconds(settings, Path(home))  # empty cache: the probe runs
                    probed.append(seconds)
                    verdicts.append((engine.verdict.mode, engine.verdict.reason, engine.verdict.cached))
                    engine.close()
                    seconds, engine = load_seconds(settings, Path(home))  # the verdict just kept
                    kept.append(seconds)
                    if not engine.verdict.cached:
                        raise SystemExit(f"{gguf.name} {name}: the second load probed again")
                    kv_layout = engine.model_info.kv_layout
                    engine.close()
            rows.append(
                {
                    "config": name,
                    "kv_layout": kv_layout,
                    "mode": verdicts[0][0],
                    "reason": verdicts[0][1],
                    "probed_loads_s": probed,
                    "kept_verdict_loads_s": kept,
                    "probe_s": statistics.median(probed) - statistics.median(kept),
                }
            )
    finally:
        if saved_home is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved_home
    return {"model": gguf.name, "configs": rows}


def render(report: dict[str, Any]) -> str:
    lines = [
        f"{machine_line(report)}; served defaults (EngineSettings), "
        f"medians of {report['repeats']} alternations",
        "",
        "| model | configuration | runs as | load, probe runs s | load, verdict kept s | probe s | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        for c in row["configs"]:
            lines.append(
                f"| {row['model']} | {c['config']} | {c['mode']}, {c['kv_layout']} "
                f"| {statistics.median(c['probed_loads_s']):.2f} "
                f"| {statistics.median(c['kept_verdict_loads_s']):.2f} | **{c['probe_s']:.1f}** "
                f"| {c['reason']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_models(__doc__ or "", bench_model, render, repeats=2)
