"""Several requests in one decode in the tiled layout (``engine.tiled_batches``): agents' short warm turns
share one tiled call, a region per request, and every answer is bit-identical to the same turn scored
alone on a cold engine without a prefix cache; a turn that would not gain runs alone; one request's
abort leaves the others' answers.

Qwen2.5-Coder-0.5B in the tiled layout (gemma-3-270m's sliding window takes one request per call: its
refusal is in ``test_tile_regions.py``). The spy on ``decode_regions`` shows the sharing happened, so
a test cannot pass by running everything alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.deadline import ClientDisconnected, Deadline
from semif_adapter.errors import SemifError
from semif_adapter.protocol import BatchResult
from tests.helpers.support import engine_settings

AGENTS = 4
Answers = dict[str, tuple[list[float], list[float]]]


def turn(agent: int, t: int) -> list[dict]:
    """Agent ``agent``'s turn ``t``: one decision about its transcript of ``t`` events (an event is ~10
    tokens and the decision's suffix ~25, so a warm turn comes to ~35 rows: short; the transcripts stay
    inside the first 128-token block, so each turn reuses the last one's state)."""
    events = [{"k": k, "rows": agent * 13 + k} for k in range(t)]
    options = [{"id": "retry"}, {"id": "stop"}] if agent % 2 else [{"id": "yes"}, {"id": "no"}]
    return [{"id": f"a{agent}t{t}", "state": events, "question": "Go on?", "options": options}]


def answers(outcomes: Sequence[BatchResult | SemifError]) -> Answers:
    found: Answers = {}
    for outcome in outcomes:
        assert isinstance(outcome, BatchResult), outcome
        found.update({r.id: (r.probabilities, r.option_logits) for r in outcome.results})
    return found


@pytest.fixture(scope="module")
def engine(qwen_tiled_engine: DecisionEngine) -> DecisionEngine:
    assert qwen_tiled_engine.tiled and qwen_tiled_engine.tiled_batches is not None
    assert qwen_tiled_engine.max_batch_requests == 4 == qwen_tiled_engine.model_info.max_batch_requests
    return qwen_tiled_engine


@pytest.fixture(scope="module")
def cold(qwen_gguf: Path) -> Iterator[DecisionEngine]:
    """The reference: the same layout without a prefix cache, one request at a time."""
    engine = DecisionEngine.load(engine_settings(kv_layout="tiled", prefix_cache_tokens=0), qwen_gguf)
    assert engine.tiled
    yield engine
    engine.close()


def alone(cold: DecisionEngine, requests: Sequence[list[dict]]) -> Answers:
    return answers([cold.score(r) for r in requests])


class RegionLog:
    """How many requests each ``decode_regions`` call held; ``before`` runs first (to cancel a member
    while the call is under way)."""

    def __init__(self, engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch, before=None) -> None:  # type: ignore[no-untyped-def]
        self.sizes: list[int] = []
        real = engine.runtime.decode_regions  # type: ignore[attr-defined]

        def logged(regions, cancel=None):  # type: ignore[no-untyped-def]
            self.sizes.append(len(regions))
            if before is not None:
                before()
            return real(regions, cancel)

        monkeypatch.setattr(engine.runtime, "decode_regions", logged)


def warm(engine: DecisionEngine, t: int, agents: Sequence[int] = range(AGENTS)) -> None:
    """The agents' turn ``t - 1`` one at a time, then turn ``t`` together: the state at each one's turn
    ``t`` goes into the prefix cache (a lone short turn files none, see ``Prefill.file_whole``)."""
    for a in agents:
        assert isinstance(engine.score(turn(a, t - 1)), BatchResult)
    answers(engine.score_many([(turn(a, t), None) for a in agents]))


