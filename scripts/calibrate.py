#!/usr/bin/env python3
"""Fit per-question-type temperatures and write calibration.json (same as ``semif-adapter calibrate``).

scripts/calibrate.py --report reports/cpu.json --out calibration.json
scripts/calibrate.py my-labelled.jsonl --url http://localhost:8080 --out calibration.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from semif_adapter.eval.cli import calibrate_main

if __name__ == "__main__":
    sys.exit(calibrate_main())
