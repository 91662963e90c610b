"""JSON-array states are cut at their elements: answers stay bit-identical, warm turns decode what is new.

An agent's transcript sent as an array of events is cut where it grows (``chunking``). Run three ways —
every turn cold with the cache off, the cache on one agent after another, and interleaved agents with a
cache small enough to evict — every decision must give the same probabilities and logits bit for bit; a
warm turn reuses everything up to its previous last event; the same text sent as a string is cut alike.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.chunking import element_spans, event_cuts, shared_cut
from semif_adapter.engine.prefix_cache import common_prefix
from tests.helpers.support import Answers, engine_settings, engines_under_test, play_turns

BLOCK = 64
N_CTX = 2048
AGENTS = ("ops", "billing")
TURNS = 5
ACTIONS = ["wait", "inspect", "restart", "escalate", "finish"]


def events(agent: str, turn: int) -> list[dict]:
    rng = random.Random(f"{agent}-events")
    history: list[dict] = [
        {"role": "user", "content": f"Agent {agent}: keep the service healthy. Région eu-west."}
    ]
    for step in range(6 + turn):  # one tool event a turn
        history.append(
            {
                "step": step,
                "role": "tool",
                "name": rng.choice(["shell", "http_get", "sql"]),
                "content": f"exit {rng.randint(0, 3)}: {rng.randint(10, 999)} rows, "
                f"p99 {rng.randint(5, 900)} ms.",
            }
        )
    return history


def turn_decisions(agent: str, turn: int, *, as_text: bool = False) -> list[dict]:
    state: object = events(agent, turn)
    if as_text:
        state = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return [
        {"id": "next", "state": state, "question": "What next?", "options": [{"id": a} for a in ACTIONS]},
        {"id": "done", "state": state, "question": "Is it done?", "options": [{"id": "yes"}, {"id": "no"}]},
    ]


def test_element_spans_only_for_compact_arrays() -> None:
    text = '[{"a":1},"x y",[2,3]]'
    assert [text[a:b] for a, b in element_spans(text)] == ['{"a":1}', '"x y"', "[2,3]"]
    assert element_spans('[{"a": 1}, 2]') is None  # not compact: another text, block rule
    assert element_spans('{"a":1}') is None
    assert element_spans("[1,2") is None


def test_event_cuts_are_blocks_then_the_elements_after_the_last_block() -> None:
    cuts = event_cuts([10, 30, 70, 75, 80, 200, 210], n_tokens=220, block=64)
    assert cuts == (64, 128, 192, 200, 210)  # whole blocks up to the last element's end, then elements
    assert event_cuts([10, 30], n_tokens=40, block=64) == (10, 30)
    assert event_cuts([70, 75], n_tokens=90, block=64, head=39) == (39, 64, 70, 75)
    assert event_cuts([1000], n_tokens=1100, block=64)[-2:] == (960, 1000)  # a long element: blocks
    assert event_cuts([95], n_tokens=90, block=64) == (64,)  # no anchor inside the prefix: blocks
    # one more element keeps every cut up to the previous last element, unless it crosses a block
    shorter = event_cuts([10, 30, 70, 75, 80], n_tokens=90, block=64)
    longer = event_cuts([10, 30, 70, 75, 80, 100], n_tokens=110, block=64)
    assert longer[: len(shorter)] == shorter and longer[-1] == 100
    crossed = event_cuts([10, 30, 70, 75, 80, 100, 130], n_tokens=140, block=64)
    assert crossed == (64, 128, 130)


def play(engine: DecisionEngine, schedule: list[tuple[str, int]], *, cold: bool) -> tuple[Answers, list[int]]:
    """The answers, and how many prefix tokens each request decoded."""
    answers, timings = play_turns(engine, schedule, turn_decisions, cold=cold)
    return answers, [t.prefix_tokens - t.prefix_reused_tokens for t in timings]


@pytest.fixture(scope="module", params=engines_under_test())
def model_gguf(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_gguf")


def load(gguf: Path, cache_tokens: int) -> DecisionEngine:
    settings = engine_settings(n_ctx=N_CTX, prefix_block_tokens=BLOCK, prefix_cache_tokens=cache_tokens)
    return DecisionEngine.load(settings, gguf)


@pytest.fixture(scope="module")
def engines(model_gguf: Path) -> Iterator[tuple[DecisionEngine, DecisionEngine]]:
    off, on = load(model_gguf, 0), load(model_gguf, 1 << 16)
    yield off, on
    off.close()
    on.close()


def test_event_states_answer_alike_cold_warm_and_interleaved(
    engines: tuple[DecisionEngine, DecisionEngine], model_gguf: Path
) -> None:
    off, on = engines
    sequential = [(a, t) for a in AGENTS for t in range(TURNS)]
    baseline, _ = play(off, sequential, cold=True)
    on.reset_prefix_cache()
    warm, fresh = play(on, sequential, cold=False)
    assert warm == baseline  # probabilities and logits, bit for bit
    rng = random.Random(5)
    mixed = sorted(sequential, key=lambda _: rng.random())
    mixed.sort(key=lambda at: at[1])  # each agent's turns in order, agents interleaved
    small = load(model_gguf, cache_tokens=len(on.prompt_tokens(turn_decisions("ops", TURNS - 1))[0]) + BLOCK)
    try:
        again, _ = play(small, mixed + mixed[:3], cold=False)
        assert small.prefix_cache_stats().evictions > 0
    finally:
        small.close()
    assert again == baseline

    # a warm turn reuses all the previous turn saved that it can: on memory reused at any token
    # (invariant numerics, attention only) the previous prefix's state at its end, cut back to the tokens
    # both share; elsewhere the previous last cut where it survives (the new event did not cross a block).
    # It decodes the new event and the array's closing tokens only
    kept = 0
    for i, (agent, turn) in enumerate(sequential):
        if not turn:
            continue
        now = on.prompt_tokens(turn_decisions(agent, turn))[0]
        before = on.prompt_tokens(turn_decisions(agent, turn - 1))[0]
        cuts_before = on.prefix_cuts(turn_decisions(agent, turn - 1))
        cuts_now = on.prefix_cuts(turn_decisions(agent, turn))
        saved = on.saved_cuts(cuts_before, len(before))  # fixed split: the last cut; else the last stop
        if on.prefix_cache.any_cut:
            assert saved == (len(before),)
            assert fresh[i] == len(now) - common_prefix(tuple(before), tuple(now))
            kept += 1
        elif cuts_now[: len(cuts_before)] == cuts_before and saved and saved[-1] == cuts_before[-1]:
            assert fresh[i] == len(now) - cuts_before[-1]
            kept += 1
    assert kept >= len(AGENTS)


def test_a_string_state_with_the_same_text_is_cut_alike(
    engines: tuple[DecisionEngine, DecisionEngine],
) -> None:
    off, on = engines
    as_list = turn_decisions("billing", 2)
    as_text = turn_decisions("billing", 2, as_text=True)
    prefix, _ = on.prompt_tokens(as_list)
    assert on.prompt_tokens(as_text)[0] == prefix and on.prefix_cuts(as_list) == on.prefix_cuts(as_text)
    assert on.prefix_cuts(as_text) != on.planner.block_cuts(len(prefix))
    off.reset_prefix_cache()
    a = off.score(as_list).results
    on.reset_prefix_cache()
    on.score(turn_decisions("billing", 1))
    b = on.score(as_text).results
    assert [(r.probabilities, r.option_logits) for r in a] == [(r.probabilities, r.option_logits) for r in b]


def long_turn(turn: int) -> list[dict]:
    """One agent's transcript of 14 + ``turn`` tool events (about 40 tokens each)."""
    rng = random.Random("long-transcript")
    history = [
        {
            "step": step,
            "role": "tool",
            "name": rng.choice(["shell", "http_get", "sql"]),
            "content": f"exit {rng.randint(0, 3)}: {rng.randint(10, 999)} rows from shard "
            f"{rng.randint(1, 64)}, p99 {rng.randint(5, 900)} ms, retried {rng.randint(0, 4)} times.",
        }
        for step in range(14 + turn)
    ]
    return [
        {"id": "next", "state": history, "question": "What next?", "options": [{"id": a} for a in ACTIONS]}
    ]


