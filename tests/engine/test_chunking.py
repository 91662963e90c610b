"""The cut rules (``chunking``) and the pinned template head: a new state never decodes the head again,
and answers stay bit-identical to an engine that caches nothing."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.engine.chunking import (
    block_cuts,
    chunks,
    event_anchors,
    event_cuts,
    head_cuts,
    shared_cut,
    stable_end,
    token_ends,
)
from semif_adapter.engine.prefix_cache import PrefixCache, SavedPrefix, common_prefix
from semif_adapter.engine.prompt import decision_text
from tests.helpers.support import engine_settings, engines_under_test


def saved(tokens: tuple[int, ...], cuts: tuple[int, ...] | None = None) -> SavedPrefix:
    return SavedPrefix(tokens, (ctypes.c_uint8 * 8)(), cuts)


def test_block_cuts_add_the_head_end_among_whole_blocks() -> None:
    assert block_cuts(300, 128) == (128, 256)
    assert block_cuts(300, 128, head=39) == (39, 128, 256)
    assert block_cuts(300, 32, head=39)[:3] == (32, 39, 64)  # a head longer than a block
    assert block_cuts(30, 128, head=39) == ()  # the prompt is shorter than the head: no cut
    assert block_cuts(256, 128, head=128) == (128, 256)
    # both rules cut the head alike, so the head's state serves text and JSON states
    assert head_cuts(39, 32) == (32, 39) == block_cuts(300, 32, head=39)[:2]
    assert event_cuts([50, 90], 100, 32, head=39)[:2] == head_cuts(39, 32)


def test_block_cuts_stop_at_the_state_end() -> None:
    assert block_cuts(300, 128, head=39, limit=255) == (39, 128)
    assert block_cuts(300, 128, head=39, limit=256) == (39, 128, 256)
    assert block_cuts(300, 128, head=39, limit=500) == block_cuts(300, 128, head=39)
    # the state's end is after its last letter or digit: the closing punctuation merges with what follows
    pieces = ["State", ":\n", "abc", " déf", ".\n\n", "Question", ":"]
    text = "".join(pieces)
    tokens, state_at = list(range(len(pieces))), len("State:\n")
    length = [len(piece.encode()) for piece in pieces].__getitem__
    ends = token_ends(text, tokens, length)
    assert ends is not None and ends[-1] == len(text.encode())
    assert stable_end(text, state_at, "abc déf.", ends) == 4
    assert token_ends(text, tokens[:-1], length) is None  # the tokens do not spell the text
    assert stable_end(text, state_at, "abc déf!", ends) is None  # not the prompt's state
    assert stable_end("State:\n...\n\nQuestion:", state_at, "...", [7, 12, 22]) is None


def test_event_anchors_follow_each_elements_last_letter_or_digit() -> None:
    state = '[{"a":"é x"},7,{"b":"!"},{"c":"y"}]'
    pieces = [
        "State",
        ":\n",
        '[{"',
        'a":"',
        "é",
        " x",
        '"},',
        "7",
        ',{"',
        'b":"!"',
        '},{"',
        'c":"',
        "y",
        '"}]',
        "\n\n",
        "Q:",
    ]
    text = "".join(pieces)
    assert text == f"State:\n{state}\n\nQ:"
    ends = token_ends(text, range(len(pieces)), [len(piece.encode()) for piece in pieces].__getitem__)
    assert ends is not None
    # after "x", after "7", before the token holding "b" (that element ends in punctuation), after "y"
    assert event_anchors(text, len("State:\n"), state, ends) == [6, 8, 9, 13]
    assert event_anchors(text, len("State:\n"), "[1]", ends) is None  # one element: no events


def test_chunks_cover_the_span_between_two_cuts() -> None:
    assert chunks((39, 128, 256), 0, 256) == [(0, 39), (39, 128), (128, 256)]
    assert chunks((39, 128, 256), 39, 128) == [(39, 128)]
    assert chunks((39, 128), 128, 128) == []


def test_shared_cut_needs_equal_tokens_and_equal_cuts_before_it() -> None:
    a = tuple(range(300))
    assert shared_cut(a, (39, 128, 256), a, (39, 128, 256)) == 256
    assert shared_cut(a, (39, 128, 256), (*a[:200], 7, *a[201:]), (39, 128, 256)) == 128
    assert shared_cut(a, (39, 128, 256), a, (39, 140, 256)) == 39  # same tokens, other chunks
    assert shared_cut(a, (128, 256), a, (39, 128, 256)) == 0


def test_the_pinned_head_serves_every_prompt_but_counts_as_a_miss() -> None:
    cache = PrefixCache(1000, 1 << 20, block=128, partial_reuse=True, head=3)
    head = saved((1, 2, 3), (3,))
    cache.pin(head)
    assert cache.lookup((1, 2, 3, 4, 5)) == (head, 3)
    assert (cache.hits, cache.misses) == (0, 1)
    assert cache.lookup((9, 2, 3, 4)) == (None, 0)
    assert cache.stats().entries == 0 and cache.stats().bytes == 0  # outside the limits
    grown = saved(tuple(range(1, 129)))  # a block rule entry: cuts (3, 128)
    cache.put(grown)
    assert cache.pinned is head  # a state that extends the head does not replace it
    assert cache.lookup(tuple(range(1, 200)))[1] == 128 and cache.hits == 1
    cache.clear()
    assert cache.pinned is None
    PrefixCache(0, 0, block=128, partial_reuse=True, head=3).pin(head)  # a disabled cache pins nothing


@pytest.mark.parametrize("model", engines_under_test())
def test_a_new_state_reuses_the_head_and_answers_like_no_cache(
    request: pytest.FixtureRequest, model: str
) -> None:
    gguf: Path = request.getfixturevalue(f"{model}_gguf")
    decisions = [
        {
            "id": f"d{i}",
            "state": state,
            "question": "Which queue should take it?",
            "options": [{"id": "billing"}, {"id": "tech"}, {"id": "sales"}],
        }
        for i, state in enumerate(
            [
                "A customer was charged twice for one invoice. " * 6,
                "The API returns 502 for every upload. " * 7,
            ]
        )
    ]
    on = DecisionEngine.load(engine_settings(prefix_cache_tokens=1 << 16), gguf)
    off = DecisionEngine.load(engine_settings(prefix_cache_tokens=0), gguf)
    try:
        warm = [on.score([d]) for d in decisions]
        cold = [off.score([d]) for d in decisions]
        head = on.head_cut
        prefix_user = decision_text(on.scaffold, decisions[0]["state"], "", []).prefix_user
        assert head == len(on.prompt_tokens([decisions[0]])[0]) - len(on.runtime.tokenize(prefix_user, False))
        assert on.prefix_cache.pinned is not None
        # the head is pinned at load; where the split does not matter (invariant numerics on attention
        # memory) the first state is saved at its end, and the second reuses the tokens the two share
        shared = common_prefix(*(tuple(on.prompt_tokens([d])[0]) for d in decisions))
        second = max(head, shared) if on.prefix_cache.any_cut else head
        assert [b.timing.prefix_reused_tokens for b in warm] == [head, second]
        # without a cache, the second goes on from what the context still holds of the first, cut back
        # to the tokens they share, where the split does not matter (``Prefill.resident``)
        assert [b.timing.prefix_reused_tokens for b in cold] == [0, shared if off.prefix_cache.any_cut else 0]
        assert on.prefix_cache_stats().hits == int(second > head)  # the head alone is not a hit
        for a, b in zip(warm, cold, strict=True):
            assert a.results[0].probabilities == b.results[0].probabilities
            assert a.results[0].option_logits == b.results[0].option_logits
        on.reset_prefix_cache()
        assert on.prefix_cache.pinned is None
        assert on.score([decisions[1]]).timing.prefix_reused_tokens == 0
        assert on.score([decisions[0]]).timing.prefix_reused_tokens == second  # the head pinned again
    finally:
        on.close()
        off.close()


@pytest.mark.parametrize("model", engines_under_test())
def test_a_grown_state_reuses_the_last_saved_state_whole(request: pytest.FixtureRequest, model: str) -> None:
    """A whole block ending in the prompt's trailer (``Question:``) is not cut: the state saved at the
    last cut is one the grown transcript shares. On a sliding-window model a longer saved state cannot be
    cut back, so a cut in the trailer used to make the next turn start cold."""
    gguf: Path = request.getfixturevalue(f"{model}_gguf")
    block = 32
    on = DecisionEngine.load(engine_settings(prefix_block_tokens=block, prefix_cache_tokens=1 << 16), gguf)
    off = DecisionEngine.load(engine_settings(prefix_block_tokens=block, prefix_cache_tokens=0), gguf)

    def turn(state: str) -> list[dict]:
        options = [{"id": "wait"}, {"id": "restart"}, {"id": "escalate"}]
        return [
            {"id": "next", "state": state, "question": "What should the agent do next?", "options": options}
        ]

    try:
        log = "".join(
            f"{i:02d} worker-{i % 7} reported queue depth {40 + 3 * i} and latency {i % 5}s.\n"
            for i in range(30)
        )
        for pad in range(block):  # grow the log until a whole block ends after its last letter or digit
            state = log + "note" + " ok" * pad + "."
            prefix = on.prompt_tokens(turn(state))[0]
            cuts = on.prefix_cuts(turn(state))
            if cuts != on.planner.block_cuts(len(prefix)):
                break
        else:
            pytest.fail("no state put a whole block in the trailer")
        assert on.planner.block_cuts(len(prefix))[-1] > cuts[-1] > 512  # past gemma's sliding window
        grown = state + "\n31 worker-3 recovered."
        on.score(turn(state))
        warm = on.score(turn(grown))
        cold = off.score(turn(grown))
        if on.prefix_cache.any_cut:  # saved at the prefix's end, reused up to the tokens both share
            shared = common_prefix(tuple(prefix), tuple(on.prompt_tokens(turn(grown))[0]))
            assert warm.timing.prefix_reused_tokens == shared > cuts[-1]
        else:
            assert warm.timing.prefix_reused_tokens == cuts[-1]
        assert warm.results[0].probabilities == cold.results[0].probabilities
        assert warm.results[0].option_logits == cold.results[0].option_logits
    finally:
        on.close()
        off.close()
