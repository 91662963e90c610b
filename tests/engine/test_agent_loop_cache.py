"""The prefix cache never changes an answer: a scripted agent loop run three ways on every model.

1. no cache (every request prefills its whole state),
2. the cache, one agent after another,
3. the cache shared by interleaved agents, small enough to evict,

must give bit-identical probabilities and logits for every decision. Also: a failure mid-prefill
files nothing, and a request that needs the whole context is served whatever is cached.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.deadline import Deadline, DeadlineExceeded
from semif_adapter.engine.llama_backend import BRANCH_SEQ, PREFIX_SEQ
from semif_adapter.engine.prefix_cache import common_prefix
from semif_adapter.errors import EngineFailure, TokenBudgetExceeded
from semif_adapter.throughput import Throughput
from tests.helpers.support import Answers, engine_settings, engines_under_test, play_turns

BLOCK = 32
N_CTX = 2048
AGENTS = ("ops", "billing", "search")
TURNS = 3
BRIEFS = {
    "ops": "You watch the production cluster. Nodes: 12. Alert policy: page on any 5xx burst.",
    "billing": "You reconcile invoices for the finance team. Currency: EUR. Month end is in 3 days.",
    "search": "You keep the search index fresh. Corpus: 2.1M documents. Reindex budget: 4 hours.",
}
EVENTS = [
    "Tool result: disk usage on node-{n} is {p}% and rising by 1% an hour.",
    "Observation: the queue depth went from {n} to {p} in five minutes.",
    "Tool result: last deploy was {n} hours ago, error rate {p} per mille.",
    "Observation: a customer wrote that request #{n}{p} failed twice.",
]
ACTIONS = ["wait", "inspect", "restart", "scale", "escalate", "finish"]


def transcript(agent: str, turn: int) -> str:
    rng = random.Random(f"{agent}-history")
    lines = [BRIEFS[agent]]
    for step in range(6 + 2 * turn):  # grows about 40 tokens a turn
        template = EVENTS[step % len(EVENTS)]
        lines.append(f"[{step:02d}] " + template.format(n=rng.randint(1, 99), p=rng.randint(1, 99)))
    return "\n".join(lines)


def turn_decisions(agent: str, turn: int) -> list[dict]:
    state = transcript(agent, turn)
    return [
        {
            "id": "next",
            "state": state,
            "question": "What should the agent do next?",
            "options": [{"id": a} for a in ACTIONS],
        },
        {
            "id": "done",
            "state": state,
            "question": "Is the task done?",
            "options": [{"id": "yes"}, {"id": "no"}],
        },
    ]


def play(engine: DecisionEngine, schedule: list[tuple[str, int]], *, cold: bool) -> tuple[Answers, list[int]]:
    answers, timings = play_turns(engine, schedule, turn_decisions, cold=cold)
    return answers, [t.prefix_reused_tokens for t in timings]


def sequential() -> list[tuple[str, int]]:
    return [(agent, turn) for agent in AGENTS for turn in range(TURNS)]


def interleaved() -> list[tuple[str, int]]:
    """Agents take turns irregularly (so a small LRU both hits and evicts); each agent in order."""
    rng = random.Random(3)
    next_turn = dict.fromkeys(AGENTS, 0)
    schedule = []
    while any(t < TURNS for t in next_turn.values()):
        agent = rng.choice([a for a in AGENTS if next_turn[a] < TURNS])
        schedule.append((agent, next_turn[agent]))
        if rng.random() < 0.3:
            schedule.append((agent, next_turn[agent]))  # the same state asked again
        next_turn[agent] += 1
    return schedule


@pytest.fixture(scope="module", params=engines_under_test())
def model_gguf(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_gguf")


def load(gguf: Path, **cache: int) -> DecisionEngine:
    cache = {"prefix_cache_tokens": 1 << 16, **cache}
    return DecisionEngine.load(engine_settings(n_ctx=N_CTX, prefix_block_tokens=BLOCK, **cache), gguf)


@pytest.fixture(scope="module")
def cached_engine(model_gguf: Path) -> Iterator[DecisionEngine]:
    engine = load(model_gguf)
    yield engine
    engine.close()


def test_agent_loop_answers_do_not_depend_on_the_cache(
    model_gguf: Path, cached_engine: DecisionEngine
) -> None:
    engine = cached_engine
    baseline, cold_reused = play(engine, sequential(), cold=True)
    assert set(cold_reused) == {0}

    engine.reset_prefix_cache()
    warm, warm_reused = play(engine, sequential(), cold=False)
    assert warm == baseline  # probabilities and logits, bit for bit
    # every turn after an agent's first reuses its previous transcript: whole blocks of it, or on memory
    # reused at any token (invariant numerics, attention only) every token the two prompts share
    for (agent, turn), reused in zip(sequential(), warm_reused, strict=True):
        if not turn:
            continue
        if engine.prefix_cache.any_cut:
            before, now = (engine.prompt_tokens(turn_decisions(agent, t))[0] for t in (turn - 1, turn))
            assert reused == common_prefix(tuple(before), tuple(now)) > engine.head_cut
        else:
            assert reused > 0 and reused % BLOCK == 0

    prefix_sizes = [len(engine.prompt_tokens(turn_decisions(a, TURNS - 1))[0]) for a in AGENTS]
    small = load(model_gguf, prefix_cache_tokens=2 * max(prefix_sizes) + BLOCK)  # ~2 agents of 3
    try:
        shared, shared_reused = play(small, interleaved(), cold=False)
        stats = small.prefix_cache_stats()
    finally:
        small.close()
    assert shared == baseline
    assert stats.evictions > 0 and stats.hits > 0 and sum(shared_reused) > 0
    assert stats.tokens <= 2 * max(prefix_sizes) + BLOCK


def test_cache_off_reuses_only_what_sequence_0_still_holds(
    model_gguf: Path, cached_engine: DecisionEngine
) -> None:
    """Without a cache the prefix the context still holds is all there is to reuse: the same prompt in
    whole, and on memory reused at any token (``PrefixCache.any_cut``) what the next prompt shares with
    it, cut back in place (``Prefill.resident``). The answers are those of cold requests, bit for bit."""
    schedule = [("ops", 0), ("ops", 1), ("ops", 1), ("billing", 0)]
    engine = load(model_gguf, prefix_cache_tokens=0)
    try:
        answers, reused = play(engine, schedule, cold=False)
        assert not engine.prefix_cache.enabled and engine.prefix_cache_stats().entries == 0
        prompts = [engine.prompt_tokens(turn_decisions(a, t))[0] for a, t in schedule]
        any_cut, resident = engine.prefix_cache.any_cut, engine.prefix_cache_stats().resident
    finally:
        engine.close()
    baseline, _ = play(cached_engine, schedule, cold=True)
    assert answers == baseline
    shared = [common_prefix(tuple(a), tuple(b)) for a, b in pairwise(prompts)]
    if any_cut:
        assert reused == [0, shared[0], len(prompts[2]), shared[2]] and resident == 2
        assert shared[0] > shared[2] > 0  # the next turn shares its transcript, another agent the template
    else:
        assert reused == [0, 0, len(prompts[2]), 0] and resident == 0


def test_failure_mid_prefill_files_nothing(cached_engine: DecisionEngine, monkeypatch) -> None:
    """An engine fault cannot be provoked from a healthy model, so one decode call is made to fail."""
    engine = cached_engine
    engine.reset_prefix_cache()
    expected, _ = play(engine, [("billing", 2)], cold=True)
    engine.score(turn_decisions("billing", 0))
    before = engine.prefix_cache_stats()
    calls = []

    def failing(real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(args)
            if len(calls) == 1:  # the request's first decode call (invariant numerics may make only one)
                raise EngineFailure("injected decode failure")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(engine.runtime, "decode", failing(engine.runtime.decode))
    monkeypatch.setattr(engine.runtime, "decode_parts", failing(engine.runtime.decode_parts))
    with pytest.raises(EngineFailure, match="injected"):
        engine.score(turn_decisions("billing", 2))
    monkeypatch.undo()
    after = engine.prefix_cache_stats()
    assert (after.entries, after.tokens, after.bytes) == (before.entries, before.tokens, before.bytes)
    again, reused = play(engine, [("billing", 2)], cold=False)
    assert again == expected and reused[0] > 0  # the earlier, complete state is still used


def test_a_full_context_request_is_served_whatever_is_cached(model_gguf: Path) -> None:
    """Saved states live in host memory: the context is all the request's, full cache or not."""
    n_ctx = 512
    engine = DecisionEngine.load(
        engine_settings(
            n_ctx=n_ctx, prefix_block_tokens=BLOCK, max_request_tokens=n_ctx, prefix_cache_tokens=1 << 16
        ),
        model_gguf,
    )
    try:
        play(engine, [(agent, 0) for agent in AGENTS], cold=False)
        assert engine.prefix_cache_stats().entries == len(AGENTS)
        words = [f"w{i}" for i in range(n_ctx)]
        big = turn_decisions("ops", 0)[1]
        lo, hi = 0, len(words)
        while lo < hi:  # the longest state that still fits the context with this decision
            mid = (lo + hi + 1) // 2
            try:
                engine.prompt_tokens([{**big, "state": " ".join(words[:mid])}])
                lo = mid
            except TokenBudgetExceeded:
                hi = mid - 1
        request = {**big, "state": " ".join(words[:lo])}
        result = engine.score([request]).results[0]
        assert result.input_tokens > n_ctx - 8
        engine.reset_prefix_cache()
        assert engine.score([request]).results[0].probabilities == result.probabilities
    finally:
        engine.close()


