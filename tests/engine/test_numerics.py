"""Numerics: the call planner's rules, the probe at load, and bit-identical answers in both modes.

The planner (``calls``) is checked against llama.cpp's own split rule; the probe on the real models and
the random hybrid and recurrent fixtures (which mode each gets is printed with ``-s`` and asserted to
follow from what the probe measured), and the real models with flash attention on (every piece padded
to its 64-row tile); a configuration that is not invariant (flash attention without that padding) must
fall back to the fixed split, or refuse to start when invariance is demanded. Then the answers, on the
same engines: a request of more decisions than one call holds, with suffix lengths close enough that
they cannot all share a call, gives every decision exactly what it gives alone, in any order, cache on
or off; and the fixed split keeps its own guarantees.
"""

from __future__ import annotations

import logging
import random
import shutil
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semif_adapter.engine import DecisionEngine, decision_engine, llama_backend, probes, tile_layout
from semif_adapter.engine.branches import tiled_calls
from semif_adapter.engine.calls import (
    KV_CELL_ROUNDING,
    SHARED_CALL_CELLS,
    equal_split,
    floored,
    group_calls,
    kv_span,
    padded_lengths,
    pieces,
    shares_safely,
    wasted_cells,
)
from semif_adapter.engine.llama_backend import FLASH_TILE_ROWS, LlamaRuntime, Part
from semif_adapter.engine.numerics import (
    FIXED_SPLIT,
    GPU_BACKEND_REASON,
    INVARIANT,
    PADDED,
    VerdictCache,
    _judged,
)
from semif_adapter.errors import ModelLoadError
from tests.helpers.support import engine_settings

STATE = "Order 1182 was charged twice; the customer wants one charge refunded and the order kept."
OPTION_SETS = [
    ["refund", "keep"],
    ["refund", "keep", "escalate"],
    ["billing", "support", "fraud", "sales"],
    ["yes", "no"],
    ["now", "today", "this week", "later", "never"],
    ["a", "b", "c"],
    ["low", "medium", "high"],
    ["email", "phone"],
    ["agent", "bot", "manager", "nobody", "team lead", "billing lead"],
]


def decisions(state: object = STATE) -> list[dict]:
    """Nine decisions (more than one call holds by default), several with suffixes a token or two apart."""
    return [
        {
            "id": f"d{i}",
            "state": state,
            "question": ("What now?", "Which team?", "How soon should we act?")[i % 3],
            "options": [{"id": o} for o in options],
        }
        for i, options in enumerate(OPTION_SETS)
    ]


# --- the planner, against llama.cpp's split rule (no model) ---------------------------------------------
def test_equal_split_models_llama_cpp():
    # lockstep while every sequence in the chain has tokens; 22/23/23/23 leaves three one-token pieces
    assert equal_split([22, 23, 23, 23], 512) == [[22, 22, 22, 22], [0, 1, 1, 1]]
    # the micro-batch holds n_ubatch tokens at most: 8 sequences of 70 get 64 each, then 6
    assert equal_split([70] * 8, 512) == [[64] * 8, [6] * 8]
    # a finished sequence breaks the chain (sequential ids only)
    assert equal_split([10, 4, 10], 512) == [[4, 4, 4], [6, 0, 0], [0, 0, 6]]


def test_equal_split_with_the_stream_ids_a_call_really_has():
    # streams that hold agents' prefixes give a call ids that are not consecutive: llama.cpp chains a
    # sequence only to the one whose id is one more, so streams 1 and 3 never meet in a micro-batch
    assert equal_split([5, 5], 512, [1, 3]) == [[5, 0], [0, 5]]
    assert equal_split([40, 25, 60, 33], 512, [1, 2, 3, 4]) == [
        [25, 25, 25, 25],
        [15, 0, 0, 0],
        [0, 0, 8, 8],
        [0, 0, 27, 0],
    ]
    # 9 and 12 tokens in consecutive streams leave a 3-token piece; in streams 1 and 3 each goes whole
    assert not shares_safely([9, 12], 512, 8)
    assert shares_safely([9, 12], 512, 8, [1, 3])


def test_pieces_never_leave_a_short_remainder():
    assert pieces(0, 1030, 512, 8) == [(0, 512), (512, 1022), (1022, 1030)]
    assert pieces(0, 1025, 512, 8) == [(0, 512), (512, 1017), (1017, 1025)]
    assert pieces(5, 12, 512, 8) == [(5, 12)]  # a run shorter than a piece stays whole


