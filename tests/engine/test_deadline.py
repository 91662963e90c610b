"""Aborting an engine (gemma; ``SEMIF_TEST_ENGINES``) mid-prefill, mid-suffix, between decisions, in a graph.

After every abort the next answers must be bit-identical to answers from an engine that never saw
the aborted request. Aborts are triggered by token counts, not by timers, so nothing here depends on
the machine's speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.deadline import DEADLINE, ClientDisconnected, Deadline, DeadlineExceeded, Joint
from semif_adapter.engine.llama_backend import PREFIX_SEQ
from semif_adapter.protocol import BatchResult, Decision
from semif_adapter.throughput import Throughput
from tests.helpers.support import engines_under_test

LONG_STATE = " ".join(
    f"Ticket {i} from the {['north', 'south', 'east', 'west'][i % 4]} office was escalated twice."
    for i in range(90)
)


def _decisions(state: str, n: int, n_options: int) -> list[Decision]:
    return [
        Decision(
            id=f"d{k}",
            state=state,
            question=f"Which team should take item {k}?",
            options=[
                {"id": f"team-{j}", "description": f"the team for case family {j}"} for j in range(n_options)
            ],
        )
        for k in range(n)
    ]


class StopAfter(Deadline):
    """Cancels itself once ``tokens`` were decoded: the abort lands at the very next check point."""

    def __init__(self, tokens: int, reason: str = DEADLINE) -> None:
        super().__init__(None)
        self.after = tokens
        self.stop_reason = reason

    def advance(self, tokens: int, seconds: float) -> None:
        super().advance(tokens, seconds)
        if self.tokens_done >= self.after:
            self.cancel(self.stop_reason)


class GraphOnly(Deadline):
    """Skips the Python check points, so only llama.cpp's abort callback can stop the decode."""

    def check(self) -> None:
        pass


def _numbers(batch: BatchResult) -> list[tuple[list[float], list[float]]]:
    return [(r.probabilities, r.option_logits) for r in batch.results]


def _clean(engine: DecisionEngine, decisions: Sequence[Decision]) -> BatchResult:
    engine.reset_prefix_cache()
    return engine.score(decisions)


@pytest.fixture(scope="module", params=engines_under_test(["gemma"]))
def abort_engine(request: pytest.FixtureRequest) -> DecisionEngine:
    """gemma by default; ``SEMIF_TEST_ENGINES`` runs the aborts on other models (the GPU check)."""
    return request.getfixturevalue(f"{request.param}_engine")


@pytest.fixture(scope="module")
def cases(abort_engine: DecisionEngine) -> dict[str, tuple[list[Decision], BatchResult]]:
    """Each request with its answer from clean memory (the reference for every comparison)."""
    requests = {
        "long_state": _decisions(LONG_STATE, 2, 3),
        "long_suffix": _decisions("A short state about office moves.", 1, 70),
        "other": _decisions("The printer on floor 3 is out of toner.", 2, 4),
    }
    return {name: (decisions, _clean(abort_engine, decisions)) for name, decisions in requests.items()}


def _assert_unchanged(
    engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]], *names: str
) -> None:
    """The aborted request again and a different one: each as from clean memory."""
    for name in (*names, "other"):
        decisions, reference = cases[name]
        assert _numbers(engine.score(decisions)) == _numbers(reference)