def test_refusal_counts_only_the_tokens_the_cache_cannot_supply(cached_engine: DecisionEngine) -> None:
    """A deadline too short for a cold prefill but long enough for the uncached tail is served."""
    engine = cached_engine
    engine.reset_prefix_cache()
    engine.score(turn_decisions("ops", 1))
    decisions = turn_decisions("ops", 2)
    prefix, suffixes = engine.prompt_tokens(decisions)
    reusable = engine.prefix_cache.peek(tuple(prefix))[1]
    assert reusable > 0
    to_decode = len(prefix) - reusable + sum(map(len, suffixes))
    rate = Throughput(warmup_tokens=1)
    rate.observe(1000, 100.0)  # pretend 10 tokens/s (slow: the real decode never runs out of time)
    limit = (to_decode + reusable / 2) / 10.0  # between the warm and the cold estimate
    hits = engine.prefix_cache_stats().hits
    token = Deadline(limit, estimate=rate.seconds_for)
    result = engine.score(decisions, cancel=token)
    assert not token.refused and token.tokens_needed == to_decode
    assert result.timing.prefix_reused_tokens == reusable
    assert engine.prefix_cache_stats().hits == hits + 1  # the estimate's peek is not a hit
    engine.reset_prefix_cache()
    cold = Deadline(limit, estimate=rate.seconds_for)
    with pytest.raises(DeadlineExceeded):
        engine.score(decisions, cancel=cold)
    assert cold.refused and cold.tokens_done == 0


