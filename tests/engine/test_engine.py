"""Engine behaviour on both real models: validity, order, determinism, readout against raw decoding."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.llama_backend import PREFIX_SEQ

STATE = (
    "At 09:12 the checkout page started returning HTTP 500 for every customer. The error rate on "
    "/checkout is 100%, everywhere else 0%. No deploy happened in the last 24 hours."
)


def decision(did: str, question: str, options: list[tuple[str, str | None]], state: object = STATE) -> dict:
    return {
        "id": did,
        "state": state,
        "question": question,
        "options": [{"id": oid, "description": desc} for oid, desc in options],
    }


TEAM = decision(
    "team",
    "Which team owns this incident?",
    [("billing", "payments and refunds"), ("technical", "api and infrastructure"), ("sales", None)],
)
SEVERITY = decision("severity", "How severe is it?", [("low", None), ("high", None)])
CAUSE = decision(
    "cause",
    "What is the most likely cause?",
    [("db", "database"), ("code", "a code bug"), ("net", "network")],
)
ALL = [TEAM, SEVERITY, CAUSE]


def reference_logits(engine: DecisionEngine, request: dict) -> np.ndarray:
    """Label logits from a raw llama_decode of the suffix on the prefill's sequence, bypassing fork and
    readout code (the prefix is the engine's own prefill: its split is the chunking rule's)."""
    prefix, suffixes = engine.prompt_tokens([request])
    runtime = engine.runtime
    engine.reset_prefix_cache()
    engine.prefill.fill(prefix, cuts=engine.prefix_cuts([request]))
    runtime.decode(suffixes[0], len(prefix), PREFIX_SEQ, want_logits=True)
    logits = runtime.last_logits()[engine.label_token_ids(len(request["options"]))].astype(np.float64)
    engine.reset_prefix_cache()
    return logits


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_probabilities_are_a_distribution_in_caller_order(engine: DecisionEngine) -> None:
    result = engine.score([TEAM]).results[0]
    assert result.option_ids == ["billing", "technical", "sales"]
    assert len(result.probabilities) == len(result.option_logits) == 3
    assert math.isclose(sum(result.probabilities), 1.0, abs_tol=1e-12)
    assert all(0.0 < p < 1.0 for p in result.probabilities)
    assert 0.0 < result.allowed_token_mass <= 1.0
    assert result.labels == ["A", "B", "C"]
    assert result.input_tokens == result.timing.prefix_tokens + result.timing.suffix_tokens


def test_readout_matches_raw_decode(engine: DecisionEngine) -> None:
    expected = reference_logits(engine, TEAM)
    result = engine.score([TEAM]).results[0]
    assert np.array_equal(np.array(result.option_logits), expected)
    assert np.allclose(result.probabilities, softmax(expected), atol=1e-12)


def test_reversed_options_follow_the_caller_order(engine: DecisionEngine) -> None:
    reversed_team = {**TEAM, "options": TEAM["options"][::-1]}
    forward = engine.score([TEAM]).results[0]
    backward = engine.score([reversed_team]).results[0]
    assert backward.option_ids == forward.option_ids[::-1]
    # each probability belongs to the option shown under that label in the reversed prompt
    assert np.allclose(backward.probabilities, softmax(reference_logits(engine, reversed_team)), atol=1e-12)


def test_single_equals_shared(engine: DecisionEngine) -> None:
    engine.reset_prefix_cache()
    shared = {r.id: r for r in engine.score(ALL).results}
    for request in ALL:
        engine.reset_prefix_cache()
        alone = engine.score([request]).results[0]
        together = shared[request["id"]].probabilities
        assert max(abs(a - b) for a, b in zip(alone.probabilities, together, strict=True)) <= 1e-6
        assert alone.probabilities == shared[request["id"]].probabilities  # in fact bit-identical
        assert alone.prompt_sha256 == shared[request["id"]].prompt_sha256


def test_order_and_count_of_other_decisions_do_not_matter(engine: DecisionEngine) -> None:
    baseline = {r.id: r.probabilities for r in engine.score(ALL).results}
    rng = random.Random(7)
    for _ in range(3):
        subset = rng.sample(ALL, k=rng.randint(1, len(ALL)))
        rng.shuffle(subset)
        results = engine.score(subset).results
        assert [r.id for r in results] == [d["id"] for d in subset]
        for r in results:
            assert r.probabilities == baseline[r.id]


def test_repeatable_with_and_without_prefix_reuse(engine: DecisionEngine) -> None:
    engine.reset_prefix_cache()
    cold = engine.score(ALL)
    warm = engine.score(ALL)
    assert warm.timing.prefill_seconds == 0.0 and warm.results[0].timing.prefix_reused
    assert cold.results[0].timing.prefix_reused is False
    for a, b in zip(cold.results, warm.results, strict=True):
        assert a.probabilities == b.probabilities and a.option_logits == b.option_logits


def test_shared_request_prefills_the_state_once(engine: DecisionEngine) -> None:
    engine.reset_prefix_cache()
    batch = engine.score(ALL)
    suffixes = [r.timing.suffix_tokens for r in batch.results]
    assert batch.timing.input_tokens == batch.timing.prefix_tokens + sum(suffixes)
    assert [r.timing.prefix_reused for r in batch.results] == [False, True, True]


@pytest.mark.parametrize("n_options", [2, 26, 255])
def test_many_options(engine: DecisionEngine, n_options: int) -> None:
    options = [(f"opt-{i}", f"choice number {i}") for i in range(n_options)]
    result = engine.score([decision("many", "Pick one.", options)]).results[0]
    assert len(result.probabilities) == n_options
    assert math.isclose(sum(result.probabilities), 1.0, abs_tol=1e-9)
    assert len(set(result.labels)) == n_options
    assert result.labels == list(engine.labels.labels[:n_options])
    assert result.labels[: min(n_options, 26)] == [chr(65 + i) for i in range(min(n_options, 26))]
    assert all(len(label) == 2 for label in result.labels[26:])


def test_structured_state_is_rendered_as_compact_json(engine: DecisionEngine) -> None:
    structured = {"ticket": {"id": 7, "text": "charged twice"}, "tags": ["billing"]}
    as_text = '{"ticket":{"id":7,"text":"charged twice"},"tags":["billing"]}'
    a = engine.score([decision("s", "Who owns it?", [("x", None), ("y", None)], structured)]).results[0]
    b = engine.score([decision("s", "Who owns it?", [("x", None), ("y", None)], as_text)]).results[0]
    assert a.probabilities == b.probabilities