def test_aligned_pieces_cut_a_long_run_at_every_cell_boundary():
    # a cold prompt after the 39-token template head: calls of one 256-cell unit each, ending on its
    # grid; the last line would leave 3 tokens, so that call ends 8 (a whole piece) before the run's end
    assert pieces(39, 1283, 512, 8, aligned=True) == [
        (39, 256), (256, 512), (512, 768), (768, 1024), (1024, 1275), (1275, 1283),
    ]  # fmt: skip
    assert pieces(508, 1600, 512, 8, aligned=True) == [
        (508, 768), (768, 1024), (1024, 1280), (1280, 1536), (1536, 1600),
    ]  # fmt: skip
    assert pieces(39, 400, 512, 8, aligned=True) == [(39, 256), (256, 400)]
    # a line 6 tokens in would make a short first piece: that call runs on to the next line
    assert pieces(250, 700, 512, 8, aligned=True) == [(250, 512), (512, 700)]
    # the plain split is untouched: one call of the limit, then the rest
    assert pieces(39, 1283, 512, 8) == [(39, 551), (551, 1063), (1063, 1283)]


def test_aligned_pieces_keep_a_short_run_whole_unless_the_grid_adds_no_call():
    # a run of one unit or less stays one call even across a line (a call more costs a weight pass)
    assert pieces(200, 400, 512, 8, aligned=True) == [(200, 400)]
    assert pieces(1200, 1290, 512, 8, aligned=True) == [(1200, 1290)]
    # with calls shorter than a unit (n_batch 128) the grid is taken where it adds no call
    assert pieces(200, 380, 128, 8, aligned=True) == [(200, 256), (256, 380)]
    assert pieces(100, 300, 128, 8, aligned=True) == pieces(100, 300, 128, 8) == [(100, 228), (228, 300)]


@given(
    st.integers(0, 3000),
    st.integers(1, 3000),
    st.sampled_from([8, 16, 32, 64]),
    st.sampled_from([128, 256, 512]),
)
def test_aligned_pieces_cover_the_run_in_safe_calls(start: int, length: int, min_piece: int, limit: int):
    spans = pieces(start, start + length, limit, min_piece, aligned=True)
    assert spans[0][0] == start and spans[-1][1] == start + length
    assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in pairwise(spans))
    assert all(b - a <= limit for a, b in spans)
    assert len(spans) == 1 or all(b - a >= min_piece for a, b in spans)
    if length > KV_CELL_ROUNDING:
        # no call crosses a line but one too close to its start for a whole piece
        for a, b in spans:
            inside = [g for g in range(a + 1, b) if g % KV_CELL_ROUNDING == 0]
            assert not inside or (len(inside) == 1 and inside[0] - a < min_piece)
    else:
        assert len(spans) <= len(pieces(start, start + length, limit, min_piece))


@given(st.lists(st.integers(1, 200), min_size=1, max_size=12), st.sampled_from([8, 16]), st.integers(1, 6))
def test_group_calls_cover_every_part_once_in_safe_calls(lengths: list[int], min_piece: int, width: int):
    calls = group_calls(lengths, 512, min_piece, width)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    for call in calls:
        assert len(call) <= width
        sizes = [lengths[i] for i in call]
        assert sizes == sorted(sizes)
        assert len(call) == 1 or shares_safely(sizes, 512, min_piece)


def test_a_call_attends_over_its_longest_span_and_sequences_far_apart_are_decoded_apart():
    """llama.cpp gives every stream of a call the longest span among them; the planner keeps the masked
    cells that costs within SHARED_CALL_CELLS per call saved (``benchmarks/shared_call_budget.py``:
    ~0.75 µs per row and cell on Qwen2.5-0.5B against ~21 ms per call saved)."""
    assert [kv_span(e) for e in (1, 256, 257, 1270, 1300)] == [256, 256, 512, 1280, 1536]
    assert wasted_cells([40, 40], [40, 40], [1000, 2000]) == 40 * 1024
    assert wasted_cells([40, 40], [40, 40], [1040, 2040]) == 40 * 768
    # a filler row pays for the whole span; a real row for the cells past its own
    assert wasted_cells([27, 37], [37, 37], [1000, 2000]) == 27 * 1024 + 10 * 2048
    # two agents a grid line apart still share; two 1,000 cells apart go in calls of their own
    assert group_calls([40, 40, 40, 40], 512, 8, 4, 0, [1270, 1270, 1300, 1300]) == [[0, 1, 2, 3]]
    assert group_calls([40, 40, 40, 40], 512, 8, 4, 0, [1000, 1000, 2000, 2000]) == [[0, 1], [2, 3]]
    assert group_calls([40, 40, 40, 40], 512, 8, 4, 0, [700, 1200, 1700, 2200]) == [[0, 1], [2, 3]]
    # without ends (flash attention skips masked tiles) lengths alone decide, as before
    assert group_calls([40, 40, 40, 40], 512, 8, 4, 0) == [[0, 1, 2, 3]]