def test_a_diverging_state_reuses_only_the_shared_blocks(cached_engine: DecisionEngine) -> None:
    """A saved state longer than the common part: attention models drop its tail, hybrid ones cannot."""
    engine = cached_engine
    first = transcript("search", 2)
    lines = first.split("\n")
    fork = "\n".join([*lines[: len(lines) // 2], "Tool result: the reindex job was cancelled."])
    question = turn_decisions("search", 0)[0]
    cold = {}
    for state in (first, fork):
        engine.reset_prefix_cache()
        cold[state] = engine.score([{**question, "state": state}]).results[0]
    engine.reset_prefix_cache()
    engine.score([{**question, "state": first}])
    warm = engine.score([{**question, "state": fork}]).results[0]
    assert warm.probabilities == cold[fork].probabilities
    assert warm.option_logits == cold[fork].option_logits
    reused = warm.timing.prefix_reused_tokens
    assert (reused > engine.head_cut) is engine.prefix_cache.partial_reuse  # hybrid: the pinned head only
    if engine.prefix_cache.any_cut:  # invariant numerics: reused up to the last token the prompts share
        a, b = (engine.prompt_tokens([{**question, "state": st}])[0] for st in (first, fork))
        assert reused == next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    else:
        assert reused == engine.head_cut or reused % BLOCK == 0


def test_gemma_restoring_a_state_past_2048_tokens_is_exact(gemma_gguf: Path) -> None:
    """Regression: gemma-3 (sliding window 512) once differed by 0.0188 in a probability when a
    2,048-token state was restored. A saved sequence keeps only the window's cells, so the restored
    cache had fewer cells than a cold one, and with two threads the CPU kernels split the attention
    work by that count and rounded differently. The lengths are those of the first failure
    (prefix 2,177, a 20-token suffix); two threads are pinned so the split happens."""
    settings = engine_settings(n_ctx=4096, n_threads=2, prefix_block_tokens=128, prefix_cache_tokens=1 << 16)
    engine = DecisionEngine.load(settings, gemma_gguf)
    runtime = engine.runtime
    events = (f"Event {i}: the robot moved crate {i * 7 % 13} to shelf {i * 3 % 11}." for i in range(400))
    text = " ".join(events)
    tokens = runtime.tokenize(text, special=False)
    prefix, suffix = tokens[:2177], tokens[2177:2197]

    def last_logits() -> np.ndarray:
        runtime.fork()
        runtime.decode(suffix, len(prefix), BRANCH_SEQ, want_logits=True)
        logits = runtime.last_logits().copy()
        runtime.drop(BRANCH_SEQ)
        return logits

    try:
        assert runtime.n_swa > 0 and len(suffix) == 20
        engine.reset_prefix_cache()
        assert engine.prefill.fill(prefix) == 0
        cold = last_logits()
        engine.reset_prefix_cache()
        engine.prefill.fill(prefix[:2100])  # files the state after 2,048 tokens
        assert engine.prefill.fill(prefix) == 2048
        warm = last_logits()
    finally:
        engine.close()
    assert np.array_equal(warm, cold), f"max |dlogit| {np.abs(warm - cold).max()}"


def test_a_prefix_state_is_saved_where_the_next_request_resumes(
    cached_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On memory the cache reuses at any token (invariant numerics, attention only, no window) a prefix's
    state is saved at its end: no call stops at its last cut (a lone decision's call carries the prefix's
    last stretch with its suffix), and the state asked about again after another one resumes at its end.
    Elsewhere the state is saved at the last cut, where a call stops. Answers stay equal to cold ones."""
    engine = cached_engine
    ask, again = turn_decisions("ops", 2)  # two questions about one state
    prefix, cuts = engine.prompt_tokens([ask])[0], engine.prefix_cuts([ask])
    n, last = len(prefix), cuts[-1]
    assert last < n  # the prefix goes on past its last cut
    ends: list[int] = []  # where each call leaves sequence 0
    real = engine.runtime._call

    def logged(parts, cancel):  # type: ignore[no-untyped-def]
        ends.extend(p.start_pos + len(p.tokens) for p in parts if p.seq == PREFIX_SEQ)
        return real(parts, cancel)

    monkeypatch.setattr(engine.runtime, "_call", logged)
    engine.reset_prefix_cache()
    engine.score([ask])
    first = list(ends)
    engine.score(turn_decisions("billing", 1)[:1])  # another state takes sequence 0
    warm = engine.score([again]).results[0]
    monkeypatch.undo()
    engine.reset_prefix_cache()
    cold = engine.score([again]).results[0]
    assert (warm.probabilities, warm.option_logits) == (cold.probabilities, cold.option_logits)
    saved = engine.saved_cuts(cuts, n)
    if engine.prefix_cache.any_cut:
        assert saved == (n,)
        assert last not in first and first[-1] > n  # the last call went on into the suffix
        assert warm.timing.prefix_reused_tokens == n
    else:
        assert saved[-1] == last and last in first
        assert warm.timing.prefix_reused_tokens == last


def test_qwen_long_cold_prompt_ends_its_calls_on_kv_cell_boundaries(
    qwen_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant numerics: a prompt longer than one call ends its calls on multiples of 256 positions
    (llama.cpp's rounding of the cells a call attends over), not ``n_batch`` tokens after the template
    head. The answer is the same when the prompt is scored again warm."""
    engine = qwen_engine
    assert engine.invariant and engine.runtime.n_batch == 512
    state = "".join(
        f"Step {i}: the deploy job {i * 7} finished on node-{i % 5} after {i} retries. " for i in range(60)
    )
    ask = {"id": "cold", "state": state, "question": "Roll back?", "options": [{"id": "yes"}, {"id": "no"}]}
    n = len(engine.prompt_tokens([ask])[0])
    assert n > 800
    ends: list[int] = []
    real = engine.runtime._call

    def logged(parts, cancel):  # type: ignore[no-untyped-def]
        ends.append(max(p.start_pos + len(p.tokens) for p in parts))
        return real(parts, cancel)

    engine.reset_prefix_cache()
    monkeypatch.setattr(engine.runtime, "_call", logged)
    cold = engine.score([ask]).results[0]
    monkeypatch.undo()
    assert 512 in ends and ends[-1] > n
    assert all(end % 256 == 0 or end == engine.head_cut for end in ends[:-1]), ends
    warm = engine.score([ask]).results[0]
    assert (warm.probabilities, warm.option_logits) == (cold.probabilities, cold.option_logits)


def test_an_agent_turn_in_place_files_its_state_for_after_another_agent(
    numerics_engine: DecisionEngine,
) -> None:
    """An agent's turns one after another go on from the prefix the context still holds
    (``Prefill.resident``, on memory reused at any token); they file their states as a prefill from the
    saved state would, so after another agent's turn the agent resumes at its whole last prompt. Every
    answer is the cold request's, bit for bit, on every engine of the numerics tests."""
    engine = numerics_engine
    engine.reset_prefix_cache()
    schedule = [("ops", 0), ("ops", 1), ("ops", 2), ("billing", 0), ("ops", 3)]
    before = engine.prefix_cache_stats().resident
    answers, reused = play(engine, schedule, cold=False)
    resident = engine.prefix_cache_stats().resident - before
    baseline, _ = play(engine, schedule, cold=True)
    assert answers == baseline
    prompts = [tuple(engine.prompt_tokens(turn_decisions(a, t))[0]) for a, t in schedule]
    if engine.prefix_cache.any_cut:
        # ops 1 and 2 in place (from what sequence 0 kept: the whole prompt, or up to its tail where the
        # tail went into every decision's run); billing's first turn from the template ops 2 left
        assert resident == 3 and reused[1] == common_prefix(prompts[0], prompts[1])
        assert reused[1] <= reused[2] <= common_prefix(prompts[1], prompts[2])
        assert reused[4] == common_prefix(prompts[2], prompts[4]) > common_prefix(prompts[3], prompts[4])
    else:
        assert resident == 0
