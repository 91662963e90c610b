"""The request JSON reader against plain parsers, side by side in one run, on ~6 MB bodies.

Four body shapes at the default 6 MiB body limit: one decision whose state is one long text (the
common large body; once as Python's json.dumps writes it, non-ASCII as \\u escapes, once as raw
UTF-8), 64 decisions × 255 options (the largest valid decision body by count), and one
decision whose state is a JSON array of small records (object- and number-heavy). For each: the
median of ``--repeats`` parses with ``json.loads`` (what the app used before), ``read_json`` (the
reader with every limit checked), and, when installed, ``orjson.loads`` and ``msgspec.json.decode``
(neither is a dependency; they show what a faster parser alone would give, without duplicate-key,
64-bit integer or configurable depth checks).

    python benchmarks/json_reader.py [--repeats 7] [--out benchmarks/results/json_reader-2cpu.md]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semif_adapter.http.json_reader import read_json

LIMIT = 6 * 1024 * 1024
WORDS = ["charged", "twice", "refund", "seat", "invoice", "ticket", "é", "😀", "queue", "urgent"]


def _fill(build: Callable[[int], Any], unit: int, ascii_only: bool = True) -> bytes:
    """The largest body of ``build(n)`` under the limit (n grows in steps of ``unit``)."""

    def dump(n: int) -> bytes:
        return json.dumps(build(n), ensure_ascii=ascii_only).encode()

    count = unit
    while len(dump(count + unit)) < LIMIT:
        count += unit
    return dump(count)


def _one(state: Any) -> dict[str, Any]:
    return {
        "decision": {"id": "d", "state": state, "question": "Who?", "options": [{"id": "a"}, {"id": "b"}]}
    }


def bodies() -> dict[str, bytes]:
    def text_state(n: int) -> dict[str, Any]:
        return _one(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n)))

    def many_options(n: int) -> dict[str, Any]:
        options = [{"id": f"option-{j}", "description": "x" * n} for j in range(255)]
        decisions = [
            {"id": f"d{i}", "state": "s", "question": "Which?", "options": options} for i in range(64)
        ]
        return {"decisions": decisions}

    def records(n: int) -> dict[str, Any]:
        row = {"ts": 1_700_000_000, "value": 0.25, "host": "web-1", "ok": True}
        return _one([{**row, "ts": row["ts"] + i, "value": i / 7, "host": f"web-{i % 97}"} for i in range(n)])

    return {
        "one long text state, \\u escapes": _fill(text_state, 50_000),
        "one long text state, raw UTF-8": _fill(text_state, 50_000, ascii_only=False),
        "64 decisions x 255 options": _fill(many_options, 16),
        "state of small records": _fill(records, 5_000),
    }


def parsers() -> dict[str, Callable[[bytes], Any]]:
    found: dict[str, Callable[[bytes], Any]] = {"json.loads": json.loads, "read_json (all limits)": read_json}
    for name, attribute in (("orjson", "loads"), ("msgspec", "json.decode")):
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        for part in attribute.split("."):
            module = getattr(module, part)
        found[f"{name}.{attribute}"] = module
    return found


def median_ms(parse: Callable[[bytes], Any], body: bytes, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        parse(body)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    lines = [
        f"JSON reader benchmark — {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, median of {args.repeats}",
        "",
        "| body | bytes | parser | ms | ÷ json.loads |",
        "|---|---:|---|---:|---:|",
    ]
    for shape, body in bodies().items():
        baseline = None
        for name, parse in parsers().items():
            assert json.loads(body) == parse(body), f"{name} read {shape} differently"
            ms = median_ms(parse, body, args.repeats)
            baseline = baseline or ms
            lines.append(f"| {shape} | {len(body):,} | {name} | {ms:.1f} | {ms / baseline:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
