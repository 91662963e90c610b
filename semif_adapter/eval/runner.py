"""Send every task to a target (sequentially by default, as the seed benchmark did) and collect rows.

Timing rule: ``latency_s`` is the round trip of the attempt that succeeded. Failed 503 attempts and
the backoff sleeps between them are added to ``retry_wait_s`` instead, so a retried request is never
counted in the latency distribution twice and an overloaded endpoint shows up as retries, not as a
fat latency tail.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from semif_adapter.eval.chat import ChatReplyError
from semif_adapter.eval.mapping import AnswerError
from semif_adapter.eval.results import RunResult, TaskRow, make_row
from semif_adapter.eval.targets import Retryable, Target, TargetError
from semif_adapter.eval.tasks import Task


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter: attempt k waits ``U(0.5, 1) * min(cap, base * 2**k)``.

    A server's ``Retry-After`` raises the wait (still capped); jitter keeps concurrent workers from
    retrying in lock-step.
    """

    max_attempts: int = 8
    base_s: float = 0.25
    cap_s: float = 8.0

    def delay(self, retry_index: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        backoff = min(self.cap_s, self.base_s * (2**retry_index))
        wait = backoff * rng.uniform(0.5, 1.0)
        if retry_after_s is not None:
            wait = max(wait, retry_after_s)
        return float(min(self.cap_s, wait))


class _Jitter:
    """A seeded RNG shared by worker threads (guarded so draws stay reproducible per call order)."""

    def __init__(self, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def delay(self, policy: RetryPolicy, retry_index: int, retry_after_s: float | None) -> float:
        with self._lock:
            return policy.delay(retry_index, self._rng, retry_after_s)


def run_task(
    task: Task,
    target: Target,
    policy: RetryPolicy,
    jitter: _Jitter,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> TaskRow:
    """One task, with retries on 503; any failure becomes an invalid row with its reason."""
    retries = 0
    retry_wait = 0.0
    attempt = 0

    def failed(status: int | None, error: str) -> TaskRow:
        return make_row(
            task,
            None,
            latency_s=None,
            retry_wait_s=retry_wait,
            retries_503=retries,
            attempts=attempt,
            status=status,
            error=error,
        )

    while True:
        attempt += 1
        started = clock()
        try:
            payload = target.request(task)
        except Retryable as exc:
            retry_wait += clock() - started
            retries += 1
            if attempt >= policy.max_attempts:
                return failed(exc.status, f"still 503 after {attempt} attempts: {exc}")
            pause = jitter.delay(policy, retries - 1, exc.retry_after_s)
            sleep(pause)
            retry_wait += pause
            continue
        except TargetError as exc:
            return failed(exc.status, str(exc))
        latency = clock() - started
        break
    common: dict[str, Any] = {
        "latency_s": latency,
        "retry_wait_s": retry_wait,
        "retries_503": retries,
        "attempts": attempt,
        "status": 200,
    }
    try:
        prediction = target.parse(task, payload)
    except AnswerError as exc:
        row = make_row(task, None, error=f"unusable answer: {exc}", **common)
        row.latency_s = latency  # the server did answer; keep its time for debugging
        if isinstance(exc, ChatReplyError):
            row.reply = exc.reply
        return row
    return make_row(task, prediction, **common)


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="task", dynamic_ncols=True)


def run_benchmark(
    tasks: Sequence[Task],
    target: Target,
    concurrency: int = 1,
    *,
    retry: RetryPolicy | None = None,
    seed: int | None = 0,
    name: str | None = None,
    progress: bool = False,
    config: dict[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RunResult:
    """Run ``tasks`` against ``target`` and return rows (in task order) plus totals."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not tasks:
        raise ValueError("no tasks to run")
    policy = retry or RetryPolicy()
    jitter = _Jitter(seed)
    bar = _progress(len(tasks), progress, target.name)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows: list[TaskRow | None] = [None] * len(tasks)
    t0 = time.perf_counter()
    try:
        if concurrency == 1:
            for i, task in enumerate(tasks):
                rows[i] = run_task(task, target, policy, jitter, sleep=sleep)
                if bar is not None:
                    bar.update(1)
        else:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = {
                    pool.submit(run_task, task, target, policy, jitter, sleep=sleep): i
                    for i, task in enumerate(tasks)
                }
                for future in as_completed(futures):
                    rows[futures[future]] = future.result()
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    run_config = {
        "concurrency": concurrency,
        "retry": {"max_attempts": policy.max_attempts, "base_s": policy.base_s, "cap_s": policy.cap_s},
        **(config or {}),
    }
    return RunResult.from_rows(
        name or target.name,
        [row for row in rows if row is not None],
        wall,
        target=target.describe(),
        config=run_config,
        started_at=started_at,
    )
