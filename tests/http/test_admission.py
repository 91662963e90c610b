"""The engine thread's CPU priority: lowered so the event loop stays responsive, never fatal."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

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


# --- the batching window ----------------------------------------------------------------------------
class _Recorder:
    """A batch function that notes each batch it is handed and takes ``seconds`` to run it."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.batches: list[list[str]] = []

    def __call__(self, items: list[str]) -> list[str]:
        self.batches.append(list(items))
        time.sleep(self.seconds)
        return items


async def _send(admission: Admission, batch: _Recorder, names: list[str], gap: float) -> list[float]:
    """``names`` sent ``gap`` seconds apart; each one's seconds waited for the engine."""

    async def one(name: str, delay: float) -> float:
        await asyncio.sleep(delay)
        _, waited = await admission.run_batched(batch, name)
        return waited

    return list(await asyncio.gather(*(one(n, i * gap) for i, n in enumerate(names))))


def _turns(window: float, second_turn_gap: float = 0.01) -> list[list[str]]:
    """Two turns of four requests: the first sent at once (company), the second a few ms apart."""

    async def main() -> list[list[str]]:
        admission = Admission(max_queue=4, retry_after_s=1, max_batch=4, batch_wait_s=window)
        batch = _Recorder(seconds=0.1)
        try:
            await _send(admission, batch, ["a1", "b1", "c1", "d1"], 0.0)
            await _send(admission, batch, ["a2", "b2", "c2", "d2"], second_turn_gap)
        finally:
            admission.close()
        return batch.batches

    return asyncio.run(main())


def test_requests_sent_together_but_arriving_apart_share_one_batch() -> None:
    """Without a window the first arrival starts alone and the rest run after it; with one (after the
    first turn showed the requests come together) the whole turn is one batch."""
    assert _turns(window=0.0)[-2:] == [["a2"], ["b2", "c2", "d2"]]
    assert _turns(window=2.0)[-1] == ["a2", "b2", "c2", "d2"]


def test_a_full_batch_and_a_lone_caller_never_wait_for_the_window() -> None:
    async def main() -> tuple[list[float], list[float], list[list[str]]]:
        admission = Admission(max_queue=4, retry_after_s=1, max_batch=4, batch_wait_s=3.0)
        batch = _Recorder()
        try:
            lone = [w for n in ("x", "y", "z") for w in await _send(admission, batch, [n], 0.0)]
            await _send(admission, batch, ["a", "b", "c", "d"], 0.0)  # company from here on
            full = await _send(admission, batch, ["e", "f", "g", "h"], 0.0)
        finally:
            admission.close()
        return lone, full, batch.batches

    lone, full, batches = asyncio.run(main())
    assert max(lone) < 2.5  # one request at a time: no company, no window (3 s would show)
    assert max(full) < 2.5  # a batch full at max_batch is taken at once
    assert batches[:3] == [["x"], ["y"], ["z"]] and batches[-1] == ["e", "f", "g", "h"]


def test_the_window_is_bounded_from_the_head_s_arrival() -> None:
    """After company, a request with none left to come waits out the window once, then runs alone."""

    async def main() -> tuple[float, list[list[str]]]:
        admission = Admission(max_queue=4, retry_after_s=1, max_batch=4, batch_wait_s=0.3)
        batch = _Recorder()
        try:
            await _send(admission, batch, ["a", "b"], 0.0)
            (waited,) = await _send(admission, batch, ["alone"], 0.0)
        finally:
            admission.close()
        return waited, batch.batches

    waited, batches = asyncio.run(main())
    assert batches[-1] == ["alone"]
    assert 0.25 <= waited < 2.5
