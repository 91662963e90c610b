"""Which numerics the engine runs, proven at load: batch-invariant kernels, or the fixed split.

llama.cpp's numbers for a token depend on how the tokens around it were grouped into calls, unless the
kernels it picks are the same whatever the grouping. On CPU they are, in one configuration: weight
repacking off (``use_extra_bufts``: repacked weights and AMX take batch-shaped kernels), and one KV
stream per sequence (``kv_unified = false``: a sequence's cells sit where they would if it were alone,
and attention reduces them in cell order), with one rule the planner keeps (``calls``: no sequence ever
gets a short piece of a micro-batch) and one shape it may use where the probe allows it (``calls``: runs
of nearly one length padded with filler to one length). Flash attention is off by default; on
(``SEMIF_FLASH_ATTENTION``), its CPU kernel is tiled for pieces of 64 rows or more and per-row below, so
the runtime pads every piece to 64 rows (``LlamaRuntime.min_rows``) and ``min_piece`` becomes 64.
Nothing promises this for another CPU build (ARM i8mm) or another model (a recurrent layer that
computes in token chunks), so it is not assumed: :func:`probe` decodes one prompt several ways on the
library and model actually loaded and compares the logits bit for bit. A GPU backend is not probed at
all: :func:`unprobed_verdict` keeps the fixed split there (:data:`GPU_BACKEND_REASON`).

* **invariant**: every way agreed. Decisions of a request share one call, a prefix tail is decoded
  with the suffix after it, and any token boundary is a valid place to reuse a saved state.
* **fixed-split**: some way differed (the reason names it). Every prompt is decoded in the same chunks,
  each decision's suffix in a call of its own, which keeps answers bit-identical at some cost in speed.

The **tiled layout** (``SEMIF_KV_LAYOUT=tiled``, ``tile_layout``) is invariant by another argument:
one unified KV stream with flash attention, every decision's cells from a 64-cell tile line.
:func:`probe_tiled` decodes the probe prompt its own ways on that runtime; where a way moves a bit (a
build whose flash-attention tiles are not 64 cells, say), the engine falls back to the stream layout.

The verdict is kept per library bytes, CPU kernels, model sha256 and configuration (``VerdictCache``),
so a restart of the same image on the same model and machine skips the probe, wherever the model lies.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from semif_adapter.engine.calls import PIECE_CANDIDATES, pieces, shares_safely
from semif_adapter.engine.llama_backend import FLASH_TILE_ROWS, PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.engine.tile_layout import Region, Run, TiledRuntime
from semif_adapter.errors import ModelLoadError
from semif_adapter.model.demo_models import sha256_file
from semif_adapter.user_cache import cache_folder

log = logging.getLogger(__name__)

INVARIANT = "invariant"
FIXED_SPLIT = "fixed-split"
#: Bumped whenever the probe's cases change, so a cached verdict of an older probe is not reused.
PROBE_VERSION = 8
#: Why a GPU backend keeps the fixed split without a probe. Its matrix kernels are chosen by each call's
#: total rows (on CUDA: mmvq for a few rows, mmq or cuBLAS above, each reducing in its own order), and a
#: backend may take large calls even with no layer offloaded, so a probe of a few call shapes cannot
#: stand for every call a server makes. Seen on an H200 (benchmarks/results/gpu-nvidia-h200.md): the
#: probe agreed ten ways on a dense model, then a nine-decision request moved answers by 4e-5.
GPU_BACKEND_REASON = (
    "a GPU backend is loaded: its kernels are chosen by each call's total rows, which no probe of a few "
    "call shapes covers"
)


@dataclass(frozen=True)
class Verdict:
    """What the probe found: ``mode`` and why, with each case's largest logit difference."""

    mode: str
    reason: str
    checks: dict[str, float] = field(default_factory=dict)
    #: the shortest piece of a sequence a micro-batch may hold (``calls``); 0 when none was proven
    min_piece: int = 0
    #: whether a single-token piece moved the logits (informative: why ``calls`` forbids short pieces)
    single_token_piece_moves: bool | None = None
    #: the filler tokens a run may get to share a call (``calls.padded_lengths``); 0 when padding moved
    #: the logits or was not proven
    pad_limit: int = 0
    cached: bool = False

    @property
    def invariant(self) -> bool:
        return self.mode == INVARIANT

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data


