"""The decision engine: one llama.cpp context, a shared state prefix, one branch per decision.

For a request of N decisions about one state:

1. the prefix (template head + state) is decoded once into sequence 0, in chunks cut by a rule of the
   prompt alone (``chunking``: the head, then fixed blocks of ``prefix_block_tokens``, or a JSON-array
   state's elements) and kept: the next request about the same state reuses it; the state at the last
   cut is saved in the prefix cache, so a later prefix that shares those cuts (an agent's grown
   transcript) decodes only the rest, and the head's state is kept for every request;
2. for each decision, sequence 0 is forked into sequence 1 (``llama_memory_seq_cp``: no host copy),
   the decision's suffix (question, labelled options, generation prompt) is decoded in its own
   ``llama_decode`` call(s), the last position's logits are read, and sequence 1 is dropped.

Because every decision sees the same split — prefix chunks, then its own suffix alone — a decision
gives bit-identical probabilities alone, in a shared request, or next to any other decisions.
Models whose memory cannot copy a sequence fall back to saving and restoring sequence 0's state.

That is the **fixed split**. Where the probe at load proves llama.cpp's kernels batch-invariant on the
library and model loaded (``numerics``), the engine runs **invariant** instead: the decisions of a
request are decoded together, each on a copy of the prefix in a KV stream of its own, the prefix's tail
in their call, and calls are planned so that no sequence gets a short piece (``calls``); the answers are
then bit-identical however the tokens were grouped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version as package_version
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from semif_adapter.engine import scoring
from semif_adapter.engine.calls import group_calls, pieces
from semif_adapter.engine.chunking import (
    Cuts,
    block_cuts,
    chunks,
    event_anchors,
    event_cuts,
    head_cuts,
    stable_end,
    token_ends,
)
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.labels import LabelSet, build_label_set
from semif_adapter.engine.llama_backend import BRANCH_SEQ, PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.engine.numerics import FIXED_SPLIT, INVARIANT, Verdict, VerdictCache, probe
from semif_adapter.engine.prefix_cache import CacheStats, PrefixCache, SavedPrefix
from semif_adapter.engine.prompt import (
    PROMPT_VERSION,
    DecisionText,
    PromptHasher,
    Scaffold,
    build_scaffold,
    decision_text,
)
from semif_adapter.errors import (
    DecisionValidationError,
    EngineFailure,
    ModelLoadError,
    SemifError,
    TokenBudgetExceeded,
)
from semif_adapter.model.calibration import Calibration, apply_temperature, find_calibration
from semif_adapter.model.identity import model_sha256
from semif_adapter.model.manifest import verify_model_file
from semif_adapter.protocol import (
    BatchResult,
    BatchTiming,
    CalibrationApplied,
    Decision,
    DecisionResult,
    DecisionTiming,
    ModelInfo,
    ScoringVersion,
    check_shared_batch,
)
from semif_adapter.settings import EngineSettings

# Oversized-state check: slice length in characters, and tokens a cut may add over the whole text's count.
SLICE_CHARS = 16_384
CUT_ALLOWANCE = 4

log = logging.getLogger(__name__)

_PROBE_STATE = "The build is green and all tests pass."
_PROBE_TOLERANCE = 1e-6
# The numerics probe's prompt: a state of a few hundred tokens and questions of different lengths.
_NUMERICS_STATE = (
    "Ticket 4471, enterprise plan: the nightly export to the data warehouse failed three nights in a row "
    "with a timeout after 30 minutes. The export job moved to a new worker pool last week; the old pool had "
    "twice the memory. Logs show 14 million rows read from the orders table before the timeout. The "
    "customer asks whether the export will run tonight and whether this month's invoices are affected."
)
_NUMERICS_QUESTIONS = (
    ("Who owns it?", ["data", "billing"]),
    ("Which team should own this ticket first?", ["data platform", "billing", "identity", "support"]),
    (
        "What is the most likely cause of the failed exports, judging from the logs and the recent change?",
        [
            "less memory on the new worker pool",
            "a larger orders table",
            "a network fault",
            "a bug in the job",
        ],
    ),
    ("Is it urgent?", ["yes", "no", "unknown"]),
    ("Should the customer be told that their invoices are not affected by this failure?", ["yes", "no"]),
    (
        "Which of these should the on-call engineer do first, given the logs, the new worker pool and the "
        "customer's two questions?",
        [
            "move the export job back to the old worker pool",
            "split the export into smaller batches",
            "raise the job's timeout",
            "answer the customer about the invoices",
            "page the data platform team",
            "wait for tonight's run",
        ],
    ),
)
# Invariant numerics: a prefix tail this short (times the other decisions) is decoded in every decision's
# own call rather than in a call of its own.
TAIL_COPY_TOKENS = 16


@dataclass(frozen=True)
class _Planned:
    """A validated decision with its tokens, ready to score."""

    decision: Decision
    labels: list[str]
    label_ids: list[int]
    suffix_tokens: list[int]


@dataclass
class _Readout:
    option_logits: np.ndarray
    allowed_token_mass: float
    argmax_token: int


class DecisionEngine:
    """Scores decisions; not thread-safe (the HTTP layer admits one operation at a time)."""

    def __init__(
        self,
        runtime: LlamaRuntime,
        settings: EngineSettings,
        *,
        gguf_path: Path,
        sha256: str | None = None,
        name: str | None = None,
        calibration: Calibration | None = None,
        verdict: Verdict | None = None,
    ) -> None:
        """``verdict``: the numerics already decided (a fixed-split fallback carries the probe's reason);
        without one, an invariant-configured ``runtime`` is probed here."""
        self.runtime = runtime
        self.settings = settings
        self.gguf_path = gguf_path
        self.sha256 = sha256 or model_sha256(gguf_path)
        self.calibration = calibration
        specials = {"bos_token": runtime.piece(runtime.bos), "eos_token": runtime.piece(runtime.eos)}
        self.scaffold: Scaffold = build_scaffold(runtime.chat_template(), specials)
        self._head_tokens = runtime.tokenize(self.scaffold.head, True)
        if runtime.add_bos and (not self._head_tokens or self._head_tokens[0] != runtime.bos):
            self._head_tokens.insert(0, runtime.bos)
        self._tail_tokens = runtime.tokenize(self.scaffold.tail, True)
        self.labels: LabelSet = build_label_set(
            runtime.tokenize, self.scaffold.tail, self.scaffold.label_prefix, settings.max_options
        )
        self._cached_prefix: list[int] | None = None
        self._cached_cuts: Cuts | None = None
        self._kept_until = 0  # invariant numerics: sequence 0 holds the kept prefix up to here
        self._snapshot: Any = None
        self.block_tokens = min(settings.prefix_block_tokens, runtime.n_batch)
        # the head ends a chunk and its state is pinned (``chunking``); attention-only memory can cut a
        # saved state back to an earlier cut, recurrent and hybrid memory only reuse one whole
        self.head_cut = len(self._head_tokens)
        self.prefix_cache = PrefixCache(
            settings.prefix_cache_tokens,
            settings.prefix_cache_bytes,
            self.block_tokens,
            partial_reuse=not (runtime.is_recurrent or runtime.is_hybrid),
            partial_limit=runtime.n_swa,
            head=self.head_cut,
        )
        # invariant numerics branch by sequence copy (one stream per decision); a probe decides both
        self.invariant = False
        self.fork_mode = settings.fork_mode if settings.fork_mode != "auto" else self._probe_fork_mode()
        self.verdict = verdict or self._prove_numerics()
        self.invariant = self.verdict.invariant and runtime.invariant
        self.min_piece = self.verdict.min_piece or 1
        self.prefix_cache.reuse_at_any_token(self.invariant)
        self.scoring = self._scoring_parts()
        self.calibration_stale = self._check_calibration()
        self._pin_head()
        self.model_info = ModelInfo(
            name=name or gguf_path.name.removesuffix(".gguf"),
            file=gguf_path.name,
            sha256=self.sha256,
            architecture=runtime.meta("general.architecture"),
            n_ctx=runtime.n_ctx,
            n_threads=settings.n_threads,
            n_batch=runtime.n_batch,
            n_gpu_layers=settings.n_gpu_layers,
            gpu_offload=runtime.gpu_offload and settings.n_gpu_layers != 0,
            chat_template=self.scaffold.uses_chat_template,
            llama_cpp_python_version=package_version("llama-cpp-python"),
            fork_mode=self.fork_mode,
            numerics=INVARIANT if self.invariant else FIXED_SPLIT,
            numerics_reason=self.verdict.reason,
            numerics_min_piece=self.verdict.min_piece if self.invariant else 0,
            batch_sequences=runtime.n_seq_max - 1 if self.invariant else 1,
            scoring=ScoringVersion(**self.scoring.as_dict()),
        )

    @classmethod
    def load(cls, settings: EngineSettings, gguf_path: Path | None = None) -> DecisionEngine:
        """Load the model named by ``gguf_path`` or the settings (discovery is the caller's job)."""
        path = gguf_path or settings.gguf_path
        if path is None:
            raise SemifError("no GGUF path given")
        sha256 = name = None
        if settings.verify_manifest:
            verified = verify_model_file(path)
            if verified is not None:
                sha256, name = verified.sha256, verified.manifest.name
        calibration_path = find_calibration(path.parent, settings.calibration_path)
        calibration = Calibration.load(calibration_path) if calibration_path else None
        with ThreadPoolExecutor(1, thread_name_prefix="semif-sha256") as hashing:
            # an unverified model is hashed beside the model load (hashlib lets go of the GIL)
            identity = hashing.submit(model_sha256, Path(path)) if sha256 is None else None

            def build(invariant: bool, verdict: Verdict | None) -> DecisionEngine:
                runtime = LlamaRuntime(
                    path,
                    n_ctx=settings.n_ctx,
                    n_batch=settings.n_batch,
                    n_threads=settings.n_threads,
                    n_gpu_layers=settings.n_gpu_layers,
                    abi_record=settings.llama_abi_record,
                    invariant=invariant,
                    n_seq_max=1 + settings.batch_sequences,
                    flash_attention=settings.flash_attention,
                )
                try:
                    known = sha256 if identity is None else identity.result()
                    return cls(
                        runtime, settings, gguf_path=path, sha256=known, name=name, calibration=calibration,
                        verdict=verdict,
                    )  # fmt: skip
                except BaseException:
                    runtime.close()
                    raise

            if settings.numerics == FIXED_SPLIT:
                return build(False, Verdict(FIXED_SPLIT, "SEMIF_NUMERICS=fixed-split"))
            engine = build(True, None)
            if engine.invariant:
                return engine
            found = engine.verdict
            engine.close()
            if settings.numerics == INVARIANT:
                raise ModelLoadError(
                    f"SEMIF_NUMERICS=invariant, but the numerics probe failed on this library and model: "
                    f"{found.reason}; use SEMIF_NUMERICS=auto (falls back to the fixed split) or fixed-split"
                )
            log.warning("numerics: the fixed split (%s)", found.reason)
            return build(False, found)

    @property
    def max_options(self) -> int:
        return self.labels.capacity

    def close(self) -> None:
        self.runtime.close()

    # --- public API --------------------------------------------------------------------------
    def score(
        self, decisions: Sequence[Decision | Mapping[str, Any]], cancel: Deadline | None = None
    ) -> BatchResult:
        """Score decisions that share one state; all validation happens before any decoding.

        ``cancel`` stops the work at the next check point; an abort drops the kept prefix (it may be
        half-written), so the next request starts from clean memory and answers bit-identically.
        """
        started = time.perf_counter()
        prefix_tokens, planned, cuts = self._plan(self._parse(decisions))
        if cancel is not None:
            to_prefill = len(prefix_tokens) - self._reusable(prefix_tokens, cuts)
            cancel.begin(to_prefill + sum(len(p.suffix_tokens) for p in planned))
        try:
            return self._run(prefix_tokens, planned, cuts, started, cancel)
        except SemifError:
            self._reset(wipe=True)
            raise
        except Exception as exc:  # a ctypes/numpy fault is an engine failure, never the caller's
            self._reset(wipe=True)
            raise EngineFailure(f"engine fault: {type(exc).__name__}: {exc}") from exc

    def prompt_tokens(
        self, decisions: Sequence[Decision | Mapping[str, Any]]
    ) -> tuple[list[int], list[list[int]]]:
        """The exact token ids a request decodes: the shared prefix and each decision's suffix."""
        prefix_tokens, planned, _ = self._plan(self._parse(decisions))
        return prefix_tokens, [p.suffix_tokens for p in planned]

    def prefix_cuts(self, decisions: Sequence[Decision | Mapping[str, Any]]) -> Cuts:
        """Where a request's prefix is cut into decode chunks (``chunking``); the rest follows the last."""
        return self._plan(self._parse(decisions))[2]

    def saved_cuts(self, cuts: Cuts) -> tuple[int, ...]:
        """Where a prefix cut at ``cuts`` files its saved states: the last cut and, where a state cannot be
        cut back, the block before a transcript's elements; in invariant numerics only those its calls
        stop at (``_stops``)."""
        if not (cuts and self.prefix_cache.enabled):
            return ()
        filed = [p for p in (self.prefix_cache.checkpoint(cuts), cuts[-1]) if p and p != self.head_cut]
        if self.invariant:
            chain = self._stops(cuts, filed)
            filed = [p for p in filed if p in chain]
        return tuple(sorted(set(filed)))

    def prefix_cache_stats(self) -> CacheStats:
        return self.prefix_cache.stats()

    def label_token_ids(self, n_options: int) -> list[int]:
        return self.labels.take(n_options)[1]

    def reset_prefix_cache(self) -> None:
        """Forget the kept prefix and every saved state, the head's too (benchmarks use this to measure
        cold requests; the next prefill pins the head again)."""
        self._reset(wipe=True)
        self.prefix_cache.clear()

    def _pin_head(self) -> None:
        """Decode the template head once at load and pin its state: not even the first request decodes it."""
        if not (self.prefix_cache.enabled and self.head_cut > 0):
            return
        cuts = head_cuts(self.head_cut, self.block_tokens)
        spans = chunks(cuts, 0, self.head_cut)
        if self.invariant:  # the calls any prompt makes up to the head (``_stops``), if it stops there
            points = [0, *self._stops(cuts, ())]
            if points[-1] != self.head_cut:
                return
            spans = [
                p for a, b in pairwise(points) for p in pieces(a, b, self.runtime.n_batch, self.min_piece)
            ]
        try:
            self._decode_chunks(self._head_tokens, spans, cuts)
        finally:
            self._reset()

    # --- validation and planning ----------------------------------------------------------------
    def _parse(self, decisions: Sequence[Decision | Mapping[str, Any]]) -> list[Decision]:
        if not isinstance(decisions, Sequence) or isinstance(decisions, (str, bytes)):
            raise DecisionValidationError("decisions must be a list", loc=("decisions",))
        if len(decisions) > self.settings.max_decisions:  # before validating thousands of items
            too_many = list(decisions)  # only the count is read: refused before any item is validated
            check_shared_batch(too_many, self.settings.max_decisions, self.settings.max_options)  # type: ignore[arg-type]
        parsed: list[Decision] = []
        for index, item in enumerate(decisions):
            if isinstance(item, Decision):
                parsed.append(item)
                continue
            try:
                parsed.append(Decision.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                raise DecisionValidationError(first["msg"], loc=("decisions", index, *first["loc"])) from exc
        check_shared_batch(parsed, self.settings.max_decisions, self.settings.max_options)
        return parsed

    def _plan(
        self, decisions: list[Decision], budget: bool = True
    ) -> tuple[list[int], list[_Planned], Cuts]:
        """Tokens, labels and cuts of a request; ``budget=False`` skips the context and token limits
        (the scoring version's reference requests are planned whatever the context size)."""
        tokenize = self.runtime.tokenize
        state_text = decisions[0].state_text
        prefix_text = decision_text(self.scaffold, state_text, "", [])
        if budget:
            self._refuse_oversized(prefix_text.prefix_user)
        user_tokens = tokenize(prefix_text.prefix_user, False)
        prefix_tokens = self._head_tokens + user_tokens
        n_prefix = len(prefix_tokens)
        n_ctx = self.runtime.n_ctx if budget else math.inf
        if n_prefix >= n_ctx:
            raise TokenBudgetExceeded(
                f"the state alone needs {n_prefix} tokens; the context holds {n_ctx}",
                loc=("decisions", 0, "state"),
            )
        planned: list[_Planned] = []
        total = n_prefix
        for index, decision in enumerate(decisions):
            labels, label_ids = self.labels.take(len(decision.options), loc=("decisions", index, "options"))
            text = decision_text(
                self.scaffold,
                decision.state_text,
                decision.question,
                [(label, option.shown_text) for label, option in zip(labels, decision.options, strict=True)],
            )
            suffix_tokens = tokenize(text.suffix_user, False) + self._tail_tokens
            needed = n_prefix + len(suffix_tokens)
            if needed > n_ctx:
                raise TokenBudgetExceeded(
                    f"decision needs {needed} tokens ({n_prefix} state + {len(suffix_tokens)} "
                    f"question and options); the context holds {n_ctx}",
                    loc=("decisions", index),
                )
            total += len(suffix_tokens)
            planned.append(_Planned(decision, labels, label_ids, suffix_tokens))
        if budget and total > self.settings.max_request_tokens:
            raise TokenBudgetExceeded(
                f"request needs {total} tokens (state once + every decision); "
                f"the limit is {self.settings.max_request_tokens}",
                loc=("decisions",),
            )
        return prefix_tokens, planned, self._cuts(prefix_text, state_text, user_tokens)

    def _cuts(self, text: DecisionText, state_text: str, user_tokens: list[int]) -> Cuts:
        """Where the prefix (the head, then ``user_tokens`` spelling ``text.prefix_user``) is cut
        (``chunking``): a JSON array's elements, or the head and blocks up to the state's end."""
        n_head = len(self._head_tokens)
        n_tokens = n_head + len(user_tokens)
        ends = token_ends(text.prefix_user, user_tokens, self.runtime.token_length)
        if ends is None:  # the tokens do not spell the text byte for byte: plain blocks
            return self._block_cuts(n_tokens)
        if state_text.startswith("["):
            anchors = event_anchors(text.prefix_user, text.state_at, state_text, ends)
            if anchors:
                return event_cuts([n_head + a for a in anchors], n_tokens, self.block_tokens, self.head_cut)
        end = stable_end(text.prefix_user, text.state_at, state_text, ends)
        return self._block_cuts(n_tokens, None if end is None else n_head + end)

    def _block_cuts(self, n_tokens: int, limit: int | None = None) -> Cuts:
        return block_cuts(n_tokens, self.block_tokens, self.head_cut, limit)

    def _refuse_oversized(self, prefix_user: str) -> None:
        """Refuse a state that cannot fit without tokenizing all of it (a 6 MB state is 2.6 M tokens and
        seconds of engine time): count it in slices cut at a space or comma and stop once the count has passed
        what the context or SEMIF_MAX_REQUEST_TOKENS allows. Slices count a few tokens more than the whole
        text would (a merge across a cut is lost), so CUT_ALLOWANCE tokens a cut are taken off first; a
        state that may fit is tokenized whole as before, so answers never depend on this."""
        if len(prefix_user) <= SLICE_CHARS:
            return
        limit = min(self.runtime.n_ctx - 1, self.settings.max_request_tokens) - len(self._head_tokens)
        counted = cuts = start = 0
        while start < len(prefix_user):
            end = min(len(prefix_user), start + SLICE_CHARS)
            if end < len(prefix_user):
                lo = start + SLICE_CHARS // 2  # cut where a token is unlikely to span: a space or a comma
                cut = max(prefix_user.rfind(mark, lo, end) for mark in (" ", "\n", ","))
                end = cut if cut > start else end
            counted += len(self.runtime.tokenize(prefix_user[start:end], False))
            cuts += 1 if end < len(prefix_user) else 0
            start = end
            if counted - CUT_ALLOWANCE * cuts > limit:
                at_least = counted - CUT_ALLOWANCE * cuts + len(self._head_tokens)
                where = (
                    f"the context holds {self.runtime.n_ctx}"
                    if self.runtime.n_ctx - 1 <= self.settings.max_request_tokens
                    else f"the limit is {self.settings.max_request_tokens} (SEMIF_MAX_REQUEST_TOKENS)"
                )
                raise TokenBudgetExceeded(
                    f"the state alone needs more than {at_least} tokens (counted {start} of "
                    f"{len(prefix_user)} characters, then stopped); {where}",
                    loc=("decisions", 0, "state"),
                )

    # --- decoding -----------------------------------------------------------------------------------
    def _reset(self, wipe: bool = False) -> None:
        """Empty the context (``wipe``: its data too, after a failure); saved states stay (each one is
        complete, whatever failed since)."""
        self._cached_prefix = None
        self._cached_cuts = None
        self._kept_until = 0
        self._snapshot = None
        try:
            self.runtime.clear(wipe)
        except Exception:  # pragma: no cover - nothing more we can do
            log.exception("could not clear llama.cpp memory")

    def _keeps(self, prefix_tokens: list[int], cuts: Cuts) -> bool:
        """Sequence 0 already holds ``prefix_tokens``, decoded at ``cuts``."""
        return self._cached_prefix == prefix_tokens and self._cached_cuts == cuts

    def _reusable(self, prefix_tokens: list[int], cuts: Cuts) -> int:
        """Prefix tokens the next prefill will not decode (the kept prefix, or a saved state's chunks)."""
        if self._keeps(prefix_tokens, cuts):
            return len(prefix_tokens)
        if not self.prefix_cache.enabled:
            return 0
        return self.prefix_cache.peek(tuple(prefix_tokens), cuts)[1]

    def _prefill(
        self, prefix_tokens: list[int], cancel: Deadline | None = None, cuts: Cuts | None = None
    ) -> int:
        """Make sequence 0 hold exactly ``prefix_tokens``; returns how many tokens were reused.

        Chunks follow ``cuts`` (default: the head and blocks) whatever is reused, so each token is
        decoded in the same chunk as in a cold prefill. The state at the last cut is filed in the prefix
        cache only once the whole prefill succeeded; on any exception (an abort included) the caller
        empties the context (``_reset``) and nothing partial was filed.
        """
        cuts = cuts if cuts is not None else self._block_cuts(len(prefix_tokens))
        if self._keeps(prefix_tokens, cuts):
            return len(prefix_tokens)
        runtime, cache = self.runtime, self.prefix_cache
        key = tuple(prefix_tokens)
        reused = self._restore(key, cuts)
        last = cuts[-1] if cuts else 0  # the state saved there; the rest is decoded after the save
        fresh: list[SavedPrefix] = []
        if last > reused:
            # the state at the last cut, and where it cannot be cut back, at the block before its elements
            filed = [p for p in (cache.checkpoint(cuts), last) if p > reused and p != self.head_cut]
            states = self._decode_chunks(
                prefix_tokens, chunks(cuts, reused, last), cuts, cancel, filed if cache.enabled else ()
            )
            fresh = [SavedPrefix(key[:p], state, self._cuts_to(cuts, p)) for p, state in states.items()]
        runtime.decode(prefix_tokens[last:], last, PREFIX_SEQ, False, self.block_tokens, cancel=cancel)
        for entry in fresh:
            cache.put(entry)
        self._cached_prefix = list(prefix_tokens)
        self._cached_cuts = cuts
        if self.fork_mode == "state":
            self._snapshot = runtime.save_seq(PREFIX_SEQ)
        return reused

    def _restore(self, key: tuple[int, ...], cuts: Cuts) -> int:
        """Empty the context, then restore the saved state that serves most of ``key`` into sequence 0
        (cut back to what it shares); returns how many prefix tokens it holds."""
        self._reset()
        if not self.prefix_cache.enabled:
            return 0
        saved, reused = self.prefix_cache.lookup(key, cuts)
        if saved is not None:
            self.runtime.restore_seq(PREFIX_SEQ, saved.data)
            if reused < len(saved.tokens):
                self.runtime.drop(PREFIX_SEQ, reused)
        return reused

    def _cuts_to(self, cuts: Cuts, last: int) -> Cuts | None:
        """The cuts a state saved at ``last`` remembers (None when the block rule gives them)."""
        kept = tuple(c for c in cuts if c <= last)
        return None if kept == self._block_cuts(last) else kept

    def _decode_chunks(
        self,
        tokens: list[int],
        spans: list[tuple[int, int]],
        cuts: Cuts,
        cancel: Deadline | None = None,
        save_at: Collection[int] = (),
    ) -> dict[int, Any]:
        """Decode the chunks ``spans`` of ``tokens``, pinning the template head's state on the way;
        returns the states saved at the chunk ends ``save_at``.

        On a sliding-window model, a saved sequence state holds only the window's cells, so after a
        restore the window cache has fewer cells than after a cold prefill; the CPU kernels split
        their work by that cell count and round differently. Saving and restoring the sequence
        after each chunk gives every prefill, cold or warm, cache on or off, the same cache layout
        and bytes.
        """
        runtime = self.runtime
        head, cache = self.head_cut, self.prefix_cache
        pin = cache.enabled and head > 0 and tokens[:head] == self._head_tokens
        saved: dict[int, Any] = {}
        for start, end in spans:
            runtime.decode(tokens[start:end], start, PREFIX_SEQ, False, end - start, cancel=cancel)
            if runtime.n_swa > 0 or (pin and end == head) or end in save_at:
                state = runtime.save_seq(PREFIX_SEQ)
                if runtime.n_swa > 0:
                    runtime.restore_seq(PREFIX_SEQ, state)
                if pin and end == head:
                    cache.pin(SavedPrefix(tuple(tokens[:head]), state, self._cuts_to(cuts, head)))
                if end in save_at:
                    saved[end] = state
        return saved

    def _branch(
        self, n_prefix: int, suffix_tokens: list[int], label_ids: list[int], cancel: Deadline | None = None
    ) -> _Readout:
        """Decode one suffix on a branch of the prefix and read the label logits."""
        runtime = self.runtime
        if self.fork_mode == "copy":
            runtime.fork(PREFIX_SEQ, BRANCH_SEQ)
            try:
                runtime.decode(suffix_tokens, n_prefix, BRANCH_SEQ, want_logits=True, cancel=cancel)
                return self._read(label_ids)
            finally:
                runtime.drop(BRANCH_SEQ)
        try:
            runtime.decode(suffix_tokens, n_prefix, PREFIX_SEQ, want_logits=True, cancel=cancel)
            return self._read(label_ids)
        finally:
            runtime.restore_seq(PREFIX_SEQ, self._snapshot)

    def _read(self, label_ids: list[int], logits: np.ndarray | None = None) -> _Readout:
        """The label logits and the readout's checks, from ``logits`` (default: the last position's)."""
        if logits is None:
            logits = self.runtime.last_logits()  # zero-copy view of the vocabulary row
        selected = logits[label_ids].astype(np.float64)
        top = int(logits.argmax())  # NaN anywhere makes argmax land on it
        peak = float(logits[top])
        if not (math.isfinite(peak) and np.isfinite(selected).all() and np.isfinite(logits.min())):
            raise EngineFailure("the model produced non-finite logits")
        shifted = logits.astype(np.float64)
        shifted -= peak
        np.exp(shifted, out=shifted)
        mass = float(np.exp(selected - peak).sum() / shifted.sum())
        return _Readout(selected, mass, top)

    def _run(
        self,
        prefix_tokens: list[int],
        planned: list[_Planned],
        cuts: Cuts,
        started: float,
        cancel: Deadline | None = None,
    ) -> BatchResult:
        n_prefix = len(prefix_tokens)
        decode = self._decode_shared if self.invariant else self._decode_alone
        prefill_seconds, reused_tokens, forwards = decode(prefix_tokens, planned, cuts, cancel)
        reused = reused_tokens == n_prefix
        hasher = PromptHasher(prefix_tokens)
        results: list[DecisionResult] = []
        suffix_total = 0.0
        input_tokens = n_prefix
        for index, (plan, (readout, forward_seconds)) in enumerate(zip(planned, forwards, strict=True)):
            t_forward = time.perf_counter()
            probabilities, applied = self._probabilities(plan.decision, readout.option_logits)
            t_end = time.perf_counter()
            t_start = t_forward - forward_seconds
            suffix_total += forward_seconds
            input_tokens += len(plan.suffix_tokens)
            argmax_token = readout.argmax_token
            results.append(
                DecisionResult(
                    id=plan.decision.id,
                    option_ids=[option.id for option in plan.decision.options],
                    probabilities=probabilities,
                    option_logits=[float(x) for x in readout.option_logits],
                    input_tokens=n_prefix + len(plan.suffix_tokens),
                    allowed_token_mass=readout.allowed_token_mass,
                    argmax_token=self.runtime.piece(argmax_token),
                    argmax_is_option=argmax_token in plan.label_ids,
                    labels=plan.labels,
                    prompt_sha256=hasher.hexdigest(plan.suffix_tokens),
                    prompt_version=PROMPT_VERSION,
                    scoring_version=self.scoring.version,
                    calibration=applied,
                    calibration_stale=self.calibration_stale,
                    timing=DecisionTiming(
                        # the prefill is charged to the first decision that needed it
                        total_seconds=(t_end - t_start) + (prefill_seconds if index == 0 else 0.0),
                        prefill_seconds=prefill_seconds if index == 0 else 0.0,
                        suffix_forward_seconds=t_forward - t_start,
                        readout_seconds=t_end - t_forward,
                        prefix_tokens=n_prefix,
                        suffix_tokens=len(plan.suffix_tokens),
                        prefix_reused=reused or index > 0,
                        prefix_reused_tokens=n_prefix if index > 0 else reused_tokens,
                    ),
                    model=self.model_info,
                )
            )
        return BatchResult(
            results=results,
            timing=BatchTiming(
                total_seconds=time.perf_counter() - started,
                prefill_seconds=prefill_seconds,
                suffix_forward_seconds=suffix_total,
                prefix_tokens=n_prefix,
                prefix_reused=reused,
                prefix_reused_tokens=reused_tokens,
                decisions=len(planned),
                input_tokens=input_tokens,
            ),
        )

    def _decode_alone(
        self, prefix_tokens: list[int], planned: list[_Planned], cuts: Cuts, cancel: Deadline | None
    ) -> tuple[float, int, list[tuple[_Readout, float]]]:
        """The fixed split: the prefix in its chunks, then each decision's suffix in a call of its own.
        Returns the prefill's seconds (0 when the kept prefix served), the prefix tokens reused, and each
        decision's readout with its seconds."""
        t0 = time.perf_counter()
        kept = self._keeps(prefix_tokens, cuts)
        reused_tokens = self._prefill(prefix_tokens, cancel, cuts)
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        forwards: list[tuple[_Readout, float]] = []
        for plan in planned:
            if cancel is not None:
                cancel.check()
            t_start = time.perf_counter()
            readout = self._branch(len(prefix_tokens), plan.suffix_tokens, plan.label_ids, cancel)
            forwards.append((readout, time.perf_counter() - t_start))
        return prefill_seconds, reused_tokens, forwards

    def _decode_shared(
        self, prefix_tokens: list[int], planned: list[_Planned], cuts: Cuts, cancel: Deadline | None
    ) -> tuple[float, int, list[tuple[_Readout, float]]]:
        """Invariant numerics: the prefix in as few calls as its saved states allow, its tail in the
        decisions' call(s), and the decisions of a request decoded together, each in its own stream.

        A lone decision on memory that can drop a sequence's tail decodes the prefix tail and its suffix
        on sequence 0 and drops the suffix after; otherwise the prefix is copied into one stream per
        decision (at most ``batch_sequences`` at once) and a short tail is decoded in each of them, a
        long one once before the copies.
        """
        runtime, n = self.runtime, len(prefix_tokens)
        t0 = time.perf_counter()
        kept = self._keeps(prefix_tokens, cuts)
        reused_tokens, tail_at = self._prefill_shared(prefix_tokens, cuts, cancel)
        lone = len(planned) == 1 and not (runtime.is_recurrent or runtime.is_hybrid)
        tail = prefix_tokens[tail_at:]
        copies = len(tail) * (len(planned) - 1)
        if tail and not lone and len(tail) >= self.min_piece and copies > TAIL_COPY_TOKENS:
            self._decode_run(tail, tail_at, PREFIX_SEQ, cancel)
            tail, tail_at = [], n
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        runs = [tail + p.suffix_tokens for p in planned]
        labels = [p.label_ids for p in planned]
        forwards = self._decode_runs(runs, tail_at, labels, cancel, fork=not lone)
        if lone:
            runtime.drop(PREFIX_SEQ, n)  # the suffix goes; the whole prefix stays
            tail_at = n
        # sequence 0 keeps the prefix up to its tail: the next request about this state decodes only
        # the tail again, in its decisions' calls
        self._cached_prefix, self._cached_cuts, self._kept_until = list(prefix_tokens), cuts, tail_at
        return prefill_seconds, reused_tokens, forwards

    def _decode_run(self, tokens: list[int], start: int, seq: int, cancel: Deadline | None) -> None:
        """One sequence's tokens from ``start``, in calls of at most ``n_batch``, no piece of one token."""
        for a, b in pieces(0, len(tokens), self.runtime.n_batch, self.min_piece):
            self.runtime.decode_parts([Part(tokens[a:b], start + a, seq, False)], cancel)

    def _decode_runs(
        self,
        runs: list[list[int]],
        start: int,
        label_ids: list[list[int]],
        cancel: Deadline | None,
        fork: bool = True,
    ) -> list[tuple[_Readout, float]]:
        """Each run of tokens from position ``start`` on a copy of sequence 0 (``fork``; else the one run
        on sequence 0 itself), runs sharing calls as ``calls.group_calls`` allows; each run's readout at
        its last token, with its share of the calls' seconds (by tokens)."""
        runtime, limit = self.runtime, self.runtime.n_batch
        spans = [pieces(0, len(run), limit, self.min_piece) for run in runs]
        seconds = [0.0] * len(runs)
        readouts: list[_Readout | None] = [None] * len(runs)
        width = runtime.n_seq_max - 1 if fork else 1
        lasts = [b - a for a, b in (s[-1] for s in spans)]
        for call in group_calls(lasts, limit, self.min_piece, width):
            # consecutive sequence ids in the call's order: the order llama.cpp's split was modelled in
            seqs = list(range(1, 1 + len(call))) if fork else [PREFIX_SEQ]
            if fork:
                for seq in seqs:
                    runtime.fork(PREFIX_SEQ, seq)
            try:
                for i, seq in zip(call, seqs, strict=True):
                    for a, b in spans[i][:-1]:  # a run longer than a call: its leading pieces alone
                        t = time.perf_counter()
                        runtime.decode_parts([Part(runs[i][a:b], start + a, seq, False)], cancel)
                        seconds[i] += time.perf_counter() - t
                at = [spans[i][-1][0] for i in call]
                parts = [Part(runs[i][a:], start + a, q) for i, a, q in zip(call, at, seqs, strict=True)]
                t = time.perf_counter()
                rows = runtime.decode_parts(parts, cancel)
                for i, row in zip(call, rows, strict=True):
                    readouts[i] = self._read(label_ids[i], runtime.logits_at(row))
                elapsed, tokens = time.perf_counter() - t, sum(len(p.tokens) for p in parts)
                for i, part in zip(call, parts, strict=True):
                    seconds[i] += elapsed * len(part.tokens) / tokens
            finally:
                if fork:
                    for seq in seqs:
                        runtime.drop(seq)
        return [(r, t) for r, t in zip(readouts, seconds, strict=True) if r is not None]

    def _prefill_shared(
        self, prefix_tokens: list[int], cuts: Cuts, cancel: Deadline | None
    ) -> tuple[int, int]:
        """Invariant numerics: sequence 0 holds the prefix up to its tail; returns the tokens reused and
        where the tail (left to the decisions' calls) starts.

        Calls stop only where a state is saved (the last cut, the block before a transcript's elements
        where a state cannot be cut back, the template head) and, on a sliding-window model, at every cut
        (each chunk's state is saved and restored so that the window cache has one layout, see
        ``_decode_chunks``): ``_stops``.
        """
        n = len(prefix_tokens)
        if self._keeps(prefix_tokens, cuts):
            return n, self._kept_until
        runtime, cache = self.runtime, self.prefix_cache
        key = tuple(prefix_tokens)
        reused = self._restore(key, cuts)
        last = cuts[-1] if cuts else 0
        filed = [cache.checkpoint(cuts), last] if cache.enabled else []
        chain = self._stops(cuts, filed)
        points = [reused, *(p for p in chain if p > reused)]
        while len(points) > 1 and points[1] - points[0] < self.min_piece:
            del points[1]  # a reuse at any token (attention memory) may leave a short first span
        tail_at = points[-1]
        spans = [p for a, b in pairwise(points) for p in pieces(a, b, runtime.n_batch, self.min_piece)]
        save_at = [p for p in filed if p in points[1:] and p != self.head_cut]
        states = self._decode_chunks(prefix_tokens, spans, cuts, cancel, save_at)
        for p, state in states.items():
            cache.put(SavedPrefix(key[:p], state, self._cuts_to(cuts, p)))
        return reused, tail_at

    def _stops(self, cuts: Cuts, filed: Collection[int]) -> list[int]:
        """Invariant numerics: where a prefix cut at ``cuts`` ends its calls, a function of the prompt
        alone (so a warm prefill resumes at a stop of the cold one and continues with the same calls).

        Calls stop where a state is saved (``filed``, the head) and, on a sliding-window model, at every
        cut; a stop closer than ``min_piece`` to the one before is passed over, so no call holds a short
        piece; the state there is not saved (and the prefix's tail starts at the stop before).
        """
        last = cuts[-1] if cuts else 0
        wanted = {p for p in filed if 0 < p <= last}
        if self.prefix_cache.enabled and 0 < self.head_cut <= last:
            wanted.add(self.head_cut)
        if self.runtime.n_swa > 0:
            wanted.update(cuts)
        chain: list[int] = []
        for stop in sorted(wanted):
            if stop - (chain[-1] if chain else 0) >= self.min_piece:
                chain.append(stop)
        return chain

    def _probabilities(
        self, decision: Decision, option_logits: np.ndarray
    ) -> tuple[list[float], CalibrationApplied | None]:
        applied = None
        temperature = 1.0
        if self.calibration is not None:
            found = self.calibration.temperature_for(decision.type, len(decision.options))
            if found is not None:
                temperature, key = found
                applied = CalibrationApplied(temperature=temperature, key=key)
        probabilities = apply_temperature(option_logits, temperature)
        return [float(p) for p in probabilities], applied

    # --- what fixes the numbers -------------------------------------------------------------------
    def _scoring_parts(self) -> scoring.ScoringParts:
        """The scoring version's parts (``scoring``), derived from this engine's own rendering and
        planning of the reference requests, its numerics and the library loaded."""
        runtime = self.runtime
        attention = (
            ("fa-on" if self.settings.flash_attention else "fa-off") if self.invariant else "fa-auto"
        )
        return scoring.ScoringParts(
            prompt=scoring.prompt_part(PROMPT_VERSION, self._reference_text),
            split=scoring.split_part(self._reference_plan),
            numerics=scoring.numerics_part(
                INVARIANT if self.invariant else FIXED_SPLIT,
                min_piece=self.min_piece,
                n_batch=runtime.n_batch,
                attention=attention,
            ),
            llama_cpp=scoring.llama_cpp_part(
                runtime.build_commit(),
                runtime.system_info(),
                gpu_offload=runtime.gpu_offload and self.settings.n_gpu_layers != 0,
            ),
            model=scoring.model_part(self.sha256),
        )

    def _reference_text(self, request: Sequence[Mapping[str, Any]]) -> list[str]:
        """The exact text a request renders to: the template around it, each decision's prompt."""
        scaffold = self.scaffold
        texts = [scaffold.head, scaffold.tail, scaffold.label_prefix]
        for decision in self._parse(request):
            labels = self.labels.take(len(decision.options))[0]
            shown = [(label, o.shown_text) for label, o in zip(labels, decision.options, strict=True)]
            text = decision_text(scaffold, decision.state_text, decision.question, shown)
            texts.append(text.prefix_user + text.suffix_user)
        return texts

    def _reference_plan(self, request: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a request decodes: the prefix tokens and cuts, each suffix and its label tokens."""
        prefix_tokens, planned, cuts = self._plan(self._parse(request), budget=False)
        return {
            "prefix": prefix_tokens,
            "cuts": list(cuts),
            "suffixes": [p.suffix_tokens for p in planned],
            "labels": [p.label_ids for p in planned],
        }

    def _check_calibration(self) -> bool:
        """A calibration belongs to the scoring it was fitted under; one fitted under another (or under
        an unknown one) stops start-up, or with SEMIF_STALE_CALIBRATION=mark marks every result stale.
        Returns whether the calibration is stale."""
        calibration = self.calibration
        if calibration is None:
            return False
        version = self.scoring.version
        where = calibration.path or "calibration.json"
        problem = None
        if calibration.model_sha256 and calibration.model_sha256 != self.sha256:
            problem = f"was fitted on model {calibration.model_sha256[:16]}…, this is {self.sha256[:16]}…"
        elif calibration.scoring_version is None:
            problem = "records no scoring_version (fitted before scoring versions existed)"
        elif calibration.scoring_version != version:
            problem = f"was fitted under scoring {calibration.scoring_version}; this server scores {version}"
        if problem is None:
            return False
        if self.settings.stale_calibration == "mark":
            log.warning("calibration %s %s; serving it marked calibration_stale", where, problem)
            return True
        raise ModelLoadError(
            f"calibration {where} {problem}; refit it against this server (semif-adapter calibrate, "
            "docs/benchmark.md; start it without the file or with SEMIF_STALE_CALIBRATION=mark)"
        )

    # --- numerics probe -------------------------------------------------------------------------
    def _prove_numerics(self) -> Verdict:
        """Probe an invariant-configured context (``numerics``), or reuse the verdict kept for this
        library, model file and configuration."""
        runtime, settings = self.runtime, self.settings
        if not runtime.invariant:
            return Verdict(FIXED_SPLIT, "the context was created for the fixed split")
        if self.fork_mode != "copy":
            return Verdict(FIXED_SPLIT, "sequence copy does not reproduce this model's prefix state")
        cache = VerdictCache.default() if settings.numerics_probe_cache else VerdictCache(None)
        library = getattr(getattr(self.runtime.lib.llama_cpp, "_lib", None), "_name", None)
        config = {
            "n_threads": settings.n_threads,
            "n_batch": runtime.n_batch,
            "n_gpu_layers": settings.n_gpu_layers,
            "n_seq_max": runtime.n_seq_max,
            "flash_attention": settings.flash_attention,
            "n_ctx": runtime.n_ctx,
        }
        key = VerdictCache.key(Path(library) if library else None, self.gguf_path, config)
        verdict = cache.get(key)
        if verdict is None:
            prefix, suffixes = self._numerics_prompt()
            started = time.perf_counter()
            verdict = probe(runtime, prefix, suffixes)
            log.info(
                "numerics probe: %s in %.2f s (%s)",
                verdict.mode,
                time.perf_counter() - started,
                verdict.reason,
            )
            cache.put(key, verdict)
        self._reset(wipe=True)
        return verdict

    def _numerics_prompt(self) -> tuple[list[int], list[list[int]]]:
        """The probe's prefix and suffixes: real decisions of several lengths (the longest over 64 tokens,
        so that every piece candidate can be tried)."""
        decisions = [
            Decision(id=f"p{i}", state=_NUMERICS_STATE, question=q, options=[{"id": o} for o in options])
            for i, (q, options) in enumerate(_NUMERICS_QUESTIONS)
        ]
        prefix_tokens, planned, _ = self._plan(decisions)
        return prefix_tokens, [p.suffix_tokens for p in planned]

    # --- fork probe -----------------------------------------------------------------------------
    def _probe_fork_mode(self) -> str:
        """Use sequence copy when it reproduces save/restore exactly; otherwise fall back."""
        probe = Decision(
            id="probe",
            state=_PROBE_STATE,
            question="Is the build healthy?",
            options=[{"id": "yes"}, {"id": "no"}],
        )
        prefix_tokens, planned, cuts = self._plan([probe])
        plan = planned[0]
        outcomes: dict[str, np.ndarray] = {}
        for mode in ("state", "copy"):
            self.fork_mode = mode
            self._reset()
            try:
                self._prefill(prefix_tokens, cuts=cuts)
                readout = self._branch(len(prefix_tokens), plan.suffix_tokens, plan.label_ids)
                outcomes[mode] = readout.option_logits
            except SemifError as exc:
                log.warning("fork mode %r failed its probe: %s", mode, exc)
        self.reset_prefix_cache()
        if "copy" in outcomes and (
            "state" not in outcomes
            or np.max(np.abs(outcomes["copy"] - outcomes["state"])) <= _PROBE_TOLERANCE
        ):
            return "copy"
        if "state" in outcomes:
            log.warning("sequence copy does not reproduce the prefix state; using state save/restore")
            return "state"
        raise EngineFailure("neither sequence copy nor state save/restore works for this model")