@given(
    st.lists(st.tuples(st.integers(1, 200), st.integers(0, 6000)), min_size=1, max_size=12),
    st.integers(1, 6),
    st.sampled_from([0, 16]),
)
def test_calls_planned_with_ends_stay_safe_and_within_the_masked_cell_budget(
    parts: list[tuple[int, int]], width: int, pad_limit: int
):
    lengths = [n for n, _ in parts]
    ends = [start + n for n, start in parts]
    calls = group_calls(lengths, 512, 8, width, pad_limit, ends)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    for call in calls:
        own = [lengths[i] for i in call]
        widths = padded_lengths(own, pad_limit)
        assert len(call) <= width and (len(call) == 1 or shares_safely(widths, 512, 8))
        wasted = wasted_cells(own, widths, [ends[i] for i in call])
        assert wasted <= SHARED_CALL_CELLS * (len(call) - 1)
    if len({kv_span(e) for e in ends}) == 1 and pad_limit == 0:  # one span: the calls without ends
        assert calls == group_calls(lengths, 512, 8, width, pad_limit)


def test_filler_counts_against_the_budget_where_spans_differ():
    """A filler row attends over the call's whole span too: padding four 27-token suffixes to 37 to
    fill a call with agents ~700 cells apart cost more than the call it saved (a warm turn of four
    agents on 319- to 2,414-token transcripts: 5 calls with 30 filler rows, against 3 with every span
    sharing), so the planner counts filler like masked cells."""
    lengths = [27, 27, 27, 27, 37, 37, 37, 37]
    ends = [361, 1029, 1737, 2456, 371, 1039, 1747, 2466]
    calls = group_calls(lengths, 512, 8, 4, 16, ends)
    for call in calls:  # no 27-token suffix padded to 37 beside agents far away
        own = [lengths[i] for i in call]
        assert own == padded_lengths(own, 16) or len({kv_span(ends[i]) for i in call}) == 1
    # where the spans are one, filler is cheap and still buys the call: 36-39 tokens padded to 39
    assert group_calls([36, 37, 38, 39], 512, 8, 4, 16, [1000, 1001, 1002, 1003]) == [[0, 1, 2, 3]]


def test_padded_lengths_fall_on_levels_more_than_the_limit_apart():
    assert padded_lengths([36, 37, 38, 39], 16) == [39, 39, 39, 39]
    assert padded_lengths([10, 40, 30], 16) == [10, 40, 40]  # 30 pads to 40; 10 would need 30 tokens
    assert padded_lengths([36, 37, 38, 39], 0) == [36, 37, 38, 39]
    # equal-split of the padded call: one micro-batch instead of four with three 1-token pieces
    assert len(equal_split(padded_lengths([36, 37, 38, 39], 16), 512)) == 1
    assert len(equal_split([36, 37, 38, 39], 512)) == 4