@pytest.mark.parametrize("model", engines_under_test(("gemma", "hybrid", "mamba")))
def test_a_state_that_cannot_be_cut_back_resumes_where_the_transcript_was_cut(
    request: pytest.FixtureRequest, model: str
) -> None:
    """A saved state longer than a sliding window, or holding recurrent state, cannot be cut back, so the
    engine also files the state at the block before the element cuts: a turn whose new event completes a
    block resumes there rather than from the head, and answers stay bit-identical to cold ones."""
    gguf: Path = request.getfixturevalue(f"{model}_gguf")
    off, on = load(gguf, 0), load(gguf, 1 << 16)
    try:
        window, runtime = on.runtime.n_swa, on.runtime
        assert window > 0 or runtime.is_recurrent or runtime.is_hybrid
        assert len(on.prompt_tokens(long_turn(0))[0]) > window + BLOCK
        crossed = 0
        for turn in range(7):
            decisions = long_turn(turn)
            warm = on.score(decisions)
            off.reset_prefix_cache()
            cold = off.score(decisions)
            assert [(r.probabilities, r.option_logits) for r in warm.results] == [
                (r.probabilities, r.option_logits) for r in cold.results
            ]
            if not turn:
                continue
            now, before = on.prefix_cuts(decisions), on.prefix_cuts(long_turn(turn - 1))
            tokens, previous = on.prompt_tokens(decisions)[0], on.prompt_tokens(long_turn(turn - 1))[0]
            shared = shared_cut(tokens, now, previous, before)
            # the furthest state the previous turn saved that this turn shares (the fixed split saves one
            # at every cut this can be; invariant numerics only where its calls stopped)
            resumable = [p for p in on.saved_cuts(before, len(previous)) if p <= shared]
            assert shared > on.head_cut and warm.timing.prefix_reused_tokens == max(resumable)
            crossed += now[: len(before)] != before
        assert crossed >= 2  # turns whose new event completed a block
    finally:
        off.close()
        on.close()
