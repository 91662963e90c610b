"""From decoded readouts to the results a caller gets: probabilities, diagnostics, hashes and timings.

The prefill's time is charged to the first decision that needed it, and each decision's time is its
share of the calls that decoded it; every result names the model and the scoring version it answered
under.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from semif_adapter.engine.branches import Decoded
from semif_adapter.engine.planner import Planned
from semif_adapter.engine.prompt import PROMPT_VERSION, PromptHasher
from semif_adapter.protocol import (
    BatchResult,
    BatchTiming,
    CalibrationApplied,
    Decision,
    DecisionResult,
    DecisionTiming,
    ModelInfo,
)

#: A decision's probabilities from its option logits, and the calibration applied (if any).
Probabilities = Callable[[Decision, np.ndarray], tuple[list[float], CalibrationApplied | None]]


class ResultBuilder:
    """Builds one request's results; ``piece`` spells a token, ``probabilities`` applies calibration."""

    def __init__(
        self,
        model_info: ModelInfo,
        piece: Callable[[int], str],
        probabilities: Probabilities,
        calibration_stale: bool,
    ) -> None:
        self.model_info = model_info
        self.piece = piece
        self.probabilities = probabilities
        self.calibration_stale = calibration_stale

    def build(
        self, prefix_tokens: list[int], planned: list[Planned], decoded: Decoded, started: float
    ) -> BatchResult:
        prefill_seconds, reused_tokens, forwards = decoded
        n_prefix = len(prefix_tokens)
        hasher = PromptHasher(prefix_tokens)
        results: list[DecisionResult] = []
        for index, (plan, (readout, forward_seconds)) in enumerate(zip(planned, forwards, strict=True)):
            t_forward = time.perf_counter()
            probabilities, applied = self.probabilities(plan.decision, readout.option_logits)
            t_end = time.perf_counter()
            first = index == 0  # the prefill is charged to the first decision that needed it
            results.append(
                DecisionResult(
                    id=plan.decision.id,
                    option_ids=[option.id for option in plan.decision.options],
                    probabilities=probabilities,
                    option_logits=[float(x) for x in readout.option_logits],
                    input_tokens=n_prefix + len(plan.suffix_tokens),
                    allowed_token_mass=readout.allowed_token_mass,
                    argmax_token=self.piece(readout.argmax_token),
                    argmax_is_option=readout.argmax_token in plan.label_ids,
                    labels=plan.labels,
                    prompt_sha256=hasher.hexdigest(plan.suffix_tokens),
                    prompt_version=PROMPT_VERSION,
                    scoring_version=self.model_info.scoring.version,
                    calibration=applied,
                    calibration_stale=self.calibration_stale,
                    timing=DecisionTiming(
                        total_seconds=(t_end - t_forward)
                        + forward_seconds
                        + (prefill_seconds if first else 0.0),
                        prefill_seconds=prefill_seconds if first else 0.0,
                        suffix_forward_seconds=forward_seconds,
                        readout_seconds=t_end - t_forward,
                        prefix_tokens=n_prefix,
                        suffix_tokens=len(plan.suffix_tokens),
                        prefix_reused=reused_tokens == n_prefix or not first,
                        prefix_reused_tokens=n_prefix if not first else reused_tokens,
                    ),
                    model=self.model_info,
                )
            )
        return BatchResult(
            results=results,
            timing=BatchTiming(
                total_seconds=time.perf_counter() - started,
                prefill_seconds=prefill_seconds,
                suffix_forward_seconds=sum(seconds for _, seconds in forwards),
                prefix_tokens=n_prefix,
                prefix_reused=reused_tokens == n_prefix,
                prefix_reused_tokens=reused_tokens,
                decisions=len(planned),
                input_tokens=n_prefix + sum(len(p.suffix_tokens) for p in planned),
            ),
        )