@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=12),
    st.sampled_from([8, 16]),
    st.integers(1, 6),
    st.sampled_from([0, 16, 32]),
)
def test_padded_calls_are_safe_and_pad_each_part_by_at_most_the_limit(
    lengths: list[int], min_piece: int, width: int, pad_limit: int
):
    calls = group_calls(lengths, 512, min_piece, width, pad_limit)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    for call in calls:
        sizes = [lengths[i] for i in call]
        widths = padded_lengths(sizes, pad_limit)
        assert all(0 <= w - n <= pad_limit for w, n in zip(widths, sizes, strict=True))
        assert widths == sorted(widths)  # the order the sequence ids follow stays shortest first
        assert len(call) <= width and (len(call) == 1 or shares_safely(widths, 512, min_piece))
    near = min(lengths) >= min_piece and max(lengths) - min(lengths) <= pad_limit
    if pad_limit and near and max(lengths) * width <= 512:  # nearly equal: as few calls as streams allow
        assert len(calls) == -(-len(lengths) // width)


def test_floored_parts_share_calls_without_a_short_piece():
    """Flash attention: parts are planned at 64 rows or more, so llama.cpp's split of any call the planner
    makes gives every sequence at least 64 rows (its tiled path)."""
    assert floored([20, 64, 90], 64) == [64, 64, 90] and floored([20, 90], 0) == [20, 90]
    lengths = floored([20, 38, 41, 70, 150, 300], 64)
    for call in group_calls(lengths, 512, 64, 4, 128):
        widths = padded_lengths([lengths[i] for i in call], 128)
        assert min(n for batch in equal_split(widths, 512) for n in batch if n) >= 64


def test_padding_a_padded_part_keeps_where_its_real_tokens_end():
    part = Part([5, 6, 7], 10, 1).padded(5)
    twice = part.padded(64)
    assert (part.filler, part.end) == (2, 13)
    assert (len(twice.tokens), twice.filler, twice.end) == (64, 61, 13)


def test_a_padding_check_that_moved_keeps_the_mode_but_not_the_padding():
    checks = {"suffixes in one call": 0.0, "padded suffixes in one call": 0.25}
    verdict = _judged(checks, 8, True)
    assert verdict.mode == INVARIANT and verdict.pad_limit == 0 and "padding moved" in verdict.reason
    assert _judged({"suffixes in one call": 0.0}, 8, True).pad_limit == 16
    moved = _judged({"suffixes in one call": 0.5, "padded suffixes in one call": 0.0}, 8, True)
    assert moved.mode == FIXED_SPLIT


@given(st.integers(0, 3000), st.integers(0, 3000), st.sampled_from([8, 16, 32]))
def test_pieces_cover_the_run(a: int, b: int, min_piece: int):
    start, end = min(a, b), max(a, b)
    spans = pieces(start, end, 512, min_piece)
    assert [x for span in spans for x in range(*span)] == list(range(start, end))
    assert all(y - x <= 512 for x, y in spans)
    assert len(spans) <= 1 or all(y - x >= min_piece for x, y in spans)


# --- the probe ---------------------------------------------------------------------------------------------
def test_the_mode_follows_from_what_the_probe_measured(numerics_engine: DecisionEngine):
    engine = numerics_engine
    verdict, info = engine.verdict, engine.model_info
    print(f"\n{info.architecture}: {info.numerics} ({info.numerics_reason})")
    assert info.numerics == verdict.mode and info.numerics_reason == verdict.reason
    if verdict.mode == INVARIANT:
        assert verdict.min_piece >= 1 and verdict.checks
        proven = {n: g for n, g in verdict.checks.items() if not n.startswith(("pieces of ", PADDED))}
        assert proven and all(gap == 0.0 for gap in proven.values())
        assert info.batch_sequences == engine.runtime.n_seq_max - 1 >= 2
        if engine.tiled:  # its own probe: no piece search, no padding (filler is the runtime's)
            assert info.kv_layout == "tiled" and verdict.reason.startswith("tiled layout: ")
            assert verdict.pad_limit == info.numerics_pad_limit == 0
            # several requests a call (short turns, a region each) but on a sliding window
            regions = engine.runtime.n_swa == 0
            assert info.max_batch_requests == (engine.settings.max_batch_requests if regions else 1)
            assert any(name.startswith("two requests in one call") for name in verdict.checks) == regions
            return
        assert info.kv_layout == "streams"
        padding = [g for n, g in verdict.checks.items() if n.startswith(PADDED)]
        assert padding  # the padding checks ran; padding is used exactly when they all agreed
        assert verdict.pad_limit == (2 * verdict.min_piece if all(g == 0.0 for g in padding) else 0)
        assert info.numerics_pad_limit == engine.prefill.pad_limit == verdict.pad_limit
    else:
        assert info.batch_sequences == 1 and not engine.runtime.invariant
        assert info.numerics_pad_limit == engine.prefill.pad_limit == 0


@pytest.mark.parametrize("name", ["gemma", "qwen", "gemma_flash", "qwen_flash"])
def test_the_real_models_run_invariant_on_this_cpu(request: pytest.FixtureRequest, name: str):
    engine = request.getfixturevalue(f"{name}_engine")
    assert engine.model_info.numerics == INVARIANT, engine.model_info.numerics_reason
    assert engine.model_info.numerics_pad_limit == 2 * engine.min_piece, engine.model_info.numerics_reason
    if engine.settings.flash_attention:  # every piece padded to the tiled kernel's rows
        assert engine.runtime.min_rows == FLASH_TILE_ROWS == engine.min_piece
        assert engine.scoring.numerics.startswith(f"invariant.p{FLASH_TILE_ROWS}.fa-on.")
    else:
        assert engine.runtime.min_rows == 0 and ".fa-off." in engine.scoring.numerics


def test_a_tiled_layout_that_is_not_invariant_falls_back_to_streams(
    gemma_gguf: Path, hybrid_gguf: Path, monkeypatch: pytest.MonkeyPatch
):
    """The tiled layout's probe must see a layout whose lines are not the kernel's tiles (16-cell lines:
    a decision's cells then sit elsewhere against the 64-cell tiles beside others than alone) and the
    engine load the stream layout instead; hybrid memory cannot take the layout at all."""
    monkeypatch.setattr(tile_layout, "TILE_CELLS", 16)
    settings = engine_settings(n_ctx=1024, kv_layout="tiled", numerics_probe_cache=False)
    engine = DecisionEngine.load(settings, gemma_gguf)
    try:
        assert not engine.tiled and engine.model_info.kv_layout == "streams"
        assert engine.model_info.numerics == INVARIANT and ".fa-off." in engine.scoring.numerics
    finally:
        engine.close()
    monkeypatch.undo()
    hybrid = DecisionEngine.load(settings, hybrid_gguf)
    try:
        assert not hybrid.tiled and hybrid.model_info.kv_layout == "streams"
    finally:
        hybrid.close()


def test_a_model_that_does_not_load_ends_start_up_without_a_second_layout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Only the tiled layout's own refusals (``LayoutRefused``) send the engine to the stream layout: a
    file llama.cpp cannot load fails once, with llama.cpp's reason, and is not loaded a second time."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    settings = engine_settings(
        n_ctx=1024, kv_layout="tiled", numerics_probe_cache=False, verify_manifest=False
    )
    with caplog.at_level(logging.WARNING), pytest.raises(ModelLoadError) as caught:
        DecisionEngine.load(settings, broken)
    assert not isinstance(caught.value, tile_layout.LayoutRefused)
    assert "broken.gguf" in str(caught.value)
    assert not [r for r in caplog.records if "kv layout" in r.getMessage()]


