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
then bit-identical however the tokens were grouped. With ``SEMIF_KV_LAYOUT=tiled`` the invariant context
is one unified KV stream with flash attention instead, each decision's cells from a KV tile line
(``tile_layout``), proven by a probe of its own; where that probe fails or the memory cannot take the
layout, the engine loads the stream layout and probes that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import numpy as np

from semif_adapter.engine import kernels, probes, scoring
from semif_adapter.engine.branches import Branches
from semif_adapter.engine.chunking import Cuts
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.labels import LabelSet
from semif_adapter.engine.llama_backend import LlamaRuntime, gpu_device_present
from semif_adapter.engine.numerics import FIXED_SPLIT, INVARIANT, Verdict, unprobed_verdict
from semif_adapter.engine.planner import Planner
from semif_adapter.engine.prefill import Prefill
from semif_adapter.engine.prefix_cache import CacheStats, PrefixCache
from semif_adapter.engine.prompt import PROMPT_VERSION, Scaffold
from semif_adapter.engine.request_batches import RequestBatches
from semif_adapter.engine.results import ResultBuilder
from semif_adapter.engine.shared_calls import SharedCalls
from semif_adapter.engine.tile_layout import LayoutRefused, TiledRuntime
from semif_adapter.engine.tiled_batches import TiledBatches
from semif_adapter.errors import ModelLoadError, SemifError
from semif_adapter.model.calibration import Calibration, find_calibration, portable_softmax, stale_reason
from semif_adapter.model.identity import model_sha256
from semif_adapter.model.manifest import verify_model_file
from semif_adapter.protocol import (
    BatchResult,
    CalibrationApplied,
    CpuKernels,
    Decision,
    ModelInfo,
    ScoringVersion,
)
from semif_adapter.settings import EngineSettings

log = logging.getLogger(__name__)