def unprobed_verdict(numerics: str, gpu_backend: bool) -> Verdict | None:
    """The verdict that needs no probe, or None when the probe decides.

    Decided before any model load, so no invariant context is built only to be dropped: the
    settings force the fixed split, or a GPU backend is loaded (:data:`GPU_BACKEND_REASON`).
    ``SEMIF_NUMERICS=invariant`` on a GPU backend refuses to start rather than run unproven.
    """
    if numerics == FIXED_SPLIT:
        return Verdict(FIXED_SPLIT, "SEMIF_NUMERICS=fixed-split")
    if not gpu_backend:
        return None
    if numerics == INVARIANT:
        raise ModelLoadError(
            f"SEMIF_NUMERICS=invariant, but {GPU_BACKEND_REASON}; use SEMIF_NUMERICS=auto or fixed-split"
        )
    log.warning("numerics: the fixed split (%s)", GPU_BACKEND_REASON)
    return Verdict(FIXED_SPLIT, GPU_BACKEND_REASON)


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


class _Decoder:
    """The probe's decoding moves on one runtime: sequence 0 holds the prefix, branches are copies."""

    def __init__(self, runtime: LlamaRuntime, prefix: Sequence[int], tail: int) -> None:
        self.runtime = runtime
        self.prefix = list(prefix)
        self.tail_at = len(self.prefix) - tail
        runtime.clear(wipe=False)
        runtime.decode_parts([Part(self.prefix[: self.tail_at], 0, PREFIX_SEQ, False)])
        self.head_state = runtime.save_seq(PREFIX_SEQ)  # the prefix but its tail, decoded once

    def tail(self, size: int, min_piece: int, suffix: Sequence[int] = ()) -> list[np.ndarray]:
        """Sequence 0 holds the whole prefix again, its tail decoded in calls of ``size`` tokens; with
        ``suffix``, the tail's last call carries it too (its logits are returned)."""
        runtime, at = self.runtime, self.tail_at
        runtime.restore_seq(PREFIX_SEQ, self.head_state)
        spans = pieces(at, len(self.prefix), size, min_piece)
        for a, b in spans[:-1]:
            runtime.decode_parts([Part(self.prefix[a:b], a, PREFIX_SEQ, False)])
        a, b = spans[-1]
        rows = runtime.decode_parts([Part([*self.prefix[a:b], *suffix], a, PREFIX_SEQ, bool(suffix))])
        return [runtime.logits_at(r).copy() for r in rows]

    def branches(
        self, suffixes: Sequence[Sequence[int]], first_seq: int = 1, split: int = 0, width: int = 0
    ) -> list[np.ndarray]:
        """Each suffix on its own copy of the prefix, all in ONE call (``split``: a lone suffix's last
        ``split`` tokens in a second call; ``width``: each padded with filler to that length); the last
        real position's logits each."""
        runtime, start = self.runtime, len(self.prefix)
        seqs = range(first_seq, first_seq + len(suffixes))
        for seq in seqs:
            runtime.fork(PREFIX_SEQ, seq)
        try:
            if split:
                (suffix,), (seq,) = suffixes, seqs
                head = list(suffix[:-split])
                runtime.decode_parts([Part(head, start, seq, False)])
                rows = runtime.decode_parts([Part(suffix[-split:], start + len(head), seq)])
            else:
                parts = [Part(s, start, q).padded(width) for s, q in zip(suffixes, seqs, strict=True)]
                rows = runtime.decode_parts(parts)
            return [runtime.logits_at(r).copy() for r in rows]
        finally:
            for seq in seqs:
                runtime.drop(seq)

    def short_and_long(
        self, suffix: Sequence[int], other: Sequence[int], head: int, together: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Two requests of other lengths: ``suffix`` after only the prefix's first ``head`` tokens (a
        short sequence, stream 1) and ``other`` after the whole prefix (stream 2), in ONE call when
        ``together`` (else each alone); the last position's logits of each."""
        runtime, n = self.runtime, len(self.prefix)
        runtime.decode_parts([Part(self.prefix[:head], 0, 1, False)])
        runtime.fork(PREFIX_SEQ, 2)
        try:
            short, long = Part(list(suffix), head, 1), Part(list(other), n, 2)
            if together:
                rows = runtime.decode_parts([short, long])
                return runtime.logits_at(rows[0]).copy(), runtime.logits_at(rows[1]).copy()
            first = runtime.logits_at(runtime.decode_parts([short])[0]).copy()
            return first, runtime.logits_at(runtime.decode_parts([long])[0]).copy()
        finally:
            runtime.drop(1)
            runtime.drop(2)


