"""The engine thread's CPU priority: lowered so the event loop stays responsive, never fatal."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import pytest

from semif_adapter.admission import Admission


def _thread_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _engine_thread_nice(engine_nice: int) -> int:
    async def main() -> int:
        admission = Admission(max_queue=0, retry_after_s=1, engine_nice=engine_nice)
        try:
            nice, _ = await admission.run(_thread_nice)
            return nice
        finally:
            admission.close()

    return asyncio.run(main())


def test_the_engine_thread_runs_at_a_lower_priority_than_the_event_loop() -> None:
    base = _thread_nice()
    assert _engine_thread_nice(5) == min(19, base + 5)
    assert _engine_thread_nice(0) == base
    assert _thread_nice() == base  # the caller's (event loop's) thread is left as it was


def test_a_refused_priority_change_is_logged_and_the_engine_still_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Some sandboxes refuse setpriority; that cannot be caused here, so the call is made to fail."""

    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level(logging.WARNING, logger="semif_adapter.admission"):
        assert _engine_thread_nice(10) == _thread_nice()
    assert "SEMIF_ENGINE_NICE=10" in caplog.text and "not permitted" in caplog.text