def test_abort_mid_prefill_drops_the_half_written_prefix(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, _ = cases["long_state"]
    prefix, suffixes = abort_engine.prompt_tokens(decisions)
    assert len(prefix) > 2 * abort_engine.runtime.n_batch  # the prefix takes several decode calls
    abort_engine.reset_prefix_cache()
    token = StopAfter(abort_engine.runtime.n_batch)
    with pytest.raises(DeadlineExceeded) as aborted:
        abort_engine.score(decisions, cancel=token)
    assert token.tokens_done == abort_engine.runtime.n_batch < len(prefix)
    assert aborted.value.extra == {
        "tokens_done": token.tokens_done,
        "tokens_needed": len(prefix) + sum(map(len, suffixes)),
        "limit_s": None,
    }
    assert abort_engine.prefill.cached_prefix is None  # complete or dropped, never half-written
    _assert_unchanged(abort_engine, cases, "long_state")


def test_abort_mid_suffix(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, _ = cases["long_suffix"]
    prefix, suffixes = abort_engine.prompt_tokens(decisions)
    assert len(suffixes[0]) > abort_engine.runtime.n_batch  # the suffix takes several decode calls
    abort_engine.reset_prefix_cache()
    token = StopAfter(len(prefix) + 1, reason="disconnected")
    with pytest.raises(ClientDisconnected):
        abort_engine.score(decisions, cancel=token)
    assert len(prefix) < token.tokens_done < len(prefix) + len(suffixes[0])
    _assert_unchanged(abort_engine, cases, "long_suffix")


def test_abort_between_decisions_keeps_the_prefix_reused_answers_identical(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, reference = cases["other"]
    prefix, suffixes = abort_engine.prompt_tokens(decisions)
    abort_engine.reset_prefix_cache()
    if abort_engine.invariant:  # the decisions share one call: the abort lands after the prefill, before it
        token = StopAfter(1)
        with pytest.raises(DeadlineExceeded):
            abort_engine.score(decisions, cancel=token)
        assert 0 < token.tokens_done <= len(prefix)
    else:
        token = StopAfter(len(prefix) + len(suffixes[0]))
        with pytest.raises(DeadlineExceeded):
            abort_engine.score(decisions, cancel=token)
        assert token.tokens_done == len(prefix) + len(suffixes[0])  # decision 0 done, 1 never started
    # the same request again, then again with its prefix reused: both as from clean memory
    assert _numbers(abort_engine.score(decisions)) == _numbers(reference)
    assert abort_engine.score(decisions).timing.prefix_reused
    _assert_unchanged(abort_engine, cases)


def test_llama_abort_callback_stops_a_decode_between_graph_nodes(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, _ = cases["long_state"]
    prefix, _ = abort_engine.prompt_tokens(decisions)
    abort_engine.reset_prefix_cache()
    token = GraphOnly(None)
    token.cancel(DEADLINE)
    with pytest.raises(DeadlineExceeded):
        abort_engine.runtime.decode(prefix, 0, PREFIX_SEQ, want_logits=False, cancel=token)
    assert token.tokens_done == 0  # llama_decode itself returned "aborted" on the first chunk
    abort_engine.reset_prefix_cache()
    _assert_unchanged(abort_engine, cases, "long_state")


def test_a_cancelled_token_stops_before_any_decode(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, reference = cases["other"]
    abort_engine.score(decisions)  # prefix kept
    token = Deadline(None)
    token.cancel()
    with pytest.raises(ClientDisconnected):
        abort_engine.score(decisions, cancel=token)
    assert token.tokens_done == 0
    assert _numbers(abort_engine.score(decisions)) == _numbers(reference)


def test_refusal_uses_the_measured_throughput_and_decodes_nothing(
    abort_engine: DecisionEngine, cases: dict[str, tuple[list[Decision], BatchResult]]
) -> None:
    decisions, _ = cases["long_state"]
    prefix, suffixes = abort_engine.prompt_tokens(decisions)
    needed = len(prefix) + sum(map(len, suffixes))
    rate = Throughput(warmup_tokens=1000)
    assert rate.seconds_for(needed) is None  # no figure during warm-up: nothing is refused
    rate.observe(100, 1.0)  # too small to count
    rate.observe(1000, 10.0)  # 100 tokens/s
    assert rate.tokens_per_s == pytest.approx(100.0)
    abort_engine.reset_prefix_cache()
    token = Deadline(needed / 100.0 / 2, estimate=rate.seconds_for)  # half the time it needs
    with pytest.raises(DeadlineExceeded) as refused:
        abort_engine.score(decisions, cancel=token)
    assert token.refused and token.tokens_done == 0
    assert f"needs {needed} tokens" in str(refused.value) and "100 tokens/s" in str(refused.value)
    roomy = Deadline(needed / 100.0 * 2, estimate=rate.seconds_for)
    assert _numbers(abort_engine.score(decisions, cancel=roomy)) == _numbers(cases["long_state"][1])
    assert roomy.tokens_done == needed and not roomy.refused


def test_a_joint_token_aborts_only_when_every_member_is_cancelled_and_detaches_when_closed() -> None:
    """A shared call's token: one member's disconnect must not stop the others' call; once the call is
    over, the members hold no listener for it (a request in many calls keeps none per call)."""
    first, second = Deadline(None), Deadline(None)
    joint = Joint([first, second, first])  # one request may bring several parts
    assert joint.members == [first, second]
    first.cancel()
    assert not joint.cancelled
    second.expire()
    assert joint.cancelled and joint.reason == first.reason

    third, fourth = Deadline(None), Deadline(None)
    closed = Joint([third, fourth])
    closed.close()
    assert third._listeners == [] and fourth._listeners == []
    third.cancel()
    fourth.cancel()
    assert not closed.cancelled  # it no longer follows the members