#: Prefix tokens the probe decodes again in other calls (the rest is decoded once).
PROBE_TAIL = 48


def probe(runtime: LlamaRuntime, prefix: Sequence[int], suffixes: Sequence[Sequence[int]]) -> Verdict:
    """Decode ``prefix`` and ``suffixes`` several ways on an invariant-configured ``runtime``; invariant
    only when all agree bit for bit.

    Reference: the prefix in two calls (its last ``PROBE_TAIL`` tokens in the second), each suffix alone
    on a copy. First the shortest safe piece: a suffix with its last k tokens in a call of their own, for k
    around each candidate (``calls``). Then, with pieces at least that long: suffixes whose lengths are
    that far apart in one shared call, shortest and longest first; a suffix in the last stream; the
    prefix's tail in calls of 2 × min_piece; the prefix's tail in the suffix's own call; a short
    sequence and a long one (two requests about other states) in one call.
    """
    if not runtime.invariant:
        return Verdict(FIXED_SPLIT, "the context is not in the invariant configuration")
    n_branches = runtime.n_seq_max - 1
    if n_branches < 2:
        return Verdict(FIXED_SPLIT, "the probe needs two branch streams (SEMIF_BATCH_SEQUENCES >= 2)")
    if len(prefix) < 2 * PROBE_TAIL:
        raise ValueError(f"the probe's prefix needs {2 * PROBE_TAIL} tokens or more")
    ordered = sorted((list(s) for s in suffixes), key=len)
    checks: dict[str, float] = {}
    try:
        decoder = _Decoder(runtime, prefix, PROBE_TAIL)
        decoder.tail(runtime.n_batch, 1)
        alone = _References(decoder, ordered)
        min_piece, single = _shortest_safe_piece(decoder, ordered, alone, checks)
        if min_piece:
            # flash attention: the runtime pads every piece to its tiled rows, so shorter pieces pass;
            # calls are planned (and checked) with pieces at least that long
            min_piece = max(min_piece, runtime.min_rows)
            _check_shared_calls(decoder, ordered, alone, checks, min_piece)
            _check_padding(decoder, ordered, alone, checks, min_piece)
    finally:
        runtime.clear(wipe=True)
    return _judged(checks, min_piece, single)


class _References:
    """Each suffix's logits decoded alone on a copy: what every other way must reproduce."""

    def __init__(self, decoder: _Decoder, ordered: list[list[int]]) -> None:
        self.decoder, self.ordered = decoder, ordered
        self.alone: dict[int, np.ndarray] = {}

    def __call__(self, index: int) -> np.ndarray:
        if index not in self.alone:
            self.alone[index] = self.decoder.branches([self.ordered[index]])[0]
        return self.alone[index]


