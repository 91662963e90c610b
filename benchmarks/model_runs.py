"""The command line and report of a benchmark that runs each test model in turn: ``--models``,
``--threads``, ``--repeats`` and ``--json`` (the report, with the rendered Markdown beside it)."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_models(
    doc: str,
    bench_model: Callable[[str, argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    repeats: int,
) -> None:
    """Parse the command line, run ``bench_model`` for each model, print ``render``'s text and write the
    JSON report and the text beside it when ``--json`` names a file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=["qwen", "gemma"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "threads": args.threads,
        "repeats": args.repeats,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "models": [bench_model(key, args) for key in args.models],
    }
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    text = render(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        args.json.with_suffix(".md").write_text(text)


def machine_line(report: dict[str, Any]) -> str:
    """The report's first line: where and under what load it ran."""
    return (
        f"machine: {report['machine']}, {report['threads']} threads, load average "
        f"{report['load_average_before']} before, {report['load_average_after']} after"
    )