def test_short_warm_turns_share_a_call_and_answer_as_alone(
    engine: DecisionEngine, cold: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.reset_prefix_cache()
    warm(engine, 3)
    log = RegionLog(engine, monkeypatch)
    for t in (4, 5, 6):
        batch = [turn(a, t) for a in (range(AGENTS) if t != 5 else reversed(range(AGENTS)))]
        outcomes = engine.score_many([(r, None) for r in batch])
        assert answers(outcomes) == alone(cold, batch), f"turn {t}"
        timing = outcomes[0].timing  # type: ignore[union-attr]
        assert timing.prefix_reused_tokens > 0  # a warm turn: its transcript came from the cache
    assert log.sizes == [AGENTS] * 3  # each turn of the four agents was one call


def test_a_turn_that_would_not_gain_runs_alone_beside_shared_ones(
    engine: DecisionEngine, cold: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request about a new plain-text state (all of it to decode: far more than 64 rows) runs alone;
    the three warm agents share a call."""
    engine.reset_prefix_cache()
    warm(engine, 3, agents=range(3))
    log = RegionLog(engine, monkeypatch)
    state = " ".join(f"Ticket {i} waits on the vendor's reply since day {i * 3}." for i in range(12))
    new = [{"id": "new", "state": state, "question": "Escalate?", "options": [{"id": "yes"}, {"id": "no"}]}]
    batch = [new, turn(0, 4), turn(1, 4), turn(2, 4)]
    assert engine.tiled_batches is not None
    eligible = [engine.tiled_batches.eligible(engine.batches.plan(r, None)) for r in batch]
    assert eligible == [False, True, True, True]
    assert answers(engine.score_many([(r, None) for r in batch])) == alone(cold, batch)
    assert log.sizes == [3]


def test_one_requests_abort_leaves_the_others_answers(
    engine: DecisionEngine, cold: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.reset_prefix_cache()
    warm(engine, 4)
    batch = [turn(a, 5) for a in range(AGENTS)]
    expected = alone(cold, batch)
    leaving = Deadline(None)
    gone = Deadline(None)
    gone.cancel()  # left before its turn
    RegionLog(engine, monkeypatch, before=leaving.cancel)  # leaves while the shared call runs
    cancels = [None, leaving, gone, None]
    outcomes = engine.score_many(list(zip(batch, cancels, strict=True)))
    assert isinstance(outcomes[1], ClientDisconnected) and isinstance(outcomes[2], ClientDisconnected)
    assert answers([outcomes[0], outcomes[3]]) == {k: v for k, v in expected.items() if k in ("a0t5", "a3t5")}
    monkeypatch.undo()
    warm(engine, 4)
    assert answers(engine.score_many([(r, None) for r in batch])) == expected  # nothing left behind


def test_a_call_every_member_left_is_aborted(
    engine: DecisionEngine, cold: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.reset_prefix_cache()
    warm(engine, 4, agents=range(2))
    batch = [turn(0, 5), turn(1, 5)]
    tokens = [Deadline(None), Deadline(None)]

    def everyone_leaves() -> None:
        for token in tokens:
            token.cancel()

    log = RegionLog(engine, monkeypatch, before=everyone_leaves)
    outcomes = engine.score_many(list(zip(batch, tokens, strict=True)))
    assert log.sizes == [2]
    assert all(isinstance(o, ClientDisconnected) for o in outcomes)
    monkeypatch.undo()
    assert answers(engine.score_many([(r, None) for r in batch])) == alone(cold, batch)


def test_a_request_longer_than_judged_runs_alone(
    engine: DecisionEngine, cold: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request judged short whose prefill left more than 64 rows (the prefix cache evicted its state
    meanwhile: forced here, as eviction between the judgement and the fill cannot be timed) runs alone;
    the others still share their call."""
    engine.reset_prefix_cache()
    warm(engine, 4, agents=range(2))
    state = " ".join(f"Ticket {i} waits on the vendor's reply since day {i * 3}." for i in range(12))
    new = [{"id": "new", "state": state, "question": "Escalate?", "options": [{"id": "yes"}, {"id": "no"}]}]
    batch = [turn(0, 5), new, turn(1, 5)]
    assert engine.tiled_batches is not None
    monkeypatch.setattr(engine.tiled_batches, "eligible", lambda job: True)
    log = RegionLog(engine, monkeypatch)
    assert answers(engine.score_many([(r, None) for r in batch])) == alone(cold, batch)
    assert log.sizes == [2]
