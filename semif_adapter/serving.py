"""The decision service: owns the engine's lifecycle, readiness and admission.

Handlers never touch the engine directly: they await :meth:`DecisionService.score`, which admits
the request (or refuses it with a fast 503), runs the engine on its own thread, and keeps
``/ping`` honest — healthy only after load and warm-up, unhealthy once the engine has failed.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from semif_adapter import request_scope
from semif_adapter.admission import Admission
from semif_adapter.engine.deadline import SHUTTING_DOWN, ClientDisconnected, Deadline, DeadlineExceeded
from semif_adapter.errors import EngineFailure, ModelBusy, NotReady, SemifError
from semif_adapter.metrics import Metrics
from semif_adapter.protocol import BatchResult, Decision, ModelInfo
from semif_adapter.settings import Settings
from semif_adapter.throughput import Throughput

log = logging.getLogger("semif_adapter.serving")

WARMUP = Decision(
    id="warmup",
    state="Service start-up check.",
    question="Is the service ready?",
    options=[{"id": "yes"}, {"id": "no"}],
)


class Engine(Protocol):
    model_info: ModelInfo

    @property
    def max_options(self) -> int: ...

    def score(self, decisions: Sequence[Decision], cancel: Deadline | None = None) -> BatchResult: ...
    def reset_prefix_cache(self) -> None: ...
    def close(self) -> None: ...


class GroupFailed(Exception):
    """The engine refused a decision of group ``index`` of a :meth:`DecisionService.score_groups` call
    with ``error`` (its ``loc`` names the decision): the route names the body line it came from."""

    def __init__(self, index: int, error: SemifError) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


class Phase(str, enum.Enum):
    loading = "loading"
    ready = "ready"
    failed = "failed"
    stopping = "stopping"


@dataclass
class Scored:
    """An engine batch plus what the request log and metrics need."""

    batch: BatchResult
    queue_wait_s: float
    engine_s: float


class DecisionService:
    def __init__(
        self,
        settings: Settings,
        engine_factory: Callable[[], Engine],
        metrics: Metrics,
        *,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._engine_factory = engine_factory
        self._on_fatal = on_fatal
        self.engine: Engine | None = None
        self.phase = Phase.loading
        self.failure: str | None = None
        self.admission = Admission(
            settings.max_queue,
            settings.retry_after_s,
            settings.engine_nice,
            batch_wait_s=settings.batch_wait_ms / 1000,
        )
        metrics.in_flight.set_function(lambda: self.admission.admitted)
        self._in_flight: set[Deadline] = set()  # running and queued requests' tokens
        self.throughput = Throughput()
        metrics.throughput.set_function(lambda: self.throughput.tokens_per_s or 0.0)
        metrics.watch_prefix_cache(self._prefix_cache_stats)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load and warm up on the engine thread, so the event loop keeps answering /ping (503)."""
        started = time.perf_counter()
        try:
            self.engine = await self.admission.run_exclusive(self._engine_factory)
            if self.settings.warmup:
                await self.admission.run_exclusive(self._warm_up)
        except Exception as exc:
            message = str(exc) if isinstance(exc, SemifError) else f"{type(exc).__name__}: {exc}"
            self._fail(f"model load failed: {message}")
            return
        self.admission.set_max_batch(getattr(self.engine, "max_batch_requests", 1))
        self.metrics.max_batch_requests.set(self.admission.max_batch)
        self.phase = Phase.ready
        self.metrics.ready.set(1)
        info = self.engine.model_info
        self.metrics.record_numerics(
            info.numerics,
            info.numerics_min_piece,
            info.numerics_pad_limit,
            info.batch_sequences,
            info.kv_layout,
        )
        self.metrics.record_scoring(info.scoring.model_dump())
        self.metrics.record_kernels(info.kernels.model_dump())
        log.info(
            "model ready",
            extra={
                "model_file": info.file,
                "architecture": info.architecture,
                "sha256": info.sha256,
                "n_ctx": info.n_ctx,
                "n_threads": info.n_threads,
                "n_gpu_layers": info.n_gpu_layers,
                "fork_mode": info.fork_mode,
                "numerics": info.numerics,
                "numerics_reason": info.numerics_reason,
                "numerics_pad_limit": info.numerics_pad_limit,
                "batch_sequences": info.batch_sequences,
                "kv_layout": info.kv_layout,
                "max_batch_requests": info.max_batch_requests,
                "scoring_version": info.scoring.version,
                "scoring": info.scoring.model_dump(),
                "kernels": info.kernels.model_dump(),
                "load_seconds": round(time.perf_counter() - started, 3),
            },
        )

    def _warm_up(self) -> None:
        assert self.engine is not None
        self.engine.score([WARMUP])
        self.engine.reset_prefix_cache()

    def _fail(self, reason: str) -> None:
        self.phase = Phase.failed
        self.failure = reason
        self.metrics.ready.set(0)
        log.error(reason)
        if self._on_fatal is not None:
            self._on_fatal(reason)

    def begin_shutdown(self) -> None:
        """A stop signal arrived: /ping turns 503 and new requests are refused; running ones go on."""
        if self.phase is not Phase.failed:
            self.phase = Phase.stopping
        self.metrics.ready.set(0)

    def abort_in_flight(self) -> int:
        """The grace period ended: stop every running or queued request at its next check point (each
        gets a retryable 503 ``shutting_down``); returns how many were stopped."""
        tokens = list(self._in_flight)
        for token in tokens:
            token.cancel(SHUTTING_DOWN)
        if tokens:
            log.warning("grace period over: aborting %d request(s) still in flight", len(tokens))
        return len(tokens)

    async def shutdown(self) -> None:
        """Refuse new work, let the running operation finish, then free the model."""
        if self.phase is not Phase.failed:
            self.phase = Phase.stopping
        self.metrics.ready.set(0)
        await self.admission.drain()
        self.admission.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # --- queries -------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.phase is Phase.ready

    @property
    def model_info(self) -> ModelInfo | None:
        return self.engine.model_info if self.engine is not None else None

    @property
    def served_model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        info = self.model_info
        return info.name if info is not None else "semif-model"

    def _require_ready(self) -> Engine:
        if self.phase is not Phase.ready or self.engine is None:
            detail = {
                Phase.loading: "the model is still loading",
                Phase.failed: f"the engine has failed: {self.failure}",
                Phase.stopping: "the server is shutting down",
            }.get(self.phase, "not ready")
            raise NotReady(detail)
        return self.engine

    # --- scoring ---------------------------------------------------------------------------------
    async def score(self, decisions: Sequence[Decision]) -> BatchResult:
        return (await self.score_timed(decisions)).batch

    async def score_timed(self, decisions: Sequence[Decision]) -> Scored:
        """One request's decisions, decoded together with the other requests waiting when the engine
        frees up (``Admission.run_batched``; in invariant numerics their calls are shared)."""
        self._require_ready()

        async def submit(cancel: Deadline) -> tuple[list[BatchResult], float, float]:
            (batch, engine_s), waited = await self.admission.run_batched(
                self._score_batch, (decisions, cancel)
            )
            return [batch], waited, engine_s

        batches, waited, engine_s = await self._admit(submit)
        return Scored(batches[0], waited, engine_s)

    def _score_batch(
        self, items: Sequence[tuple[Sequence[Decision], Deadline]]
    ) -> list[tuple[BatchResult, float] | BaseException]:
        """On the engine thread: the requests waiting together, each its result (and the batch's engine
        seconds) or the error that ended it."""
        engine = self.engine
        assert engine is not None
        started = time.perf_counter()
        self.metrics.batch_requests.observe(len(items))
        many = getattr(engine, "score_many", None)  # stand-in engines may score one request at a time
        outcomes = many(list(items)) if many is not None else [_scored(engine, d, c) for d, c in items]
        elapsed = time.perf_counter() - started
        return [o if isinstance(o, BaseException) else (o, elapsed) for o in outcomes]

    async def score_groups(
        self, groups: Sequence[Sequence[Decision]]
    ) -> tuple[list[BatchResult], float, float]:
        """Several same-state groups as ONE admitted operation (jsonlines bodies)."""
        engine = self._require_ready()

        def run(cancel: Deadline) -> list[BatchResult]:
            many = getattr(engine, "score_many", None)  # the groups decoded together where it can
            if many is not None:
                outcomes = many([(group, cancel) for group in groups])
            else:
                outcomes = [_scored(engine, group, cancel) for group in groups]
            batches = []
            for index, outcome in enumerate(outcomes):
                if isinstance(outcome, SemifError) and outcome.loc:  # about a decision: name its line
                    raise GroupFailed(index, outcome) from outcome
                if isinstance(outcome, BaseException):  # a deadline, a disconnect, a fault: as it is
                    raise outcome
                batches.append(outcome)
            return batches

        async def submit(cancel: Deadline) -> tuple[list[BatchResult], float, float]:
            def timed() -> tuple[list[BatchResult], float]:
                t0 = time.perf_counter()
                value = run(cancel)
                return value, time.perf_counter() - t0

            (batches, engine_s), waited = await self.admission.run(timed)
            return batches, waited, engine_s

        return await self._admit(submit)

    def _deadline(self) -> tuple[Deadline, request_scope.RequestScope | None]:
        """The request's cancel token: its HTTP scope's deadline, else the server's (direct callers)."""
        scope = request_scope.current()
        limit = scope.limit_s if scope is not None else (self.settings.request_timeout_s or None)
        started = scope.started if scope is not None else None
        return Deadline(limit, started=started, estimate=self.throughput.seconds_for), scope

    async def _admit(
        self, submit: Callable[[Deadline], Awaitable[tuple[list[BatchResult], float, float]]]
    ) -> tuple[list[BatchResult], float, float]:
        """Admit one request (or refuse it with the fast 503) and await its work under its deadline."""
        try:
            self.admission.refuse_if_full()  # the busy answer stays fast: no deadline machinery for it
        except ModelBusy:
            self.metrics.busy_rejections.inc()
            raise
        deadline, scope = self._deadline()
        self._in_flight.add(deadline)
        try:
            async with request_scope.guard(deadline, scope):
                batches, waited, engine_s = await submit(deadline)
        except ModelBusy:
            self.metrics.busy_rejections.inc()
            raise
        except DeadlineExceeded:
            self.metrics.deadline_exceeded.labels("refused" if deadline.refused else "aborted").inc()
            raise
        except ClientDisconnected:
            self.metrics.client_disconnects.inc()
            raise
        except EngineFailure:
            self.metrics.engine_errors.inc()
            await self._check_health()
            raise
        finally:
            self._in_flight.discard(deadline)
            self.throughput.observe(deadline.tokens_done, deadline.decode_seconds)
        self.metrics.queue_wait.observe(waited)
        self.metrics.engine_seconds.observe(engine_s)
        for batch in batches:
            self.metrics.decisions.inc(batch.timing.decisions)
            self.metrics.input_tokens.inc(batch.timing.input_tokens)
            self.metrics.record_prefill(batch.timing.prefix_tokens, batch.timing.prefix_reused_tokens)
        return batches, waited, engine_s

    def _prefix_cache_stats(self) -> object | None:
        stats = getattr(self.engine, "prefix_cache_stats", None)  # stand-in engines have no cache
        return stats() if callable(stats) else None

    async def _check_health(self) -> None:
        """After an engine failure, probe once: a scorer that cannot score the probe is dead."""
        if self.engine is None or self.phase is not Phase.ready:
            return
        try:
            await self.admission.run_exclusive(self._warm_up)
        except Exception as exc:
            self._fail(f"engine failed its health probe after an error: {exc}")


def _scored(engine: Engine, decisions: Sequence[Decision], cancel: Deadline) -> BatchResult | BaseException:
    try:
        return engine.score(decisions, cancel=cancel)
    except Exception as exc:  # handed to the request's waiter, which raises it
        return exc
