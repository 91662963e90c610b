"""The tiled layout (``engine.tile_layout``): flash attention in one unified KV stream, each decision's own
cells from a 64-cell tile line, bit for bit the same alone and beside others, on both real test models.

The comparisons are of whole logit rows with ``np.array_equal``; a control decodes the same suffix the
way the layout avoids (right after the prefix, fewer than 64 rows) and must differ, so the comparison
can fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from semif_adapter.engine.llama_backend import PREFIX_SEQ, Part
from semif_adapter.engine.tile_layout import TILE_CELLS, LayoutRefused, Run, TiledRuntime, holes, tile_line
from semif_adapter.errors import EngineFailure

TEXT = " ".join(
    f"Step {i}: the agent read ticket {1000 + 37 * i}, checked the refund log and noted queue depth {i % 9}."
    for i in range(80)
)
PREFIX = 200  # three tiles and 8 cells: the prefix's last tile is partial
SUFFIXES = ((600, 30), (700, 40), (800, 27))  # (offset into the tokens, length)


@pytest.fixture(scope="module", params=["gemma", "qwen"])
def tiled(request: pytest.FixtureRequest) -> Iterator[TiledRuntime]:
    runtime = TiledRuntime(
        request.getfixturevalue(f"{request.param}_gguf"), n_ctx=1024, n_batch=512, n_threads=2
    )
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def ids(tiled: TiledRuntime) -> list[int]:
    tokens = tiled.tokenize(TEXT, False)
    assert len(tokens) > 900
    return tokens


def suffix(ids: list[int], i: int) -> list[int]:
    offset, length = SUFFIXES[i]
    return ids[offset : offset + length]


def prefill(runtime: TiledRuntime, ids: list[int], cuts: list[int]) -> None:
    """The prefix's tokens up to ``cuts[-1]`` on sequence 0, a call per stretch (each 64+ rows)."""
    runtime.clear()
    for a, b in pairwise(cuts):
        runtime.decode_parts([Part(ids[a:b], a, PREFIX_SEQ, False)])


def answers(
    runtime: TiledRuntime, ids: list[int], order: list[int], cuts: tuple[int, ...] = (0, 128, PREFIX)
) -> dict[int, np.ndarray]:
    """Suffixes ``order`` in one tiled call after the prefix (its tokens past ``cuts[-1]`` as the
    call's tail); each one's logits row."""
    prefill(runtime, ids, list(cuts))
    for j in range(len(order)):
        runtime.fork(PREFIX_SEQ, 1 + j)
    runs = [Run(suffix(ids, i), PREFIX, 1 + j) for j, i in enumerate(order)]
    rows = runtime.decode_tiled(cuts[-1], ids[cuts[-1] : PREFIX], runs)
    got = {i: np.array(runtime.logits_at(row)) for i, row in zip(order, rows, strict=True)}
    for j in range(len(order)):
        runtime.drop(1 + j)
    return got


@pytest.fixture(scope="module")
def alone(tiled: TiledRuntime, ids: list[int]) -> dict[int, np.ndarray]:
    return {i: answers(tiled, ids, [i])[i] for i in range(len(SUFFIXES))}


def test_holes_put_each_run_on_a_tile_line() -> None:
    assert tile_line(200) == 256 and tile_line(256) == 256 and tile_line(0) == 0
    assert holes(200, 0, [30, 40], 0) == [(256, 286), (320, 360)]
    assert holes(200, 10, [20], 34) == [(200, 210), (256, 276), (276, 310)]
    assert all(a % TILE_CELLS == 0 for a, _ in holes(1000, 24, [1, 63, 64, 65], 0)[1:])


@pytest.mark.parametrize("order", [[0, 1], [1, 0], [0, 1, 2], [2, 0, 1]])
def test_each_decision_answers_alike_alone_and_beside_others(
    tiled: TiledRuntime, ids: list[int], alone: dict[int, np.ndarray], order: list[int]
) -> None:
    together = answers(tiled, ids, order)
    for i in order:
        assert np.array_equal(together[i], alone[i]), (
            f"suffix {i} moved by {np.abs(together[i] - alone[i]).max()}"
        )


@pytest.mark.parametrize("cuts", [(0, 64, PREFIX), (0, PREFIX), (0, 150)])
def test_the_prefix_split_and_a_tail_in_the_call_move_nothing(
    tiled: TiledRuntime, ids: list[int], alone: dict[int, np.ndarray], cuts: tuple[int, ...]
) -> None:
    """(0, 150): the prefix's last 50 tokens decoded in the decisions' call, on every decision's sequence."""
    together = answers(tiled, ids, [2, 0, 1], cuts)
    for i in range(len(SUFFIXES)):
        assert np.array_equal(together[i], alone[i])


def test_the_comparison_sees_another_layout(
    tiled: TiledRuntime, ids: list[int], alone: dict[int, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the 40-token suffix right after the prefix in a call of its own (no tile line,
    fewer than 64 rows: the per-row kernel; sequence 0's calls are otherwise padded to 64) answers
    differently."""
    prefill(tiled, ids, [0, 128, PREFIX])
    tiled.fork(PREFIX_SEQ, 1)
    monkeypatch.setattr(tiled, "min_rows", 0)
    row = tiled.decode_parts([Part(suffix(ids, 1), PREFIX, 1)])[0]
    moved = np.array(tiled.logits_at(row))
    tiled.drop(1)
    assert not np.array_equal(moved, alone[1])


def test_a_call_leaves_the_prefix_and_the_runs_only(tiled: TiledRuntime, ids: list[int]) -> None:
    prefill(tiled, ids, [0, 150])
    tiled.fork(PREFIX_SEQ, 1)
    tiled.decode_tiled(150, ids[150:PREFIX], [Run(ids[600:620], PREFIX, 1)])  # 70 rows: no filler
    pos_max = [int(tiled.lib.llama_memory_seq_pos_max(tiled.memory, s)) for s in range(tiled.filler_seq + 1)]
    assert pos_max[PREFIX_SEQ] == PREFIX - 1  # the tail stays on sequence 0
    assert pos_max[1] == PREFIX + 19
    assert pos_max[2:] == [-1] * (tiled.filler_seq - 1)  # no spacer, no filler left


def test_a_call_it_cannot_make_is_refused_before_it_starts(tiled: TiledRuntime, ids: list[int]) -> None:
    prefill(tiled, ids, [0, PREFIX])
    tiled.fork(PREFIX_SEQ, 1)
    with pytest.raises(EngineFailure, match="n_batch"):
        tiled.decode_tiled(PREFIX, [], [Run(ids[:600], PREFIX, 1)])
    with pytest.raises(EngineFailure, match="sequence 0 does not end"):
        tiled.decode_tiled(PREFIX - 1, [], [Run(ids[600:640], PREFIX, 1)])
    with pytest.raises(EngineFailure, match="distinct decision sequences"):
        tiled.decode_tiled(PREFIX, [], [Run(ids[600:640], PREFIX, 1), Run(ids[700:740], PREFIX, 1)])
    assert int(tiled.lib.llama_memory_seq_pos_max(tiled.memory, 1)) == PREFIX - 1  # only the fork's copy


def test_recurrent_memory_is_refused(hybrid_gguf: Path) -> None:
    with pytest.raises(LayoutRefused, match="recurrent and hybrid"):  # the engine then loads streams
        TiledRuntime(hybrid_gguf, n_ctx=512, n_batch=512, n_threads=2)