def test_tiled_calls_keep_to_the_batch_and_the_sequences() -> None:
    """The tail rides in the first call where it fits with its first run; runs fill calls in order up to
    ``width`` runs and ``n_batch`` rows; a run longer than a call goes on sequence 0 alone."""
    assert tiled_calls(50, [30, 40, 600, 20], 512, 4) == (True, [[0, 1, 3]], [2])
    assert tiled_calls(0, [10] * 5, 512, 4) == (False, [[0, 1, 2, 3], [4]], [])
    assert tiled_calls(400, [100, 100], 512, 4) == (True, [[0], [1]], [])
    assert tiled_calls(500, [100, 20], 512, 4) == (False, [[0, 1]], [])
    assert tiled_calls(10, [513], 512, 4) == (False, [], [0])


def test_a_configuration_that_is_not_invariant_falls_back_on_gemma(
    gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch
):
    """Flash attention without its padding: a sequence that brings fewer than 64 rows to a call takes
    the CPU kernel's per-row path, so its numbers follow the call. The probe must see it and keep the
    fixed split, or refuse to start when invariance is demanded."""
    monkeypatch.setattr(llama_backend, "FLASH_TILE_ROWS", 0)  # the runtime pads no piece
    settings = engine_settings(n_ctx=1024, flash_attention=True, numerics_probe_cache=False)
    engine = DecisionEngine.load(settings, gemma_gguf)
    try:
        assert engine.model_info.numerics == FIXED_SPLIT
        assert "moved" in engine.model_info.numerics_reason
        assert not engine.runtime.invariant and engine.model_info.batch_sequences == 1
        assert engine.score(decisions()[:2]).results[0].probabilities  # and it serves
    finally:
        engine.close()
    demanded = engine_settings(
        n_ctx=1024, flash_attention=True, numerics="invariant", numerics_probe_cache=False
    )
    with pytest.raises(ModelLoadError, match=r"SEMIF_NUMERICS=invariant.*moved"):
        DecisionEngine.load(demanded, gemma_gguf)


