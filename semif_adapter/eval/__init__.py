"""Benchmark and calibration harness: labelled tasks → any endpoint → accuracy, calibration, latency.

Entry points: :func:`run_benchmark` (programmatic), ``semif-adapter benchmark`` / ``semif-adapter calibrate``
and the ``benchmark`` / ``calibrate`` subcommands (see :mod:`semif_adapter.eval.cli`). Names are
resolved lazily so that registering the subcommands does not import httpx or matplotlib.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "RetryPolicy": "semif_adapter.eval.runner",
    "run_benchmark": "semif_adapter.eval.runner",
    "RunResult": "semif_adapter.eval.results",
    "TaskRow": "semif_adapter.eval.results",
    "Task": "semif_adapter.eval.tasks",
    "load_tasks": "semif_adapter.eval.tasks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
