"""Typed validation errors with field paths, budgets, fork modes, and engine failure handling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.engine import DecisionEngine, llama_backend
from semif_adapter.errors import DecisionValidationError, EngineFailure, ModelLoadError, TokenBudgetExceeded
from tests.helpers.support import engine_settings

BASE = {
    "id": "d",
    "state": "The nightly export failed twice this week.",
    "question": "Who should look at it first?",
    "options": [{"id": "data", "description": "the data team"}, {"id": "platform"}],
}


def with_(**changes: object) -> dict:
    return {**BASE, **changes}


@pytest.mark.parametrize(
    ("decisions", "loc", "needle"),
    [
        ([], ("decisions",), "at least one"),
        (
            [{k: v for k, v in BASE.items() if k != "question"}],
            ("decisions", 0, "question"),
            "Field required",
        ),
        ([with_(options=[{"id": "only"}])], ("decisions", 0, "options"), "at least 2"),
        ([with_(options=[{"id": "a"}, {"id": "a"}])], ("decisions", 0, "options"), "duplicate option id"),
        ([with_(options=[{"id": ""}, {"id": "b"}])], ("decisions", 0, "options", 0, "id"), "at least 1"),
        ([BASE, BASE], ("decisions", 1, "id"), "duplicate decision id"),
        ([BASE, with_(id="e", state="another state")], ("decisions", 1, "state"), "same state"),
        ([with_(options=[{"id": str(i)} for i in range(256)])], ("decisions", 0, "options"), "limit is 255"),
        ([with_(type="ranking")], ("decisions", 0, "type"), "Input should be"),
        ("not a list", ("decisions",), "must be a list"),
    ],
)
def test_validation_errors_name_the_field(
    gemma_engine: DecisionEngine, decisions: object, loc: tuple, needle: str
) -> None:
    with pytest.raises(DecisionValidationError) as info:
        gemma_engine.score(decisions)  # type: ignore[arg-type]
    assert info.value.loc == loc
    assert needle in info.value.message
    assert info.value.status == 400


def test_too_many_decisions(gemma_gguf: Path) -> None:
    engine = DecisionEngine.load(engine_settings(max_decisions=2), gemma_gguf)
    try:
        with pytest.raises(DecisionValidationError, match="limit is 2"):
            engine.score([BASE, with_(id="e"), with_(id="f")])
    finally:
        engine.close()


def test_decision_over_the_context_is_refused_not_truncated(gemma_engine: DecisionEngine) -> None:
    long_options = [{"id": f"o{i}", "description": "word " * 400} for i in range(12)]
    with pytest.raises(TokenBudgetExceeded) as info:
        gemma_engine.score([BASE, with_(id="big", options=long_options)])
    assert info.value.loc == ("decisions", 1) and info.value.status == 413
    assert "context holds 4096" in info.value.message
    with pytest.raises(TokenBudgetExceeded) as state_info:
        gemma_engine.score([with_(state="word " * 5000)])
    assert state_info.value.loc == ("decisions", 0, "state")
    assert gemma_engine.score([BASE]).results[0].id == "d"  # still healthy


def test_request_token_budget_counts_the_prefix_once(gemma_gguf: Path) -> None:
    engine = DecisionEngine.load(engine_settings(max_request_tokens=300), gemma_gguf)
    try:
        prefix, suffixes = engine.prompt_tokens([BASE])
        per_decision = len(suffixes[0])
        fits = (300 - len(prefix)) // per_decision
        ok = [with_(id=f"d{i}") for i in range(fits)]
        assert len(engine.score(ok).results) == fits
        with pytest.raises(TokenBudgetExceeded, match="limit is 300"):
            engine.score([*ok, with_(id="one-more")])
    finally:
        engine.close()


@pytest.fixture(scope="module")
def state_mode_engine(gemma_gguf: Path) -> Iterator[DecisionEngine]:
    engine = DecisionEngine.load(engine_settings(fork_mode="state"), gemma_gguf)
    yield engine
    engine.close()


def test_auto_mode_picks_sequence_copy(engine: DecisionEngine) -> None:
    assert engine.fork_mode == "copy"
    assert engine.model_info.fork_mode == "copy"


def test_state_fallback_matches_sequence_copy(gemma_gguf: Path, state_mode_engine: DecisionEngine) -> None:
    """State save/restore cannot run the invariant numerics (one stream per decision), so it is compared
    with sequence copy in the fixed split."""
    assert state_mode_engine.model_info.numerics == "fixed-split"
    decisions = [BASE, with_(id="e", question="Is it urgent?", options=[{"id": "yes"}, {"id": "no"}])]
    copy_engine = DecisionEngine.load(engine_settings(numerics="fixed-split"), gemma_gguf)
    try:
        copied = copy_engine.score(decisions)
    finally:
        copy_engine.close()
    restored = state_mode_engine.score(decisions)
    again = state_mode_engine.score(list(reversed(decisions)))
    for a, b in zip(copied.results, restored.results, strict=True):
        assert a.probabilities == b.probabilities
    assert [r.probabilities for r in again.results] == [r.probabilities for r in reversed(restored.results)]


def test_non_finite_logits_are_an_engine_failure(gemma_engine: DecisionEngine, monkeypatch) -> None:
    """A NaN cannot be provoked from a healthy model, so the logits view is replaced for one call."""
    poisoned = np.full(gemma_engine.runtime.n_vocab, np.nan, dtype=np.float32)
    monkeypatch.setattr(gemma_engine.runtime, "last_logits", lambda: poisoned)
    monkeypatch.setattr(gemma_engine.runtime, "logits_at", lambda row: poisoned)  # invariant numerics
    with pytest.raises(EngineFailure, match="non-finite"):
        gemma_engine.score([BASE])
    monkeypatch.undo()
    result = gemma_engine.score([BASE]).results[0]  # the context was reset and still works
    assert abs(sum(result.probabilities) - 1) < 1e-12


def test_missing_llama_symbols_are_named(monkeypatch) -> None:
    monkeypatch.setattr(
        llama_backend, "REQUIRED_SYMBOLS", (*llama_backend.REQUIRED_SYMBOLS, "llama_not_a_symbol")
    )
    with pytest.raises(ModelLoadError, match="llama_not_a_symbol"):
        llama_backend.import_llama_cpp()


def test_missing_gguf_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        DecisionEngine.load(engine_settings(), tmp_path / "absent.gguf")


def test_struct_layout_drift_is_detected() -> None:
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    llama_backend._check_struct_layout(params)  # the real library passes
    params.n_seq_max = 0x7FFF0000  # what a shifted field looks like through a stale binding
    with pytest.raises(ModelLoadError, match="ABI drift"):
        llama_backend._check_struct_layout(params)
