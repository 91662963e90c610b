"""Prometheus metrics, on a registry per app so several apps (tests) never collide."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "semif_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "semif_request_seconds", "HTTP request latency", ["route"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.engine_seconds = Histogram(
            "semif_engine_seconds", "Engine time per operation", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "semif_queue_wait_seconds", "Time waiting for the engine", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.decisions = Counter("semif_decisions", "Decisions scored", registry=r)
        self.input_tokens = Counter("semif_input_tokens", "Prompt tokens decoded or reused", registry=r)
        self.prefill_tokens = Counter("semif_prefill_tokens", "Prefix tokens actually prefilled", registry=r)
        self.reused_tokens = Counter(
            "semif_prefix_reused_tokens", "Prefix tokens reused (kept prefix or prefix cache)", registry=r
        )
        self.busy_rejections = Counter("semif_busy_rejections", "Requests refused with 503 busy", registry=r)
        self.engine_errors = Counter("semif_engine_errors", "Engine failures", registry=r)
        self.deadline_exceeded = Counter(
            "semif_deadline_exceeded",
            "Requests stopped by their deadline: refused up front or aborted mid-work",
            ["stage"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "semif_client_disconnects", "Engine work aborted because the caller left", registry=r
        )
        self.throughput = Gauge(
            "semif_decode_tokens_per_second",
            "Measured decode throughput behind deadline refusals (0 until warmed up)",
            registry=r,
        )
        self.ready = Gauge("semif_ready", "1 when /ping is healthy", registry=r)
        self.in_flight = Gauge(
            "semif_engine_admitted", "Requests running or waiting for the engine", registry=r
        )
        self.batch_requests = Histogram(
            "semif_batch_requests",
            "Requests decoded together per engine batch (shared llama_decode calls in invariant numerics)",
            buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64),
            registry=r,
        )
        self.max_batch_requests = Gauge(
            "semif_max_batch_requests", "Requests the engine decodes together at most", registry=r
        )
        self._identity_gauges(r)

    def _identity_gauges(self, r: CollectorRegistry) -> None:
        """What fixes the numbers: the numerics, the scoring version and the CPU kernels (each 1)."""
        self.numerics = Gauge(
            "semif_numerics",
            "1 for the numerics the engine runs (invariant: proven by the probe at load; fixed-split), "
            "with the shortest safe piece, the filler a run may be padded with, the decisions decoded "
            "per call and the KV layout",
            ["mode", "min_piece", "pad_limit", "batch_sequences", "kv_layout"],
            registry=r,
        )
        self.scoring = Gauge(
            "semif_scoring_version",
            "1 for the scoring version every result carries, with its parts (what fixes the numbers)",
            ["version", "prompt", "split", "numerics", "llama_cpp", "model"],
            registry=r,
        )
        self.kernels = Gauge(
            "semif_cpu_kernels",
            "1 for the CPU kernels llama.cpp runs: variant, backend library, reported features, and the "
            "buffer types the weights were loaded into",
            ["variant", "library", "features", "weight_buffers"],
            registry=r,
        )

    def record_kernels(self, kernels: Mapping[str, Any]) -> None:
        """``model.kernels``: lists as space-separated label values, a missing library as ""."""
        self.kernels.labels(
            kernels["variant"],
            kernels["library"] or "",
            " ".join(kernels["features"]),
            " ".join(kernels["weight_buffers"]),
        ).set(1)

    def record_scoring(self, parts: dict[str, str]) -> None:
        self.scoring.labels(**parts).set(1)

    def record_numerics(
        self, mode: str, min_piece: int, pad_limit: int, batch_sequences: int, kv_layout: str = "streams"
    ) -> None:
        self.numerics.labels(mode, str(min_piece), str(pad_limit), str(batch_sequences), kv_layout).set(1)

    def record_prefill(self, prefix_tokens: int, reused_tokens: int) -> None:
        self.prefill_tokens.inc(prefix_tokens - reused_tokens)
        self.reused_tokens.inc(reused_tokens)

    def watch_prefix_cache(self, stats: Callable[[], Any]) -> None:
        """Export the engine's prefix-cache counters and size, read at scrape time."""
        self.registry.register(_PrefixCacheCollector(stats))


class _PrefixCacheCollector:
    _COUNTERS = (
        ("hits", "Prefix-cache lookups that restored a saved state"),
        ("misses", "Prefix-cache lookups that found no usable state"),
        ("evictions", "Saved prefix states evicted to stay within the limits"),
        ("resident", "Prefills that continued the prefix the context still held, cut back in place"),
    )
    _GAUGES = (
        ("entries", "Saved prefix states held"),
        ("tokens", "Prefix tokens held in saved states"),
        ("bytes", "Host memory held by saved prefix states"),
    )

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        current = self._stats()
        for name, text in self._COUNTERS:
            yield CounterMetricFamily(
                f"semif_prefix_cache_{name}", text, value=getattr(current, name) if current else 0
            )
        for name, text in self._GAUGES:
            yield GaugeMetricFamily(
                f"semif_prefix_cache_{name}", text, value=getattr(current, name) if current else 0
            )
