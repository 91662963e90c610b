"""Bounded admission to the single engine: one operation runs, at most ``max_queue`` wait, the rest get 503.

The slot is released when the engine's work finishes, not when the awaiting request goes away: a
client that disconnects mid-decision must not let a second operation onto the same llama.cpp context.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from semif_adapter.errors import ModelBusy

T = TypeVar("T")
log = logging.getLogger(__name__)


class Admission:
    def __init__(self, max_queue: int, retry_after_s: int, engine_nice: int = 0) -> None:
        self.capacity = 1 + max_queue
        self.retry_after_s = retry_after_s
        self._admitted = 0  # running + waiting
        self._lock = asyncio.Lock()
        # one dedicated thread: llama.cpp always runs on the same OS thread, off the event loop
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="semif-engine",
            initializer=_lower_priority,
            initargs=(engine_nice,),
        )
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def admitted(self) -> int:
        return self._admitted

    def refuse_if_full(self) -> None:
        """Raise the fast 503 when no slot is free (callers may check before preparing any work)."""
        if self._admitted >= self.capacity:
            raise ModelBusy(
                f"the model is busy ({self._admitted} request(s) admitted, capacity {self.capacity}); "
                f"retry after {self.retry_after_s} s with backoff"
            )

    async def run(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run ``fn`` on the engine thread; returns (result, seconds spent waiting for the engine)."""
        self.refuse_if_full()
        self._admitted += 1
        self._idle.clear()
        queued_at = time.perf_counter()
        released = False

        def release(_: object = None) -> None:
            nonlocal released
            if released:
                return
            released = True
            self._lock.release()
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()

        try:
            await self._lock.acquire()
        except BaseException:
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()
            raise
        waited = time.perf_counter() - queued_at
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(release)  # keep the slot until the engine is really free
            raise
        except BaseException:
            release()
            raise
        release()
        return result, waited

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run on the engine thread regardless of capacity (start-up, health probes)."""
        async with self._lock:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def drain(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _lower_priority(nice: int) -> None:
    """Lower the engine thread's CPU priority by ``nice`` (the executor's initializer).

    llama.cpp's compute threads are started from this thread and inherit its priority, so decoding
    yields to the event loop: /ping and the busy 503 stay prompt while every core decodes (Linux keeps
    nice per thread). A refusal is logged, never raised: a broken initializer would break the executor.
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.warning("could not lower the engine thread's CPU priority (SEMIF_ENGINE_NICE=%d): %s", nice, exc)