def _shortest_safe_piece(
    decoder: _Decoder, ordered: list[list[int]], reference: _References, checks: dict[str, float]
) -> tuple[int, bool | None]:
    """The first candidate whose pieces (around its length) move nothing, 0 if none; and whether a
    piece of one token moves a suffix's logits."""
    single: bool | None = None
    for candidate in PIECE_CANDIDATES:
        index = next((i for i, s in enumerate(ordered) if len(s) >= 3 * candidate), None)
        if index is None:
            break
        if single is None:
            single = _gap(decoder.branches([ordered[index]], split=1)[0], reference(index)) != 0.0
        gaps = [
            _gap(decoder.branches([ordered[index]], split=k)[0], reference(index))
            for k in _lengths(candidate)
        ]
        checks[f"pieces of {candidate}+ tokens"] = max(gaps)
        if all(gap == 0.0 for gap in gaps):
            return candidate, single
    return 0, single


def _check_shared_calls(
    decoder: _Decoder,
    ordered: list[list[int]],
    reference: _References,
    checks: dict[str, float],
    min_piece: int,
) -> None:
    """With pieces of ``min_piece`` or more: suffixes sharing a call in both orders, a suffix in the last
    stream, the prefix's tail in short calls and in the suffix's own call."""
    runtime = decoder.runtime
    n_branches = runtime.n_seq_max - 1
    use: list[int] = []  # suffixes that may share a call: lengths min_piece apart
    for i, suffix in enumerate(ordered):
        if len(suffix) < min_piece:
            continue  # a planner never puts a part that short in a call with others
        if len(use) < min(3, n_branches) and (not use or len(suffix) >= len(ordered[use[-1]]) + min_piece):
            use.append(i)
    if len(use) < 2 or not shares_safely([len(ordered[i]) for i in use], runtime.n_batch, min_piece):
        raise ValueError("the probe's suffixes cannot share one call safely")
    together = decoder.branches([ordered[i] for i in use])
    checks["suffixes in one call"] = max(_gap(a, reference(i)) for a, i in zip(together, use, strict=True))
    backwards = decoder.branches([ordered[i] for i in use[::-1]])[::-1]
    checks["suffixes in one call, longest first"] = max(
        _gap(a, reference(i)) for a, i in zip(backwards, use, strict=True)
    )
    first = use[0]
    checks["a suffix in the last stream"] = _gap(
        decoder.branches([ordered[first]], n_branches)[0], reference(first)
    )
    decoder.tail(2 * min_piece, min_piece)
    checks[f"prefix tail in {2 * min_piece}-token calls"] = _gap(
        decoder.branches([ordered[first]])[0], reference(first)
    )
    # other requests in the call: a short sequence (a few dozen cells) beside the whole prefix (a longer
    # one), as when requests about other states share a call
    short, long = ordered[use[0]], ordered[use[1]]
    head = 2 * min_piece
    alone = decoder.short_and_long(short, long, head, together=False)
    both = decoder.short_and_long(short, long, head, together=True)
    checks["requests of other lengths in one call"] = max(
        _gap(a, b) for a, b in zip(alone, both, strict=True)
    )
    merged = decoder.tail(runtime.n_batch, min_piece, ordered[first])[0]
    checks["prefix tail in the suffix's call"] = _gap(merged, reference(first))


#: The probe's padding checks are named so: when one moves, padding is off and the mode stands.
PADDED = "padded "


