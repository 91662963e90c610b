"""Several requests in one tiled call (``TiledRuntime.decode_regions``): each request's prefix restored into
a region from a tile line, its tail and decisions laid out there as in its call alone — every logit row
bit for bit the row of the same request decoded alone (``decode_tiled`` on a prefix from cell 0), on
Qwen2.5-Coder-0.5B; gemma-3-270m's sliding window refuses several regions.

The comparisons are of whole logit rows with ``np.array_equal``; the control moves a region off its tile
line by a few cells and must see the numbers move, so the comparison can fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.engine.llama_backend import PREFIX_SEQ, Part
from semif_adapter.engine.tile_layout import MAX_SEQUENCES, Region, Run, TiledRuntime
from semif_adapter.errors import EngineFailure

TEXT = " ".join(
    f"Turn {i}: the agent opened case {2000 + 53 * i}, read the shipping log and saw {i % 7} delays."
    for i in range(90)
)


@dataclass(frozen=True)
class Request:
    """One request of the shared call: prefix, tail and decisions' suffixes, as token offsets and lengths
    into the test text (positions start at 0 for each: the prefixes are different texts)."""

    prefix: tuple[int, int]
    tail: int
    suffixes: tuple[tuple[int, int], ...]


#: prefixes of 200, 137 and 301 tokens (none on a tile line), tails of 20, 0 and 5, one to three decisions
REQUESTS = (
    Request((0, 200), 20, ((600, 30), (700, 40))),
    Request((100, 137), 0, ((800, 27),)),
    Request((300, 301), 5, ((650, 33), (750, 22), (850, 45))),
)


def span(ids: list[int], at: tuple[int, int]) -> list[int]:
    return ids[at[0] : at[0] + at[1]]


class Shapes:
    """Each request's tokens, the saved state of its prefix and its decisions' rows decoded alone."""

    def __init__(self, runtime: TiledRuntime) -> None:
        self.runtime = runtime
        self.ids = runtime.tokenize(TEXT, False)
        assert len(self.ids) > 900
        self.states = [self._prefill(r) and runtime.save_seq(PREFIX_SEQ) for r in REQUESTS]
        self.alone = [self._alone(r) for r in REQUESTS]

    def prefix(self, r: Request) -> list[int]:
        return span(self.ids, r.prefix)

    def tail(self, r: Request) -> list[int]:
        a = r.prefix[0] + r.prefix[1]
        return self.ids[a : a + r.tail]

    def _prefill(self, r: Request) -> bool:
        self.runtime.clear()
        self.runtime.decode_parts([Part(self.prefix(r), 0, PREFIX_SEQ, False)])
        return True

    def runs(self, r: Request, first_seq: int) -> list[Run]:
        start = r.prefix[1] + r.tail
        return [Run(span(self.ids, s), start, first_seq + k) for k, s in enumerate(r.suffixes)]

    def _alone(self, r: Request) -> list[np.ndarray]:
        """The request's call on its own: the prefix from cell 0, ``decode_tiled``."""
        self._prefill(r)
        runs = self.runs(r, 1)
        for run in runs:
            self.runtime.fork(PREFIX_SEQ, run.seq)
        rows = self.runtime.decode_tiled(r.prefix[1], self.tail(r), runs)
        got = [np.array(self.runtime.logits_at(row)) for row in rows]
        self.runtime.clear()
        return got

    def regions(self, order: list[int], in_place: bool = False) -> list[Region]:
        """The requests ``order`` as regions of one call, sequences numbered from 0; ``in_place``: the
        first one's prefix prefilled on its sequence instead of restored."""
        regions, seq = [], 0
        for k, i in enumerate(order):
            r = REQUESTS[i]
            state = None if in_place and k == 0 else self.states[i]
            regions.append(Region(seq, r.prefix[1], self.tail(r), self.runs(r, seq + 1), state))
            seq += 1 + len(r.suffixes)
        if in_place:
            self._prefill(REQUESTS[order[0]])
        return regions

    def together(self, order: list[int], in_place: bool = False) -> dict[int, list[np.ndarray]]:
        rows = self.runtime.decode_regions(self.regions(order, in_place))
        got = {
            i: [np.array(self.runtime.logits_at(row)) for row in r] for i, r in zip(order, rows, strict=True)
        }
        self.runtime.clear()
        return got


def regions_runtime(gguf: Path) -> TiledRuntime:
    return TiledRuntime(gguf, n_ctx=1024, n_batch=512, n_threads=2, n_seq_max=4, regions=3)


@pytest.fixture(scope="module")
def shapes(qwen_gguf: Path) -> Iterator[Shapes]:
    runtime = regions_runtime(qwen_gguf)
    yield Shapes(runtime)
    runtime.close()


def assert_alone(shapes: Shapes, got: dict[int, list[np.ndarray]]) -> None:
    for i, rows in got.items():
        for k, (row, alone) in enumerate(zip(rows, shapes.alone[i], strict=True)):
            assert np.array_equal(row, alone), (
                f"request {i} decision {k} moved by {np.abs(row - alone).max()} beside others"
            )


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1], [1, 2], [2]])
def test_each_request_answers_alike_alone_and_beside_others(shapes: Shapes, order: list[int]) -> None:
    assert_alone(shapes, shapes.together(order))


