"""Bounded admission to the single engine: a batch of requests runs, at most ``max_queue`` more wait, the
rest get 503.

One dispatcher hands the engine thread its work. Requests for the same batch function that are waiting
when the engine frees up run together, at most ``max_batch`` of them (the engine decodes them in shared
calls, ``engine.shared_calls``); anything else (a multi-group body, a health probe) runs alone. In flight
and waiting together, at most ``max_batch + max_queue`` requests are admitted; one more is refused at
once with a retryable 503, never queued without bound.

Requests sent at once reach the server milliseconds apart, so the first would find the engine idle and
run alone. Once requests have come in company (one admitted while another was, within the last
``COMPANY_MEMORY_S``), a batch's first arrival waits up to ``batch_wait_s`` for the others
(``_gather``): the batching window. A caller that sends one request at a time never opens it.

A slot is released when the engine's work for it finishes, not when the awaiting request goes away: a
client that disconnects mid-decision must not let more work onto the same llama.cpp context. A request
that leaves while it still waits is simply taken out of the queue.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from semif_adapter.errors import ModelBusy

T = TypeVar("T")
log = logging.getLogger(__name__)

#: How long arrivals in company (a request admitted while another was) keep the batching window open.
COMPANY_MEMORY_S = 60.0

#: Runs several requests' items on the engine thread; per item its result, or the exception to raise.
BatchFn = Callable[[Sequence[Any]], Sequence[Any]]


@dataclass(eq=False)
class _Work(Generic[T]):
    """One admitted piece of engine work: a callable alone, or an item of a batch function."""

    future: asyncio.Future[Any]
    fn: Callable[[], Any] | None = None
    batch: BatchFn | None = None
    item: Any = None
    counted: bool = True
    queued_at: float = field(default_factory=time.perf_counter)
    waited: float = 0.0


class Admission:
    def __init__(
        self,
        max_queue: int,
        retry_after_s: int,
        engine_nice: int = 0,
        max_batch: int = 1,
        batch_wait_s: float = 0.0,
    ) -> None:
        self.max_queue = max_queue
        self.max_batch = max(1, max_batch)
        self.retry_after_s = retry_after_s
        self.batch_wait_s = batch_wait_s
        self._company_at = -float("inf")  # when a request last arrived while others were admitted
        self._admitted = 0  # running + waiting
        self._queue: deque[_Work[Any]] = deque()
        self._wake: asyncio.Event | None = None
        self._dispatcher: asyncio.Task[None] | None = None
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
    def capacity(self) -> int:
        return self.max_batch + self.max_queue

    @property
    def admitted(self) -> int:
        return self._admitted

    def set_max_batch(self, max_batch: int) -> None:
        """The engine says how many requests it decodes together (1 in the fixed split)."""
        self.max_batch = max(1, max_batch)

    def refuse_if_full(self) -> None:
        """Raise the fast 503 when no slot is free (callers may check before preparing any work)."""
        if self._admitted >= self.capacity:
            raise ModelBusy(
                f"the model is busy ({self._admitted} request(s) admitted, capacity {self.capacity}); "
                f"retry after {self.retry_after_s} s with backoff"
            )

    async def run(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run ``fn`` alone on the engine thread; returns (result, seconds spent waiting for the engine)."""
        return await self._submit(_Work(self._future(), fn=fn))

    async def run_batched(self, batch: BatchFn, item: Any) -> tuple[Any, float]:
        """Run ``item`` through ``batch`` together with the other items for ``batch`` waiting when the
        engine frees up; returns (its result, seconds waited)."""
        return await self._submit(_Work(self._future(), batch=batch, item=item))

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run on the engine thread ahead of the queue, regardless of capacity (start-up, health probes)."""
        work: _Work[T] = _Work(self._future(), fn=fn, counted=False)
        self._queue.appendleft(work)
        self._kick()
        return cast(T, await work.future)

    async def drain(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        self._executor.shutdown(wait=True)

    # --- the queue ---------------------------------------------------------------------------------
    @staticmethod
    def _future() -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _submit(self, work: _Work[Any]) -> tuple[Any, float]:
        self.refuse_if_full()
        if self._admitted:
            self._company_at = work.queued_at
        self._admitted += 1
        self._idle.clear()
        self._queue.append(work)
        self._kick()
        try:
            result = await asyncio.shield(work.future)
        except asyncio.CancelledError:
            if work in self._queue:  # never started: no engine work to wait for
                self._queue.remove(work)
                self._release(work)
            else:  # its outcome arrives with nobody to read it
                work.future.add_done_callback(_consume)
            raise
        return result, work.waited

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(), name="semif-dispatch")
        self._wake.set()

    def _release(self, work: _Work[Any]) -> None:
        if work.counted:
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()

    def _take(self) -> list[_Work[Any]]:
        """The next work to run: the queue's head, with the waiting items of the same batch function."""
        head = self._queue.popleft()
        if head.batch is None:
            return [head]
        taken = [head]
        for work in list(self._queue):
            if len(taken) >= self.max_batch:
                break
            if work.batch == head.batch:  # a bound method: equal, not identical, each time
                self._queue.remove(work)
                taken.append(work)
        return taken

    async def _gather(self) -> bool:
        """Hold a batch's head until ``batch_wait_s`` after its arrival while fewer than ``max_batch`` items
        of its batch function wait; True when it waited (the queue may have changed meanwhile).

        Requests sent together (agents taking their turns at once) reach the engine a few milliseconds
        apart: the first would start alone and the others would wait a whole operation for it, then run
        together without it. Only while requests have had company within ``COMPANY_MEMORY_S`` (one
        arrived while another was admitted): a caller sending one request at a time never waits, and a
        head that already waited for a busy engine past the window is taken at once."""
        head = self._queue[0]
        now = time.perf_counter()
        if head.batch is None or self.max_batch <= 1 or now - self._company_at > COMPANY_MEMORY_S:
            return False
        left = head.queued_at + self.batch_wait_s - now
        if left <= 0 or sum(w.batch == head.batch for w in self._queue) >= self.max_batch:
            return False
        assert self._wake is not None
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), left)
        except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
            pass
        return True

    async def _dispatch(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if await self._gather():
                continue  # held the head for its batch's company: look at the queue again
            taken = self._take()
            started = time.perf_counter()
            for work in taken:
                work.waited = started - work.queued_at
            head = taken[0]
            if head.batch is not None:
                call: Callable[[], Any] = functools.partial(head.batch, [w.item for w in taken])
            else:
                assert head.fn is not None
                call = head.fn
            try:
                value = await loop.run_in_executor(self._executor, call)
            except BaseException as exc:  # the engine thread raised: every piece of this work gets it
                if isinstance(exc, asyncio.CancelledError):
                    for work in taken:
                        self._release(work)
                    raise
                outcomes: Sequence[Any] = [exc] * len(taken)
                failed = True
            else:
                outcomes = value if head.batch is not None else [value]
                failed = False
            for work, outcome in zip(taken, outcomes, strict=True):
                self._release(work)
                if work.future.done():
                    continue
                if isinstance(outcome, BaseException) and (failed or head.batch is not None):
                    work.future.set_exception(outcome)
                else:
                    work.future.set_result(outcome)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


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