def _check_padding(
    decoder: _Decoder,
    ordered: list[list[int]],
    reference: _References,
    checks: dict[str, float],
    min_piece: int,
) -> None:
    """Runs padded with filler to one length (``calls.padded_lengths``): suffixes of other lengths in
    one call, each padded past the longest, their logits read before the filler; and, where the memory
    can drop a sequence's tail, a prefix stretch decoded with filler whose cells are then dropped, a
    suffix decoded after it."""
    runtime = decoder.runtime
    decoder.tail(runtime.n_batch, min_piece)  # sequence 0: the whole prefix, nothing after it
    use = ordered[: min(3, runtime.n_seq_max - 1)]
    padded = decoder.branches(use, width=max(len(s) for s in use) + min_piece // 2)
    checks[PADDED + "suffixes in one call"] = max(_gap(a, reference(i)) for i, a in enumerate(padded))
    if runtime.is_recurrent or runtime.is_hybrid:
        return  # a tail cannot be dropped there: prefix stretches are never padded
    n, at = len(decoder.prefix), decoder.tail_at
    runtime.restore_seq(PREFIX_SEQ, decoder.head_state)
    runtime.decode_parts([Part(decoder.prefix[at:], at, PREFIX_SEQ, False).padded(n - at + min_piece + 1)])
    runtime.drop(PREFIX_SEQ, n)
    checks[PADDED + "prefix stretch, its filler dropped"] = _gap(
        decoder.branches([ordered[0]])[0], reference(0)
    )


def _lengths(candidate: int) -> tuple[int, ...]:
    """Piece lengths that stand for "``candidate`` tokens or more" (a kernel may switch at any of them);
    the suffix they split is ``3 * candidate`` tokens or more, so the piece before is as long."""
    return (candidate, candidate + 3, 2 * candidate - 1)


def _judged(checks: dict[str, float], min_piece: int, single: bool | None) -> Verdict:
    moved = {name: gap for name, gap in checks.items() if gap != 0.0}
    if not min_piece:
        reason = f"every piece length tried moved the logits (up to {max(moved.values()):.3g})"
        return Verdict(FIXED_SPLIT, reason, checks, 0, single)
    moved = {n: g for n, g in moved.items() if not n.startswith("pieces of ")}  # the candidates refused
    padding = {n: g for n, g in moved.items() if n.startswith(PADDED)}
    moved = {n: g for n, g in moved.items() if n not in padding}
    if moved:
        worst = max(moved.values())
        reason = f"logits moved (max |Δ| {worst:.3g}) with: " + "; ".join(moved)
        return Verdict(FIXED_SPLIT, reason, checks, min_piece, single)
    agreed = len(checks) - len(padding)
    reason = f"{agreed} ways of decoding the probe gave bit-identical logits (pieces of {min_piece}+ tokens"
    if padding:
        reason += f"; padding moved them (max |Δ| {max(padding.values()):.3g}), so runs are not padded)"
        return Verdict(INVARIANT, reason, checks, min_piece, single, pad_limit=0)
    reason += ", runs padded to share a call)"
    return Verdict(INVARIANT, reason, checks, min_piece, single, pad_limit=2 * min_piece)


def file_digest(path: Path) -> str:
    """The sha256 of a library file, hashed once per process per file version (a few MB: milliseconds)."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_ino, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, inode: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))


class VerdictCache:
    """Probe verdicts on disk, keyed by the libraries' and the model's bytes and the configuration."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    @classmethod
    def default(cls) -> VerdictCache:
        return cls(cache_folder("numerics"))  # None without a home: the probe runs at every start

    @staticmethod
    def key(libraries: Sequence[Path], model_sha256: str, config: dict[str, Any]) -> str:
        """Changes with the code and the model, never with where they lie: the sha256 of every library
        file a CPU forward pass runs (libllama, ggml's core, the CPU backend plugin it mapped), the
        model's sha256 (which the engine knows anyway: a manifest's pin, a verified demo model, or the
        hash kept for the file), and every setting the kernels depend on. SageMaker extracts the model
        into a fresh folder, a clone builds a fresh virtual environment from the same wheel: the same
        bytes, the same verdict. ``config`` also names the kernels the CPU backend runs (its reported
        features): one libllama picks another plugin on another CPU, and a cache folder can outlive its
        machine (a home on a shared disk, a volume moved to another instance type), so a verdict proven
        on one CPU is never read on another."""
        parts: dict[str, Any] = {"probe": PROBE_VERSION, "config": config, "model": model_sha256}
        digests = sorted(file_digest(lib) for lib in libraries if lib.is_file())
        parts["libraries"] = digests or None
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, key: str) -> Verdict | None:
        if self.folder is None:
            return None
        try:
            data = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
            return Verdict(**data, cached=True)
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, verdict: Verdict) -> None:
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(verdict.to_json()), encoding="utf-8")
            tmp.replace(self.folder / f"{key}.json")
        except OSError as exc:  # a read-only home (a locked-down container) only costs the next start a probe
            log.info("numerics verdict not cached (%s)", exc)