class DecisionEngine:
    """Scores decisions; not thread-safe (the HTTP layer admits one operation at a time).

    A facade over its rooms: the ``planner`` (decisions to tokens and cuts), the ``prefill`` (what
    sequence 0 holds, the prefix cache), the ``branches`` (each decision's suffix and its readout) and
    the result builder; the probes at load decide the fork mode and the numerics."""

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
        self.planner = Planner(runtime, settings)
        # attention-only memory can cut a saved state back to an earlier cut; recurrent and hybrid memory
        # only reuse one whole
        self.prefix_cache = PrefixCache(
            settings.prefix_cache_tokens,
            settings.prefix_cache_bytes,
            self.planner.block_tokens,
            partial_reuse=not (runtime.is_recurrent or runtime.is_hybrid),
            partial_limit=runtime.n_swa,
            head=self.planner.head_cut,
        )
        self.prefill = Prefill(runtime, self.planner, self.prefix_cache)
        self.branches = Branches(runtime, self.prefill)
        self.shared = SharedCalls(runtime, self.prefill, self.branches)
        # invariant numerics branch by sequence copy (one stream per decision); a probe decides both
        if settings.fork_mode != "auto":
            self.prefill.fork_mode = settings.fork_mode
        else:
            self.prefill.fork_mode = probes.fork_mode(
                self.planner, self.prefill, self.branches, self.reset_prefix_cache
            )
        self.verdict = verdict or probes.numerics_verdict(self.planner, self.prefill, settings, self.sha256)
        self.invariant = self.verdict.invariant and runtime.invariant
        self.tiled = self.invariant and isinstance(runtime, TiledRuntime)
        self.min_piece = self.verdict.min_piece or 1
        self.prefill.pad_limit = self.verdict.pad_limit if self.invariant else 0
        self.prefix_cache.reuse_at_any_token(self.invariant)
        self.scoring = self._scoring_parts()
        self.calibration_stale = self._check_calibration()
        self.prefill.pin_head()
        self.tiled_batches = _tiled_batches(runtime, self.prefill, self.branches) if self.tiled else None
        self.model_info = self._model_info(name)
        self.results = ResultBuilder(
            self.model_info, runtime.piece, self._probabilities, self.calibration_stale
        )
        self.batches = RequestBatches(
            self.planner, self.prefill, self.branches, self.shared, self.results, self.tiled_batches
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

            def build(invariant: bool, verdict: Verdict | None, tiled: bool = False) -> DecisionEngine:
                runtime = _runtime(Path(path), settings, invariant, tiled)
                try:
                    known = sha256 if identity is None else identity.result()
                    return cls(
                        runtime, settings, gguf_path=path, sha256=known, name=name, calibration=calibration,
                        verdict=verdict,
                    )  # fmt: skip
                except BaseException:
                    runtime.close()
                    raise

            preset = unprobed_verdict(settings.numerics, gpu_device_present())
            if preset is not None:
                return build(False, preset)
            if settings.kv_layout == "tiled" and settings.n_gpu_layers == 0:
                try:
                    engine = build(True, None, tiled=True)
                except LayoutRefused as exc:
                    log.warning("kv layout: the stream layout (%s)", exc)
                else:
                    if engine.invariant:
                        return engine
                    log.warning("kv layout: the stream layout (%s)", engine.verdict.reason)
                    engine.close()
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

    # --- the rooms' state, as the engine's callers and tests read it ----------------------------------
    @property
    def fork_mode(self) -> str:
        return self.prefill.fork_mode

    @property
    def invariant(self) -> bool:
        return self.prefill.invariant

    @invariant.setter
    def invariant(self, value: bool) -> None:
        self.prefill.invariant = value

    @property
    def min_piece(self) -> int:
        return self.prefill.min_piece

    @min_piece.setter
    def min_piece(self, value: int) -> None:
        self.prefill.min_piece = value

    @property
    def scaffold(self) -> Scaffold:
        return self.planner.scaffold

    @property
    def labels(self) -> LabelSet:
        return self.planner.labels

    @property
    def head_cut(self) -> int:
        return self.planner.head_cut

    @property
    def block_tokens(self) -> int:
        return self.planner.block_tokens

    @property
    def max_options(self) -> int:
        return self.planner.labels.capacity

    @property
    def max_batch_requests(self) -> int:
        """Requests :meth:`score_many` decodes together (invariant; tiled: see ``_tiled_batches``), else 1."""
        together = self.invariant and (not self.tiled or self.tiled_batches is not None)
        return self.settings.max_batch_requests if together else 1

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
        outcome = self.batches.alone(self.batches.plan(decisions, cancel), started)
        if isinstance(outcome, SemifError):
            raise outcome
        return outcome

    def score_many(
        self, jobs: Sequence[tuple[Sequence[Decision | Mapping[str, Any]], Deadline | None]]
    ) -> list[BatchResult | SemifError]:
        """Score several requests (each its decisions and cancel token): per request its result or its
        error; in invariant numerics decoded together, bit-identical to each alone (``request_batches``)."""
        return self.batches.score_many(jobs, self.max_batch_requests)

    def prompt_tokens(
        self, decisions: Sequence[Decision | Mapping[str, Any]]
    ) -> tuple[list[int], list[list[int]]]:
        """The exact token ids a request decodes: the shared prefix and each decision's suffix."""
        prefix_tokens, planned, _ = self.planner.plan(self.planner.parse(decisions))
        return prefix_tokens, [p.suffix_tokens for p in planned]

    def prefix_cuts(self, decisions: Sequence[Decision | Mapping[str, Any]]) -> Cuts:
        """Where a request's prefix is cut into decode chunks (``chunking``); the rest follows the last."""
        return self.planner.plan(self.planner.parse(decisions))[2]

    def saved_cuts(self, cuts: Cuts, n_prefix: int) -> tuple[int, ...]:
        """Where a prefix of ``n_prefix`` tokens cut at ``cuts`` files its saved states
        (``Prefill.saved_cuts``)."""
        return self.prefill.saved_cuts(cuts, n_prefix)

    def prefix_cache_stats(self) -> CacheStats:
        return self.prefix_cache.stats()

    def label_token_ids(self, n_options: int) -> list[int]:
        return self.planner.labels.take(n_options)[1]

    def reset_prefix_cache(self) -> None:
        """Forget the kept prefix and every saved state, the head's too (benchmarks use this to measure
        cold requests; the next prefill pins the head again)."""
        self.prefill.reset(wipe=True)
        self.prefix_cache.clear()

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
        return portable_softmax(option_logits.tolist(), temperature), applied

    # --- what fixes the numbers -------------------------------------------------------------------
    def _scoring_parts(self) -> scoring.ScoringParts:
        """The scoring version's parts (``scoring``), derived from this engine's own rendering and
        planning of the reference requests, its numerics and the library loaded."""
        runtime = self.runtime
        attention = ("fa-on" if self.settings.flash_attention else "fa-off") if self.invariant else "fa-auto"
        if self.tiled:
            attention = "fa-tiled"
        return scoring.ScoringParts(
            prompt=scoring.prompt_part(PROMPT_VERSION, self.planner.reference_text),
            split=scoring.split_part(self.planner.reference_plan),
            numerics=scoring.numerics_part(
                INVARIANT if self.invariant else FIXED_SPLIT,
                min_piece=self.min_piece,
                n_batch=runtime.n_batch,
                attention=attention,
                extra_buffers=runtime.extra_buffers.use,
            ),
            llama_cpp=scoring.llama_cpp_part(
                runtime.build_commit(),
                runtime.system_info(),
                gpu_offload=runtime.gpu_offload and self.settings.n_gpu_layers != 0,
            ),
            model=scoring.model_part(self.sha256),
        )

    def _check_calibration(self) -> bool:
        """A calibration belongs to the scoring it was fitted under; one fitted under another (or under
        an unknown one) stops start-up, or with SEMIF_STALE_CALIBRATION=mark marks every result stale.
        Returns whether the calibration is stale."""
        if self.calibration is None:
            return False
        problem = stale_reason(self.calibration, self.scoring.version, self.sha256)
        if problem is None:
            return False
        where = self.calibration.path or "calibration.json"
        if self.settings.stale_calibration == "mark":
            log.warning("calibration %s %s; serving it marked calibration_stale", where, problem)
            return True
        raise ModelLoadError(
            f"calibration {where} {problem}; refit it against this server (semif-adapter calibrate, "
            "docs/benchmark.md; start it without the file or with SEMIF_STALE_CALIBRATION=mark)"
        )

    def _model_info(self, name: str | None) -> ModelInfo:
        runtime, settings = self.runtime, self.settings
        return ModelInfo(
            name=name or self.gguf_path.name.removesuffix(".gguf"),
            file=self.gguf_path.name,
            sha256=self.sha256,
            architecture=runtime.meta("general.architecture"),
            n_ctx=runtime.n_ctx,
            n_threads=settings.n_threads,
            n_batch=runtime.n_batch,
            n_gpu_layers=settings.n_gpu_layers,
            gpu_offload=runtime.gpu_offload and settings.n_gpu_layers != 0,
            chat_template=self.planner.scaffold.uses_chat_template,
            llama_cpp_python_version=package_version("llama-cpp-python"),
            fork_mode=self.fork_mode,
            numerics=INVARIANT if self.invariant else FIXED_SPLIT,
            numerics_reason=self.verdict.reason,
            numerics_min_piece=self.verdict.min_piece if self.invariant else 0,
            numerics_pad_limit=self.prefill.pad_limit,
            kv_layout="tiled" if self.tiled else "streams",
            batch_sequences=runtime.n_seq_max - 1 if self.invariant else 1,
            max_batch_requests=self.max_batch_requests,
            scoring=ScoringVersion(**self.scoring.as_dict()),
            kernels=_kernels_of(self.runtime),
        )


def _runtime(path: Path, settings: EngineSettings, invariant: bool, tiled: bool) -> LlamaRuntime:
    """The context the settings ask for: the tiled layout's (``tile_layout``; CPU only, a GPU backend
    keeps the fixed split before any load, ``numerics.unprobed_verdict``), or the stream layout's, in
    the invariant configuration or the fixed split's."""
    if tiled:
        return TiledRuntime(
            path,
            n_ctx=settings.n_ctx,
            n_batch=settings.n_batch,
            n_threads=settings.n_threads,
            n_seq_max=1 + settings.batch_sequences,
            regions=settings.max_batch_requests,
            abi_record=settings.llama_abi_record,
        )
    return LlamaRuntime(
        path,
        n_ctx=settings.n_ctx,
        n_batch=settings.n_batch,
        n_threads=settings.n_threads,
        n_gpu_layers=settings.n_gpu_layers,
        abi_record=settings.llama_abi_record,
        invariant=invariant,
        n_seq_max=1 + settings.batch_sequences,
        flash_attention=settings.flash_attention,
        extra_buffers=settings.cpu_extra_buffers,
    )


def _tiled_batches(runtime: LlamaRuntime, prefill: Prefill, branches: Branches) -> TiledBatches | None:
    """The tiled layout's shared calls (short turns only), where the runtime takes several requests a
    call: never on a sliding window (``tile_layout``)."""
    if isinstance(runtime, TiledRuntime) and runtime.n_swa == 0 and runtime.regions > 1:
        return TiledBatches(runtime, prefill, branches)
    return None


def _kernels_of(runtime: LlamaRuntime) -> CpuKernels:
    """``model.kernels``: what the loaded library runs and where the weights went (``kernels``)."""
    return CpuKernels(
        variant=kernels.cpu_variant(runtime.cpu_features),
        features=runtime.cpu_features,
        library=runtime.cpu_library,
        extra_buffers=runtime.extra_buffers.use,
        extra_buffers_reason=runtime.extra_buffers.reason,
        weight_buffers=runtime.weight_buffers,
    )