def test_a_gpu_backend_keeps_the_fixed_split_unprobed_on_gemma(
    gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch
):
    """A registered GPU device (faked: this machine has none) keeps the fixed split without a probe: on
    an H200 the probe agreed ten ways, then a nine-decision request moved answers. Invariance demanded
    refuses to start and says why."""
    import llama_cpp

    probed: list[int] = []
    made: list[bool] = []  # the invariant flag of every runtime the load creates
    real_runtime = decision_engine.LlamaRuntime

    def runtime(*args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(kwargs["invariant"])
        return real_runtime(*args, **kwargs)

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(probes, "probe", lambda *args: probed.append(1))  # must not run
    monkeypatch.setattr(decision_engine, "LlamaRuntime", runtime)
    settings = engine_settings(n_ctx=1024, numerics_probe_cache=False)
    engine = DecisionEngine.load(settings, gemma_gguf)
    try:
        assert engine.model_info.numerics == FIXED_SPLIT and not probed
        assert made == [False]  # one load, never an invariant context only to throw it away
        assert engine.model_info.numerics_reason == GPU_BACKEND_REASON
        assert not engine.runtime.invariant and engine.model_info.batch_sequences == 1
        assert engine.score(decisions()[:2]).results[0].probabilities  # and it serves
    finally:
        engine.close()
    demanded = engine_settings(n_ctx=1024, numerics="invariant", numerics_probe_cache=False)
    with pytest.raises(ModelLoadError, match=r"SEMIF_NUMERICS=invariant.*GPU backend"):
        DecisionEngine.load(demanded, gemma_gguf)
    assert made == [False]  # refused before loading the model


def test_gemma_probe_ignores_request_limits_and_a_context_too_small_keeps_the_fixed_split(gemma_gguf: Path):
    """The probe is no caller's request: a tight SEMIF_MAX_REQUEST_TOKENS does not stop it. A context
    that cannot hold its prompt cannot prove anything: the fixed split, and the reason says why."""
    tight = DecisionEngine.load(
        engine_settings(n_ctx=512, max_request_tokens=300, numerics_probe_cache=False), gemma_gguf
    )
    try:
        assert tight.model_info.numerics != FIXED_SPLIT, tight.model_info.numerics_reason
    finally:
        tight.close()
    small = DecisionEngine.load(engine_settings(n_ctx=256, numerics_probe_cache=False), gemma_gguf)
    try:
        assert small.model_info.numerics == FIXED_SPLIT
        assert "context" in small.model_info.numerics_reason and "256" in small.model_info.numerics_reason
        assert small.score(decisions()[:1]).results[0].probabilities  # and it serves
    finally:
        small.close()


def test_the_verdict_is_kept_per_library_and_model_gemma(gemma_gguf: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = DecisionEngine.load(engine_settings(n_ctx=1024), gemma_gguf)
    first.close()
    kept = list((tmp_path / "semif-adapter" / "numerics").glob("*.json"))
    assert len(kept) == 1 and not first.verdict.cached
    second = DecisionEngine.load(engine_settings(n_ctx=1024), gemma_gguf)
    second.close()
    assert second.verdict.cached and second.verdict.mode == first.verdict.mode
    other = DecisionEngine.load(engine_settings(n_ctx=1024, batch_sequences=2), gemma_gguf)
    other.close()
    assert not other.verdict.cached  # another configuration is probed again
    # the same model file at another path with another mtime (SageMaker extracts the model anew into a
    # fresh folder at every start): the same bytes, so the kept verdict
    elsewhere = tmp_path / "opt-ml-model" / gemma_gguf.name
    elsewhere.parent.mkdir()
    shutil.copyfile(gemma_gguf, elsewhere)
    again = DecisionEngine.load(engine_settings(n_ctx=1024), elsewhere)
    again.close()
    assert again.verdict.cached and again.sha256 == first.sha256
    # the same library file reporting other CPU kernels (another plugin picked on another machine's CPU,
    # the cache folder carried there): probed again, never the kept verdict
    reported = LlamaRuntime.system_info
    monkeypatch.setattr(LlamaRuntime, "system_info", lambda self: reported(self) + " | AVX512 = 1 |")
    moved = DecisionEngine.load(engine_settings(n_ctx=1024), gemma_gguf)
    moved.close()
    assert not moved.verdict.cached
    assert len(list((tmp_path / "semif-adapter" / "numerics").glob("*.json"))) == 3


def test_the_verdict_key_names_every_library_files_bytes_the_model_and_the_cpu_kernels(tmp_path: Path):
    plugin = tmp_path / "libggml-cpu-haswell.so"
    plugin.write_bytes(b"one build")
    base = tmp_path / "libggml-base.so"
    base.write_bytes(b"ggml")
    model, config = "ab" * 32, {"n_ctx": 1024, "cpu_kernels": "CPU : AVX2 = 1 |"}
    key = VerdictCache.key([base, plugin], model, config)
    assert key == VerdictCache.key([base, plugin], model, dict(config))
    assert key != VerdictCache.key([base, plugin], model, {**config, "cpu_kernels": "CPU : AVX512 = 1 |"})
    assert key != VerdictCache.key([base, plugin], "cd" * 32, config)  # another model
    assert key != VerdictCache.key([plugin], model, config)  # a library less
    copy = tmp_path / "venv" / plugin.name  # the same build installed elsewhere: the same bytes
    copy.parent.mkdir()
    copy.write_bytes(b"one build")
    assert key == VerdictCache.key([base, copy], model, config)
    plugin.write_bytes(b"one bui1d")  # rebuilt in place: same size, other bytes
    assert key != VerdictCache.key([base, plugin], model, config)


# --- answers -------------------------------------------------------------------------------------------
def _answers(engine: DecisionEngine, batch: list[dict], *, cold: bool = True) -> dict[str, tuple]:
    if cold:
        engine.reset_prefix_cache()
    return {r.id: (r.probabilities, r.option_logits) for r in engine.score(batch).results}


def test_every_decision_of_a_large_request_answers_as_alone(numerics_engine: DecisionEngine):
    engine = numerics_engine
    batch = decisions()
    alone = {d["id"]: _answers(engine, [d])[d["id"]] for d in batch}
    assert _answers(engine, batch) == alone
    shuffled = batch[:]
    random.Random(5).shuffle(shuffled)
    assert _answers(engine, shuffled) == alone
    later = {d["id"] for d in batch[3:]}
    assert _answers(engine, batch[3:], cold=False) == {k: v for k, v in alone.items() if k in later}
    assert _answers(engine, list(reversed(batch)), cold=False) == alone  # the kept prefix


def test_padding_merges_calls_and_moves_no_answer(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    """Suffixes a few tokens apart: padded, they share micro-batches (fewer passes over the weights,
    filler in the calls); every answer is the same bit for bit as with padding off, and as each decision
    alone. Where the probe did not prove padding, no call carries filler; with flash attention, padding
    off still brings every part to the tiled kernel's rows, and no further."""
    engine = numerics_engine
    floor = engine.runtime.min_rows
    batch = decisions()
    alone = {d["id"]: _answers(engine, [d])[d["id"]] for d in batch}
    if engine.tiled:  # no padding to prove: a tiled call's filler sits on a sequence of its own
        assert engine.prefill.pad_limit == 0 and _answers(engine, batch) == alone
        return
    calls: list[list[tuple[int, int]]] = []  # per call, each part's rows and filler
    passes: list[int] = []  # per call, the micro-batches llama.cpp splits it into
    real = engine.runtime.decode_parts

    def logged(parts, cancel=None):  # type: ignore[no-untyped-def]
        calls.append([(len(p.tokens), p.filler) for p in parts])
        passes.append(len(equal_split([len(p.tokens) for p in parts], engine.runtime.n_batch)))
        return real(parts, cancel)

    def past_floor(logged_calls: list[list[tuple[int, int]]]) -> bool:
        """Whether any part carries filler beyond what brings it to the floor."""
        return any(f > 0 and n > floor for call in logged_calls for n, f in call)

    monkeypatch.setattr(engine.runtime, "decode_parts", logged)
    padded = _answers(engine, batch)
    padded_calls, padded_passes = calls[:], sum(passes)
    calls[:], passes[:] = [], []
    if floor:  # flash attention: no sequence ever brings fewer rows to a call
        assert min(n for call in padded_calls for n, _ in call) >= floor
    if not engine.prefill.pad_limit:
        print(f"\n{engine.model_info.architecture}: no padding ({engine.model_info.numerics_reason})")
        assert padded == alone and not past_floor(padded_calls)
        return
    monkeypatch.setattr(engine.prefill, "pad_limit", 0)
    unpadded = _answers(engine, batch)
    assert padded == unpadded == alone
    assert not past_floor(calls)
    if floor:
        assert min(n for call in calls for n, _ in call) >= floor
        assert padded_passes <= sum(passes), (padded_calls, calls)
    else:
        assert past_floor(padded_calls)
        assert padded_passes < sum(passes), (padded_calls, calls)


def test_cache_off_equals_cache_on_with_a_grown_state(numerics_engine: DecisionEngine):
    engine = numerics_engine
    events = [{"t": i, "event": f"tool call {i} returned {i * 7} rows"} for i in range(12)]
    flash, layout = engine.settings.flash_attention, engine.settings.kv_layout
    off = DecisionEngine.load(
        engine_settings(prefix_cache_tokens=0, flash_attention=flash, kv_layout=layout),
        Path(engine.gguf_path),
    )
    try:
        for turn in (8, 9, 12):
            batch = decisions(events[:turn])[:3]
            assert _answers(engine, batch, cold=False) == _answers(off, batch, cold=False)
    finally:
        off.close()


def test_an_agent_turns_tail_rides_with_one_decision(
    numerics_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
):
    """A warm turn of two decisions: on memory that can drop a sequence's tail, the new event is decoded
    in sequence 0 in one call with one decision's suffix (no call of its own), the suffix's cells are
    dropped and the state at the prefix's end is saved, and the other decision starts from it; a
    recurrent or hybrid state keeps the event out of the suffixes' calls. Answers: bit for bit each
    decision's alone, cold, and the state saved at the end serves the turn again."""
    engine = numerics_engine
    runtime = engine.runtime
    events = [{"t": i, "event": f"tool call {i} returned {i * 7} rows"} for i in range(12)]
    # six new events: a tail longer than flash attention's 64-row floor; suffixes of two lengths
    before, turn = decisions(events[:6])[:2], decisions(events)[:2]
    alone = {d["id"]: _answers(engine, [d])[d["id"]] for d in turn}
    n = len(engine.prompt_tokens(turn)[0])
    calls: list[list[Part]] = []
    real = runtime._call

    def logged(parts, cancel):  # type: ignore[no-untyped-def]
        calls.append(list(parts))
        return real(parts, cancel)

    _answers(engine, before)  # the previous turn: its state is saved at its end
    monkeypatch.setattr(runtime, "_call", logged)
    warm = _answers(engine, turn, cold=False)
    monkeypatch.undo()
    assert warm == alone
    on_prefix = [p for call in calls for p in call if p.seq == llama_backend.PREFIX_SEQ]
    droppable = not (runtime.is_recurrent or runtime.is_hybrid)
    if not engine.prefill.invariant:
        return  # the fixed split: its own calls (test_the_fixed_split_keeps_single_equal_to_shared)
    if engine.tiled:  # the event rides in the decisions' tiled call: no call of sequence 0 at all
        if not engine.prefix_cache.any_cut:
            return  # a sliding window: every chunk is decoded (and its state kept) on its own
        assert not on_prefix, [[(len(p.tokens), p.start_pos, p.seq) for p in c] for c in calls]
        engine.score(decisions("Another state takes sequence 0.")[:1])
        again = engine.score(turn).results
        assert {r.id: (r.probabilities, r.option_logits) for r in again} == alone
        assert again[0].timing.prefix_reused_tokens == n  # the state filed once the event was in
        return
    if droppable and engine.prefix_cache.any_cut:
        assert len(on_prefix) == 1, [[(len(p.tokens), p.start_pos, p.seq) for p in c] for c in calls]
        assert on_prefix[0].start_pos < n < on_prefix[0].end  # the event, then a suffix, in one call
        assert len(calls) == 2, [[(len(p.tokens), p.start_pos, p.seq) for p in c] for c in calls]
        engine.score(decisions("Another state takes sequence 0.")[:1])
        again = engine.score(turn).results
        assert {r.id: (r.probabilities, r.option_logits) for r in again} == alone
        assert again[0].timing.prefix_reused_tokens == n  # the state saved after the suffix's drop
    elif not droppable:
        assert all(p.end <= n for p in on_prefix), "a suffix on a state that cannot drop it"


def test_the_rider_leaves_the_others_the_fewest_passes(qwen_engine: DecisionEngine, monkeypatch):
    """Which decision takes the tail: the one whose absence leaves the rest the fewest micro-batches of
    llama.cpp's split, the longest among equals (unpadded, no flash attention)."""
    branches = qwen_engine.branches
    monkeypatch.setattr(qwen_engine.prefill, "pad_limit", 0)
    assert qwen_engine.runtime.min_rows == 0
    assert branches.rider([27, 47], 1000) == 1  # either leaves one pass: the longer rides
    assert branches.rider([20, 40, 40], 1000) == 0  # 40 + 40 is one pass, 20 + 40 two
    assert branches.rider([40, 40, 20], 1000) == 2
    assert branches.rider([33], 1000) == 0


def test_the_fixed_split_keeps_single_equal_to_shared(fixed_engine: DecisionEngine):
    assert fixed_engine.model_info.numerics == FIXED_SPLIT
    assert fixed_engine.model_info.numerics_reason == "SEMIF_NUMERICS=fixed-split"
    batch = decisions()[:4]
    alone = {d["id"]: _answers(fixed_engine, [d])[d["id"]] for d in batch}
    assert _answers(fixed_engine, batch) == alone
    assert _answers(fixed_engine, batch[::-1], cold=False) == alone
