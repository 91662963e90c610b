#!/usr/bin/env python3
"""Benchmark a decision endpoint on labelled tasks (same as ``semif-adapter benchmark``).

scripts/benchmark.py tests/data/decision-devset.jsonl --url http://localhost:8080 --name "CPU"
scripts/benchmark.py --compare reports/cpu.json reports/gpu.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from semif_adapter.eval.cli import benchmark_main

if __name__ == "__main__":
    sys.exit(benchmark_main())