class _TiledDecoder:
    """The tiled probe's moves: sequence 0 holds the prefix (its tail decoded as asked), decisions run
    through ``TiledRuntime.decode_tiled``."""

    def __init__(self, runtime: TiledRuntime, prefix: Sequence[int], tail: int) -> None:
        self.runtime, self.prefix = runtime, list(prefix)
        self.tail_at = len(self.prefix) - tail
        runtime.clear(wipe=False)
        runtime.decode(self.prefix[: self.tail_at], 0, PREFIX_SEQ, False)
        self.head_state = runtime.save_seq(PREFIX_SEQ)

    def runs(
        self,
        suffixes: Sequence[Sequence[int]],
        seqs: Sequence[int],
        tail_calls: Sequence[int] | None,
        cut: bool = False,
    ) -> list[np.ndarray]:
        """Each suffix on its sequence of ``seqs``, all in ONE tiled call; the prefix's tail decoded
        before in calls of ``tail_calls`` tokens, or (None) in that call; ``cut``: the prefix without its
        tail (another request's). Logits of each suffix's end."""
        runtime, n = self.runtime, self.tail_at if cut else len(self.prefix)
        runtime.clear()  # a restored state lands at cell 0 only in an emptied context
        runtime.restore_seq(PREFIX_SEQ, self.head_state)
        at = self.tail_at
        for size in tail_calls or ():
            runtime.decode_parts([Part(self.prefix[at : at + size], at, PREFIX_SEQ, False)])
            at += size
        if tail_calls is not None and at != n:
            raise ValueError("the tail's calls do not cover the tail")
        for seq in seqs:
            runtime.fork(PREFIX_SEQ, seq)
        try:
            runs = [Run(list(s), n, q) for s, q in zip(suffixes, seqs, strict=True)]
            rows = runtime.decode_tiled(at, self.prefix[at:n], runs)
            return [runtime.logits_at(r).copy() for r in rows]
        finally:
            for seq in seqs:
                runtime.drop(seq)

    def regions(self, suffix: Sequence[int], other: Sequence[int], first: bool) -> list[np.ndarray]:
        """Two requests in ONE call, each in a region of its own: the whole prefix (its tail in the call)
        with ``suffix``, and the prefix without its tail with ``other``; ``first``: in that order.
        Logits of each request's suffix, in that order whatever the call's."""
        n, at = len(self.prefix), self.tail_at
        whole = Region(0, at, self.prefix[at:], [Run(list(suffix), n, 1)], self.head_state)
        short = Region(2, at, [], [Run(list(other), at, 3)], self.head_state)
        regions = [whole, short] if first else [short, whole]
        rows = self.runtime.decode_regions(regions)
        got = [self.runtime.logits_at(r[0]).copy() for r in rows]
        self.runtime.clear()
        return got if first else got[::-1]


def _region_checks(
    decoder: _TiledDecoder, suffix: Sequence[int], other: Sequence[int], alone: np.ndarray
) -> dict[str, float]:
    """Two requests in one tiled call, a region each, in both orders, against each alone: the probe's
    whole prefix with ``suffix`` (``alone``: its logits alone), and the prefix without its tail with
    ``other``."""
    short = decoder.runs([other], [1], None, cut=True)[0]
    checks = {}
    for first in (True, False):
        got = decoder.regions(suffix, other, first)
        name = "two requests in one call, a region each" + ("" if first else ", shorter first")
        checks[name] = max(_gap(got[0], alone), _gap(got[1], short))
    return checks


