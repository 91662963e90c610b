"""Wire schema of the decision API (``/invocations``), shared by the HTTP layer and the engine.

Field names follow the reference SemIf sample so its callers can switch without code changes.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from semif_adapter.errors import DecisionValidationError

NonEmptyStr = Annotated[str, Field(min_length=1)]
MAX_ID_CHARS = 1024  # a decision id is echoed back, never read by the model: no reason for megabytes
QuestionType = Literal["choice", "noul", "score"]


class Option(BaseModel):
    """One declared option. ``description`` is what the model reads; without one it reads the id."""

    model_config = ConfigDict(extra="ignore")

    id: NonEmptyStr
    description: str | None = None

    @property
    def shown_text(self) -> str:
        return self.description if self.description else self.id


class Decision(BaseModel):
    """A decision: one question about a state, answered by a probability per option."""

    model_config = ConfigDict(extra="ignore")

    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
    state: str | dict[str, Any] | list[Any] = Field(
        description="Unstructured state: text, or a JSON object/array rendered as compact JSON."
    )
    question: NonEmptyStr
    options: list[Option] = Field(min_length=2)
    type: QuestionType = Field(
        default="choice",
        description="Question family; only selects which calibration temperature applies.",
    )

    @field_validator("options")
    @classmethod
    def _unique_option_ids(cls, options: list[Option]) -> list[Option]:
        seen: set[str] = set()
        for index, option in enumerate(options):
            if option.id in seen:
                raise ValueError(f"duplicate option id {option.id!r} at index {index}")
            seen.add(option.id)
        return options

    @model_validator(mode="after")
    def _utf8_encodable(self) -> Decision:
        """JSON can carry lone surrogates (``"\\ud800"``); the tokenizer needs real UTF-8 text."""
        fields = [("state", self.state_text), ("question", self.question)]
        for index, option in enumerate(self.options):
            fields.append((f"options[{index}].id", option.id))
            fields.append((f"options[{index}].description", option.description or ""))
        for name, text in fields:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"{name} contains an unpaired surrogate at position {exc.start}") from exc
        return self

    @cached_property
    def state_text(self) -> str:
        """Rendered once per decision: a multi-megabyte JSON state is compared, grouped and tokenized."""
        return state_to_text(self.state)


def state_to_text(state: str | dict[str, Any] | list[Any]) -> str:
    """Structured states are shown to the model as compact JSON, keys in the caller's order."""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, separators=(",", ":"))


class DecisionTiming(BaseModel):
    total_seconds: float
    prefill_seconds: float = Field(description="Shared state prefix prefill (0 when reused).")
    suffix_forward_seconds: float
    readout_seconds: float
    prefix_tokens: int
    suffix_tokens: int
    prefix_reused: bool = Field(description="True when this decision reused a prefix prefilled earlier.")
    prefix_reused_tokens: int = Field(
        default=0, description="Prefix tokens not decoded for this decision (kept prefix or prefix cache)."
    )


class ScoringVersion(BaseModel):
    """What fixes a result's numbers (``engine.scoring``): compare ``version``; the parts say what moved."""

    version: str = Field(description="One value over the five parts: equal versions, equal numbers.")
    prompt: str = Field(description="Prompt version and a hash of the rendered prompt text.")
    split: str = Field(description="Split-rule revision and a hash of token ids, boundary and cuts.")
    numerics: str = Field(description="fixed-split.b<call> or invariant.p<min piece>; the readout revision.")
    llama_cpp: str = Field(description="llama.cpp commit, device and CPU kernel variant, feature hash.")
    model: str = Field(description="The GGUF's sha256, first 16 hex digits.")


class CpuKernels(BaseModel):
    """The CPU kernels the loaded llama.cpp runs (``engine.kernels``): answers differ between them."""

    variant: str = Field(
        description="avx512, avx2, avx, sse, neon, sve or generic (+amx where AMX kernels are compiled in)."
    )
    features: list[str] = Field(description="What llama_print_system_info reports switched on.")
    library: str | None = Field(
        description="The CPU backend's file: libggml-cpu-<variant>.so where the build loads the best of "
        "several plugins (the DLC), libggml-cpu.so for a single build; null where none is mapped."
    )
    extra_buffers: bool = Field(description="Weights may take llama.cpp's extra buffer types (repacking).")
    extra_buffers_reason: str
    weight_buffers: list[str] = Field(
        description="Buffer types the weights were loaded into (CPU, CPU_Mapped, CPU_REPACK, AMX, CUDA0…)."
    )


