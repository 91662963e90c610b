"""Runtime settings, read from ``SEMIF_*`` environment variables (pydantic-settings).

Two parts: :class:`EngineSettings` is all the engine receives (model file, context, decoding, limits it
enforces); :class:`ServerSettings` is the HTTP side (binding, bodies, queue, deadlines, auth).
:class:`Settings` is both, as the server reads them at start-up. A bad value stops start-up with
pydantic's message naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def available_cores() -> int:
    """Cores this process may run on (honours cgroup/affinity limits, unlike ``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


SEMIF_ENV = SettingsConfigDict(env_prefix="SEMIF_", extra="ignore", frozen=True)


class EngineSettings(BaseSettings):
    """What the decision engine uses: the model file, context, decoding and the limits it enforces."""

    model_config = SEMIF_ENV

    gguf_path: Path | None = Field(default=None, description="GGUF file to serve; overrides discovery.")
    n_ctx: int = Field(default=8192, ge=256, description="Context size in tokens (state + one decision).")
    n_threads: int = Field(default_factory=available_cores, ge=1, description="CPU threads for decoding.")
    n_batch: int = Field(default=512, ge=32, description="Tokens per llama_decode call (fixed split).")
    n_gpu_layers: int = Field(default=0, ge=-1, description="Layers to offload: 0 = CPU, -1 = all.")
    fork_mode: Literal["auto", "copy", "state"] = Field(
        default="auto",
        description="How a decision branches off the shared prefix: seq copy, or state save/restore.",
    )
    numerics: Literal["auto", "invariant", "fixed-split"] = Field(
        default="auto",
        description="auto: batch-invariant kernels when the probe at load proves them on this library and "
        "model (decisions share decode calls), else the fixed split; invariant: refuse to start unless "
        "proven; fixed-split: one decode call per decision, prefix in fixed blocks.",
    )
    batch_sequences: int = Field(
        default=4,
        ge=1,
        le=63,
        description="Invariant numerics: decisions decoded together in one llama_decode call, each in a KV "
        "stream of its own (the context holds 1 + this many streams of n_ctx cells).",
    )
    max_batch_requests: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Invariant numerics: requests decoded together in shared llama_decode calls (those "
        "waiting when the engine frees up); more wait up to SEMIF_MAX_QUEUE, then get 503. A batch holds "
        "at most n_ctx tokens of prefixes; a longer request runs alone. The fixed split runs one at a time.",
    )
    flash_attention: bool = Field(
        default=False,
        description="Flash attention in invariant numerics: every sequence's piece of a call is padded to "
        "its CPU kernel's 64-row tile (fewer rows take a per-row path with other numbers), as the probe "
        "proves at load; attention-only models only (hybrid and recurrent ones keep the fixed split).",
    )
    kv_layout: Literal["streams", "tiled"] = Field(
        default="streams",
        description="Invariant numerics' KV layout: streams = one KV stream per sequence (flash attention "
        "as SEMIF_FLASH_ATTENTION says); tiled = ONE unified stream with flash attention, each decision's "
        "cells from a 64-cell tile line (no per-sequence padding; attention-only models, proven by its own "
        "probe at load, else the streams layout). Requests share a call here only when each brings fewer "
        "than 64 rows (short agent turns), and never on a sliding-window model.",
    )
    cpu_extra_buffers: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="llama.cpp's extra weight buffers (repacking; AMX on CPUs that advertise it) in the "
        "fixed split: auto = on unless the CPU advertises AMX and the build has AMX kernels (that buffer "
        "type crashed on a VM); "
        "invariant numerics always run without them.",
    )
    numerics_probe_cache: bool = Field(
        default=True,
        description="Keep the numerics probe's verdict per llama.cpp library and model file (in the user's "
        "cache folder) so a restart skips the probe.",
    )
    prefix_block_tokens: int = Field(
        default=128,
        ge=16,
        description="Prefix decode chunk and unit of prefix reuse (capped at n_batch); changing it "
        "changes the split, so probabilities may move in the last digits.",
    )
    prefix_cache_tokens: int = Field(
        default=65536, ge=0, description="Tokens of saved prefix states kept across requests; 0 disables."
    )
    prefix_cache_bytes: int = Field(
        default=1 << 30, ge=0, description="Host memory for saved prefix states, in bytes; 0 disables."
    )
    max_decisions: int = Field(default=64, ge=1, le=4096, description="Decisions per request.")
    max_options: int = Field(default=255, ge=2, le=255, description="Options per decision.")
    max_request_tokens: int = Field(
        default=65536, ge=256, description="Prefix once plus every decision's suffix, per request."
    )
    verify_manifest: bool = Field(
        default=True, description="Check model-manifest.json size/sha256 next to the GGUF at start-up."
    )
    calibration_path: Path | None = Field(
        default=None, description="calibration.json; default: the one in the model directory, if any."
    )
    stale_calibration: Literal["refuse", "mark"] = Field(
        default="refuse",
        description="A calibration fitted under another scoring version: refuse to start, or serve it "
        "with every result marked calibration_stale.",
    )
    llama_abi_record: Path | None = Field(
        default=None,
        description="llama-abi.json the image build verified; start-up refuses another libllama version.",
    )

    @field_validator("gguf_path", "calibration_path", "llama_abi_record", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value in ("", None) else value


class ServerSettings(BaseSettings):
    """The server around the engine: model discovery, start-up, HTTP limits, deadlines, auth."""

    model_config = SEMIF_ENV

    # --- start-up ----------------------------------------------------------------------------
    model_dir: Path = Field(
        default=Path("/opt/ml/model"), description="Where SageMaker extracts model.tar.gz."
    )
    warmup: bool = Field(default=True, description="Score one decision before /ping turns healthy.")

    # --- HTTP ------------------------------------------------------------------------------
    host: str = Field(default="0.0.0.0", description="Bind address.")
    port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        validation_alias=AliasChoices("SAGEMAKER_BIND_TO_PORT", "SEMIF_PORT"),
        description="Listen port (SageMaker's SAGEMAKER_BIND_TO_PORT wins).",
    )
    max_queue: int = Field(default=0, ge=0, le=1024, description="Requests allowed to wait for the engine.")
    batch_wait_ms: float = Field(
        default=10.0,
        ge=0,
        le=1000,
        description="Invariant numerics: once requests have arrived together (within the last minute), a "
        "request that finds the engine idle waits up to this long for others to share its batch "
        "(requests sent at once arrive milliseconds apart); 0: never wait.",
    )
    engine_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="How much lower the engine's CPU priority is than the HTTP layer's (Linux nice), so "
        "/ping and busy 503s are answered promptly while decoding fills every core; 0 = the same.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Time allowed for a request's headers to arrive; then the connection is closed.",
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description="Open connections allowed; one more gets 503 too_many_connections and is closed. "
        "Default: half of what the open-file limit leaves (the soft limit is raised to the hard one).",
    )
    max_body_bytes: int = Field(default=6 * 1024 * 1024, ge=1024, description="Request body limit (decoded).")
    body_timeout_s: float = Field(default=10.0, gt=0, description="Time allowed to receive a request body.")
    max_json_depth: int = Field(
        default=64,
        ge=2,
        le=256,
        description="Nesting limit for JSON bodies: arrays/objects, the top level counting as one.",
    )
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After on 503 busy responses.")
    request_timeout_s: float = Field(
        default=55.0,
        ge=0,
        description="Deadline per request from arrival (under SageMaker's 60 s); 0 = none. "
        "A request may shorten it with the X-Semif-Timeout-S header.",
    )
    shutdown_grace_s: float = Field(
        default=20.0,
        ge=0,
        description="After SIGTERM, how long running requests may finish before they are aborted with a "
        "retryable 503 shutting_down (SageMaker sends SIGKILL 30 s after SIGTERM).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    # --- Jev / System One compatibility -----------------------------------------------------
    served_model_name: str | None = Field(
        default=None, description="Name reported in answers; default from the manifest or GGUF file."
    )
    model_aliases: list[str] = Field(
        default_factory=lambda: ["jev-latest", "jev-preview"],
        description="Extra names accepted in the request's 'model' field (JSON list).",
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer key required on every route but /ping (outside SageMaker, where IAM guards "
        "InvokeEndpoint and no Authorization header can be sent); unset = no auth.",
    )
    metrics_open: bool = Field(default=False, description="Serve /metrics without the API key.")


class Settings(ServerSettings, EngineSettings):
    """Everything the server reads at start-up; the engine gets only :meth:`for_engine`."""

    def for_engine(self) -> EngineSettings:
        """The engine's part, without the server's (API key, binding, HTTP limits)."""
        return EngineSettings.model_construct(
            _fields_set=self.model_fields_set & set(EngineSettings.model_fields),
            **{name: getattr(self, name) for name in EngineSettings.model_fields},
        )