@pytest.mark.parametrize("order", [[0, 2], [1, 0, 2]])
def test_a_first_region_in_place_answers_alike(shapes: Shapes, order: list[int]) -> None:
    """The first request's prefix already on its sequence from cell 0 (as a prefill leaves it)."""
    assert_alone(shapes, shapes.together(order, in_place=True))


def test_the_comparison_sees_a_region_off_its_tile_line(
    shapes: Shapes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the second region 8 cells past its tile line answers differently (in at least one
    decision: one can come out the same, as gemma-3-270m's first one did in a run on that model)."""
    runtime = shapes.runtime
    monkeypatch.setattr(runtime, "_region_start", lambda cursor: -(-cursor // 64) * 64 + 8)
    got = shapes.together([0, 2])
    assert all(np.array_equal(a, b) for a, b in zip(got[0], shapes.alone[0], strict=True))  # in place
    assert not all(np.array_equal(a, b) for a, b in zip(got[2], shapes.alone[2], strict=True))


def test_a_call_leaves_each_request_its_prefix_and_tail(shapes: Shapes) -> None:
    runtime = shapes.runtime
    regions = shapes.regions([2, 0])
    runtime.decode_regions(regions)
    pos_max = [int(runtime.lib.llama_memory_seq_pos_max(runtime.memory, s)) for s in range(runtime.seqs)]
    for region in regions:
        assert pos_max[region.seq] == region.prefix_end + len(region.tail) - 1  # the state to file
        for run in region.runs:
            assert pos_max[run.seq] == run.start_pos + len(run.tokens) - 1
    others = range(runtime.first_spacer, runtime.filler_seq + 1)
    assert all(int(runtime.lib.llama_memory_seq_pos_max(runtime.memory, s)) == -1 for s in others)
    # a saved state of the first region's sequence holds its prefix and tail, decoded as alone
    state = runtime.save_seq(regions[0].seq)
    runtime.clear()
    r = REQUESTS[2]
    runtime.restore_seq(PREFIX_SEQ, state)
    runs = shapes.runs(r, 1)
    end = r.prefix[1] + r.tail
    for run in runs:
        runtime.fork(PREFIX_SEQ, run.seq)
    rows = runtime.decode_tiled(end, [], runs)
    assert np.array_equal(np.array(runtime.logits_at(rows[0])), shapes.alone[2][0])
    runtime.clear()


def test_a_call_it_cannot_make_is_refused_before_it_starts(shapes: Shapes) -> None:
    runtime = shapes.runtime
    regions = shapes.regions([0, 1, 2])
    with pytest.raises(EngineFailure, match=r"1\.\.3 regions"):
        runtime.decode_regions([*regions, regions[0]])
    with pytest.raises(EngineFailure, match="distinct sequences"):
        runtime.decode_regions([regions[0], Region(0, 137, [], regions[1].runs, shapes.states[1])])
    with pytest.raises(EngineFailure, match="only the first region"):
        runtime.decode_regions([regions[0], Region(3, 137, [], regions[1].runs)])
    with pytest.raises(EngineFailure, match="n_batch"):
        long = [Run(shapes.ids[:600], 200, 1)]
        runtime.decode_regions([Region(0, 200, [], long, shapes.states[0])])


def test_a_sliding_window_model_takes_one_request_per_call(gemma_gguf: Path) -> None:
    """gemma-3-270m: one region still runs (a request alone); two are refused before any cell moves."""
    runtime = regions_runtime(gemma_gguf)
    try:
        shapes = Shapes(runtime)
        assert_alone(shapes, shapes.together([2]))
        with pytest.raises(EngineFailure, match="sliding window"):
            runtime.decode_regions(shapes.regions([0, 1]))
    finally:
        runtime.close()


@pytest.mark.parametrize(("n_seq_max", "asked"), [(5, 64), (64, 64)])
def test_regions_fit_llama_cpps_sequences(qwen_gguf: Path, n_seq_max: int, asked: int) -> None:
    """``SEMIF_MAX_BATCH_REQUESTS`` up to 64 with ``SEMIF_BATCH_SEQUENCES`` up to 63 would ask for more
    sequences than llama.cpp takes: the runtime holds as many regions as fit, and loads."""
    runtime = TiledRuntime(qwen_gguf, n_ctx=512, n_batch=512, n_threads=2, n_seq_max=n_seq_max, regions=asked)
    try:

        def needs(regions: int) -> int:
            return n_seq_max * regions + TiledRuntime._spacers(512, n_seq_max, regions) + 1

        assert 1 <= runtime.regions < asked
        assert runtime.filler_seq + 1 == needs(runtime.regions) <= MAX_SEQUENCES
        assert runtime.regions == 1 or needs(runtime.regions + 1) > MAX_SEQUENCES
    finally:
        runtime.close()