def probe_tiled(runtime: TiledRuntime, prefix: Sequence[int], suffixes: Sequence[Sequence[int]]) -> Verdict:
    """Decode ``prefix`` and ``suffixes`` several ways on a tiled-layout ``runtime``; invariant only when
    all agree bit for bit with each suffix decoded alone after the whole prefix.

    The ways: suffixes in one call (shortest first, longest first, on the last decision sequences), the
    prefix's tail in the suffixes' call, the tail in a call of one token and one of the rest (sequence
    0's calls are padded to 64 rows); the shortest suffix is under 64 rows, so alone it takes filler.
    The prefill's other splits are covered by the same argument as the tail's: every row of a
    tiled-path call is computed on its own. Where the runtime takes several requests a call (not on a
    sliding window), two requests of different lengths in one call, a region each, in both orders.
    """
    tail = PROBE_TAIL
    if len(prefix) < 2 * tail:
        raise ValueError(f"the probe's prefix needs {2 * tail} tokens or more")
    fits = sorted((list(s) for s in suffixes if len(s) + tail <= runtime.n_batch), key=len)
    width = min(3, runtime.decisions)
    if len(fits) < 2 or width < 2:
        return Verdict(FIXED_SPLIT, "tiled layout: the probe needs two decisions in one call")
    use = [fits[0], fits[len(fits) // 2], fits[-1]][:width]
    while sum(map(len, use)) + tail > runtime.n_batch:
        use.pop()
    if len(use) < 2:
        return Verdict(FIXED_SPLIT, "tiled layout: the probe's suffixes do not fit one call")
    checks: dict[str, float] = {}
    try:
        decoder = _TiledDecoder(runtime, prefix, tail)
        whole = (tail,)
        alone = [decoder.runs([s], [1], whole)[0] for s in use]

        def gap(got: Sequence[np.ndarray], order: Sequence[int]) -> float:
            return max(_gap(g, alone[i]) for g, i in zip(got, order, strict=True))

        forward = list(range(len(use)))
        backward = forward[::-1]
        checks["suffixes in one call"] = gap(decoder.runs(use, [1 + i for i in forward], whole), forward)
        checks["suffixes in one call, longest first"] = gap(
            decoder.runs([use[i] for i in backward], [1 + k for k in forward], whole), backward
        )
        last = [runtime.decisions - k for k in forward]
        checks["suffixes on the last decision sequences"] = gap(decoder.runs(use, last, whole), forward)
        checks["prefix tail in a suffix's call"] = gap(decoder.runs([use[-1]], [1], None), [len(use) - 1])
        checks["prefix tail in the suffixes' call"] = gap(
            decoder.runs(use, [1 + i for i in forward], None), forward
        )
        checks["prefix tail in calls of 1 and 47 tokens"] = gap(
            decoder.runs([use[0]], [1], (1, tail - 1)), [0]
        )
        if runtime.regions > 1 and runtime.n_swa == 0:  # several requests in one call, a region each
            checks.update(_region_checks(decoder, use[0], use[1], alone[0]))
    finally:
        runtime.clear(wipe=True)
    moved = {name: g for name, g in checks.items() if g != 0.0}
    if moved:
        reason = f"tiled layout: logits moved (max |Δ| {max(moved.values()):.3g}) with: " + "; ".join(moved)
        return Verdict(FIXED_SPLIT, reason, checks)
    reason = f"tiled layout: {len(checks)} ways of decoding the probe gave bit-identical logits"
    # any piece is safe (sequence 0's calls are padded to the tiled rows); pieces of 64+ spare padding
    return Verdict(INVARIANT, reason, checks, FLASH_TILE_ROWS)