class ModelInfo(BaseModel):
    name: str = Field(description="From model-manifest.json when present, else the GGUF file stem.")
    file: str
    sha256: str = Field(description="GGUF sha256: from its manifest, a verified demo pin, or hashed at load.")
    architecture: str | None
    n_ctx: int
    n_threads: int
    n_batch: int
    n_gpu_layers: int
    gpu_offload: bool
    chat_template: bool
    llama_cpp_python_version: str
    fork_mode: str
    numerics: str = Field(
        default="fixed-split",
        description="invariant: batch-invariant kernels, proven by the probe at load (decisions share decode "
        "calls); fixed-split: every prompt decoded in the same chunks, each decision alone.",
    )
    numerics_reason: str = Field(
        default="", description="Why: what the numerics probe found, or the setting."
    )
    numerics_min_piece: int = Field(
        default=0, description="Invariant numerics: the shortest piece of a sequence a decode call may hold."
    )
    numerics_pad_limit: int = Field(
        default=0,
        description="Invariant numerics: the filler tokens a run may be padded with to share a decode call "
        "with longer ones (0: the probe did not prove padding safe, or the fixed split).",
    )
    kv_layout: str = Field(
        default="streams",
        description="Invariant numerics' KV layout: streams (one KV stream per sequence) or tiled (one "
        "unified stream with flash attention, each decision's cells from a 64-cell tile line).",
    )
    batch_sequences: int = Field(
        default=1, description="Decisions decoded together in one llama_decode call."
    )
    max_batch_requests: int = Field(
        default=1, description="Requests decoded together in shared llama_decode calls (1: one at a time)."
    )
    scoring: ScoringVersion = Field(description="What fixes the numbers; results carry its ``version``.")
    kernels: CpuKernels = Field(description="The CPU kernels llama.cpp runs and where the weights live.")


class CalibrationApplied(BaseModel):
    temperature: float
    key: str


class DecisionResult(BaseModel):
    id: str
    option_ids: list[str]
    probabilities: list[float]
    option_logits: list[float]
    input_tokens: int
    allowed_token_mass: float = Field(
        description="Share of full-vocabulary probability on the option labels (reliability signal)."
    )
    argmax_token: str = Field(description="The full-vocabulary argmax token, as text.")
    argmax_is_option: bool
    labels: list[str]
    prompt_sha256: str
    prompt_version: str
    scoring_version: str = Field(
        description="Equal values, equal numbers for the same decision: see model.scoring for its parts."
    )
    calibration: CalibrationApplied | None = None
    calibration_stale: bool = Field(
        default=False,
        description="The calibration was fitted under another scoring (SEMIF_STALE_CALIBRATION=mark).",
    )
    timing: DecisionTiming
    model: ModelInfo


class BatchTiming(BaseModel):
    total_seconds: float
    prefill_seconds: float
    suffix_forward_seconds: float
    prefix_tokens: int
    prefix_reused: bool
    prefix_reused_tokens: int = Field(default=0, description="Prefix tokens restored instead of decoded.")
    decisions: int
    input_tokens: int


class BatchResult(BaseModel):
    results: list[DecisionResult]
    timing: BatchTiming


class InvocationRequest(BaseModel):
    """Exactly one of ``decision`` or ``decisions`` (all with the same state)."""

    model_config = ConfigDict(extra="ignore")

    decision: Decision | None = None
    decisions: list[Decision] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> InvocationRequest:
        if (self.decision is None) == (self.decisions is None):
            raise ValueError("send exactly one of 'decision' (object) or 'decisions' (non-empty list)")
        return self

    @property
    def all_decisions(self) -> list[Decision]:
        return [self.decision] if self.decision is not None else list(self.decisions or [])


class SingleResponse(BaseModel):
    result: DecisionResult


class SharedResponse(BaseModel):
    results: list[DecisionResult]
    timing: BatchTiming


class ErrorResponse(BaseModel):
    error: str
    type: str
    retryable: bool | None = None


def check_decision_count(count: int, max_decisions: int) -> None:
    """At most ``max_decisions`` per request: counted before a single decision is validated."""
    if count > max_decisions:
        raise DecisionValidationError(
            f"{count} decisions in one request; the limit is {max_decisions}", loc=("decisions",)
        )


def check_shared_batch(decisions: list[Decision], max_decisions: int, max_options: int) -> None:
    """What a batch must satisfy beyond each decision's schema: count, unique ids, one state, option count.

    The HTTP layer runs it before asking for the engine (a bad request never waits for, or holds, the
    engine); the engine runs it again for direct callers. ``loc`` names the offending decision.
    """
    if not decisions:
        raise DecisionValidationError("at least one decision is required", loc=("decisions",))
    check_decision_count(len(decisions), max_decisions)
    seen: dict[str, int] = {}
    state = decisions[0].state_text
    for index, decision in enumerate(decisions):
        if decision.id in seen:
            raise DecisionValidationError(
                f"duplicate decision id {decision.id!r} (also at index {seen[decision.id]})",
                loc=("decisions", index, "id"),
            )
        seen[decision.id] = index
        if decision.state_text != state:
            raise DecisionValidationError(
                "all decisions in one request must have exactly the same state as decisions[0]",
                loc=("decisions", index, "state"),
            )
        if len(decision.options) > max_options:
            raise DecisionValidationError(
                f"{len(decision.options)} options; the limit is {max_options}",
                loc=("decisions", index, "options"),
            )
