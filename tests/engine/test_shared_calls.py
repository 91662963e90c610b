"""Several requests decoded together (``DecisionEngine.score_many``): every answer bit-identical to the
same request scored alone on an idle engine, whatever else shares its calls, in any order, cache on or
off, and one request's error or abort never touches another's answer.

Run on every engine under test (the two real models and the hybrid and recurrent fixtures) in the mode
the probe gives it, and on both real models in the fixed split (which scores one request at a time).
"""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Sequence
from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine, calls
from semif_adapter.engine.deadline import ClientDisconnected, Deadline
from semif_adapter.errors import SemifError
from semif_adapter.protocol import BatchResult
from tests.helpers.support import engine_settings

LONG_STATE = " ".join(
    f"Event {i}: job {i} finished with code {i % 3} after {i * 7} seconds." for i in range(40)
)
STATES: list[object] = [
    "Order 1182 was charged twice; the customer wants one charge refunded.",
    LONG_STATE,  # hundreds of tokens beside a few dozen: other requests' cells are far longer or shorter
    "A user asks to reset a password; the account locked after five failed logins.",
    [{"t": i, "event": f"tool call {i} returned {i * 7} rows"} for i in range(9)],
    "Disk usage on the build host crossed 90 %; the nightly job writes 40 GB of artefacts.",
]
OPTIONS = [
    ["refund", "keep"],
    ["billing", "support", "fraud", "sales"],
    ["yes", "no", "unknown"],
    ["now", "later"],
]
QUESTIONS = ["What now?", "Which team should handle this first?", "How urgent is it?"]


def request(k: int, state: object | None = None) -> list[dict]:
    """Request ``k``: one to three decisions about its state (suffix lengths differ between requests)."""
    return [
        {
            "id": f"r{k}d{i}",
            "state": STATES[k % len(STATES)] if state is None else state,
            "question": QUESTIONS[(k + i) % len(QUESTIONS)],
            "options": [{"id": o} for o in OPTIONS[(k + i) % len(OPTIONS)]],
        }
        for i in range(1 + k % 3)
    ]


Answers = dict[str, tuple[list[float], list[float]]]


def answers(batch: BatchResult) -> Answers:
    return {r.id: (r.probabilities, r.option_logits) for r in batch.results}


#: Each engine's lone answers by request: a request scored alone on an idle engine answers the same every
#: time (what every test here checks), so the tests that compare against one reuse it.
_ALONE: weakref.WeakKeyDictionary[DecisionEngine, dict[str, Answers]] = weakref.WeakKeyDictionary()


def alone(engine: DecisionEngine, requests: Sequence[list[dict]]) -> Answers:
    """Each request scored alone on an idle engine (cold: no kept prefix, no saved state)."""
    known = _ALONE.setdefault(engine, {})
    found: Answers = {}
    for req in requests:
        key = json.dumps(req, sort_keys=True)
        if key not in known:
            engine.reset_prefix_cache()
            known[key] = answers(engine.score(req))
        found.update(known[key])
    return found


def together(engine: DecisionEngine, requests: Sequence[list[dict]], cancels: Sequence[Deadline | None] = ()):
    outcomes = engine.score_many([(req, cancels[i] if cancels else None) for i, req in enumerate(requests)])
    assert len(outcomes) == len(requests)
    return outcomes


def merged(outcomes: Sequence[BatchResult | SemifError]) -> Answers:
    found: Answers = {}
    for outcome in outcomes:
        assert isinstance(outcome, BatchResult), outcome
        found.update(answers(outcome))
    return found


class CallLog:
    """Counts the engine's ``llama_decode`` calls, how many sequences each held, and how many of those
    calls read no logits (prefix stretches only: several requests' prefills in one call)."""

    def __init__(self, engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sequences: list[int] = []
        self.shared_prefills = 0
        runtime = engine.runtime
        real = runtime.decode_parts

        def logged(parts, cancel=None):  # type: ignore[no-untyped-def]
            self.sequences.append(len({p.seq for p in parts}))
            self.shared_prefills += len(parts) > 1 and not any(p.want_logits for p in parts)
            return real(parts, cancel)

        monkeypatch.setattr(runtime, "decode_parts", logged)


def test_requests_decoded_together_answer_as_alone(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    engine = numerics_engine
    requests = [request(k) for k in range(5)]
    expected = alone(engine, requests)
    shares = engine.invariant and not engine.tiled  # tiled: short turns only (test_tiled_batches.py)
    # the tiled layout takes one request per call on a sliding window
    if engine.invariant and not (engine.tiled and engine.runtime.n_swa > 0):
        assert engine.max_batch_requests == 4 and engine.model_info.max_batch_requests == 4
    else:
        assert engine.max_batch_requests == 1 == engine.model_info.max_batch_requests
    for trial in range(3):
        order = requests[:]
        random.Random(trial).shuffle(order)
        if trial != 1:  # trial 1 runs on the states the others saved (cache warm)
            engine.reset_prefix_cache()
        assert merged(together(engine, order)) == expected, f"order {trial}"
    log = CallLog(engine, monkeypatch)
    engine.reset_prefix_cache()
    assert merged(together(engine, requests[:4])) == {k: v for k, v in expected.items() if k[:2] != "r4"}
    if shares:  # the calls really were shared across requests
        assert max(log.sequences) >= 3
    # and so were their prefills; with flash attention's 64-row pieces these prefills do not fit one call
    # (a 473-token stretch beside a 97-token one: more than n_batch, too far apart to pad)
    if shares and engine.runtime.n_swa == 0 and not engine.runtime.min_rows:
        assert log.shared_prefills >= 1


@pytest.mark.parametrize("share_any_span", [False, True], ids=["planned", "every-span-shares"])
def test_a_request_beside_others_of_any_length_answers_as_alone(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch, share_any_span: bool
):
    """The same short request next to requests whose prefixes are shorter, much longer, or the same; as
    planned (runs far apart in their streams in calls of their own) and with every run sharing calls
    whatever its span (the budget lifted), so that calls mixing short and long spans are checked too."""
    if share_any_span:
        monkeypatch.setattr(calls, "SHARED_CALL_CELLS", 10**9)
    engine = numerics_engine
    short = request(0)
    expected = alone(engine, [short])
    for others in ([request(1)], [request(3), request(2)], [request(0, state=STATES[0]), request(4)]):
        for batch in ([short, *others], [*others, short]):
            outcomes = together(engine, batch)
            assert answers(outcomes[batch.index(short)]) == expected


def test_runs_far_apart_in_their_streams_go_in_calls_of_their_own(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    """With no masked cells allowed, no call holds runs whose spans differ (llama.cpp would make each
    attend over the longest), and the answers are still the lone ones."""
    engine = numerics_engine
    requests = [request(0), request(1), request(3)]
    expected = alone(engine, requests)
    monkeypatch.setattr(calls, "SHARED_CALL_CELLS", 0)
    spans: list[set[int]] = []
    real = engine.runtime.decode_parts

    def logged(parts, cancel=None):  # type: ignore[no-untyped-def]
        spans.append({calls.kv_span(p.end) for p in parts})
        return real(parts, cancel)

    monkeypatch.setattr(engine.runtime, "decode_parts", logged)
    engine.reset_prefix_cache()
    assert merged(together(engine, requests)) == expected
    if engine.invariant and not engine.runtime.min_rows:
        assert spans and all(len(s) == 1 for s in spans)


def test_requests_about_one_state_share_its_prefill(engine: DecisionEngine):
    first, second = request(1, state=STATES[2]), request(2, state=STATES[2])
    expected = alone(engine, [first, second])
    engine.reset_prefix_cache()
    one, two = together(engine, [first, second])
    assert merged([one, two]) == expected
    assert two.timing.prefix_reused_tokens == two.timing.prefix_tokens  # decoded once, for the first


def test_interleaved_agents_batched_turn_by_turn_with_evictions(numerics_engine: DecisionEngine):
    """Four agents, each its own growing transcript, their turns decoded together, with a prefix cache
    small enough to evict; every turn answers as it does alone on a cold engine without a cache."""
    engine = numerics_engine
    events = [
        [{"t": t, "agent": a, "event": f"agent {a} step {t}: {a * 11 + t} rows"} for t in range(6)]
        for a in range(4)
    ]
    same = {"flash_attention": engine.settings.flash_attention, "kv_layout": engine.settings.kv_layout}
    small = DecisionEngine.load(engine_settings(prefix_cache_tokens=600, **same), Path(engine.gguf_path))
    off = DecisionEngine.load(engine_settings(prefix_cache_tokens=0, **same), Path(engine.gguf_path))
    try:
        assert (small.tiled, off.tiled) == (engine.tiled, engine.tiled)
        for turn in (2, 3, 5, 6):
            turns = [request(a + 1, state=events[a][:turn])[:2] for a in range(4)]
            assert merged(together(small, turns)) == alone(off, turns), f"turn {turn}"
    finally:
        small.close()
        off.close()


def test_agents_batched_turn_after_turn_go_on_in_the_streams_holding_their_prefixes(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    """Four agents' turns batched one after another: where streams stay (invariant numerics, attention
    without a sliding window, the stream layout), each agent's next turn goes on in the stream its last
    one left, cut back in place, and no state is restored into a branch stream after the first turn. A
    lone request between turns takes streams for its decisions: the agents it took them from start over
    from saved states, the others stay. Every answer is the one alone on a cold engine."""
    engine = numerics_engine
    events = [
        [{"t": t, "agent": a, "event": f"agent {a} saw {a * 13 + t} new rows at step {t}"} for t in range(5)]
        for a in range(4)
    ]
    turns = {t: [request(a + 1, state=events[a][:t])[:2] for a in range(4)] for t in (2, 3, 4, 5)}
    lone = request(2)  # three decisions: those not riding on sequence 0 go in streams 1, 2 (and 3)
    expected = {t: alone(engine, reqs) for t, reqs in turns.items()}
    expected_lone = alone(engine, [lone])
    restored: list[int] = []
    real = engine.runtime.restore_seq

    def restore(seq, data):  # type: ignore[no-untyped-def]
        restored.append(seq)
        return real(seq, data)

    monkeypatch.setattr(engine.runtime, "restore_seq", restore)
    engine.reset_prefix_cache()
    stays = engine.prefill.streams_stay and not engine.tiled and engine.max_batch_requests >= 4
    left: set[int] = set()  # the streams the lone request left to their agents
    runtime = engine.runtime
    attention_only = not (runtime.n_swa or runtime.is_recurrent or runtime.is_hybrid)
    assert stays == (attention_only and engine.invariant and not engine.tiled)
    for t, reqs in turns.items():
        restored.clear()
        before = engine.prefix_cache_stats().resident
        assert merged(together(engine, reqs)) == expected[t], f"turn {t}"
        in_place = engine.prefix_cache_stats().resident - before
        if not stays:
            assert engine.prefill.streams.held == {}
        elif t > 2:
            kept = len(left) if t == 4 else 4  # after the lone request, the others start over
            assert in_place == kept and len([q for q in restored if q > 0]) == 4 - kept, f"turn {t}"
            assert sorted(engine.prefill.streams.held) == [1, 2, 3, 4]
        if t == 3:
            assert merged(together(engine, [lone])) == expected_lone
            if stays:
                left = set(engine.prefill.streams.held)
                assert left and left <= {3, 4}


def test_one_requests_error_or_abort_leaves_the_others_answers(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    engine = numerics_engine
    good = [request(1), request(2), request(3)]
    expected = alone(engine, good)
    bad = [{**request(4)[0], "options": []}]  # refused at validation
    gone = Deadline(None)
    gone.cancel()  # left before its turn
    leaving = Deadline(None)  # leaves while a shared call runs
    runtime, real = engine.runtime, engine.runtime.decode_parts

    def cancel_mid_call(parts, cancel=None):  # type: ignore[no-untyped-def]
        if len({p.seq for p in parts}) > 1:
            leaving.cancel()  # from "another thread": the call it is in goes on for the others
        return real(parts, cancel)

    monkeypatch.setattr(runtime, "decode_parts", cancel_mid_call)
    engine.reset_prefix_cache()
    batch = [good[0], bad, request(0), good[1], request(4), good[2]]
    outcomes = together(engine, batch, [None, None, gone, None, leaving, None])
    assert isinstance(outcomes[1], SemifError) and outcomes[1].status == 400 and outcomes[1].loc
    assert isinstance(outcomes[2], ClientDisconnected)
    if engine.invariant and not engine.tiled:  # its request shared a call (tiled: one at a time)
        assert isinstance(outcomes[4], ClientDisconnected)
    assert merged([outcomes[0], outcomes[3], outcomes[5]]) == expected
    monkeypatch.undo()
    assert merged(together(engine, good)) == expected  # nothing the aborts left behind moves an answer


def test_the_fixed_split_scores_requests_one_at_a_time(
    fixed_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    assert fixed_engine.max_batch_requests == 1 and fixed_engine.model_info.max_batch_requests == 1
    requests = [request(k) for k in range(3)]
    expected = alone(fixed_engine, requests)
    log = CallLog(fixed_engine, monkeypatch)
    fixed_engine.reset_prefix_cache()
    assert merged(together(fixed_engine, requests[::-1])) == expected
    assert set(log.sequences) <= {1}
