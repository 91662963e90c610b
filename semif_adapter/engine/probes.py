"""The probes at load: which fork mode reproduces the prefix state, and which numerics hold.

Both decode real decisions on the loaded model before the engine serves anything. The fork probe
compares a branch made by sequence copy with one made by saving and restoring sequence 0; the numerics
probe (``numerics.probe``) decodes one prompt of real decisions several ways on an invariant-configured
context. A numerics verdict is kept per library bytes, CPU kernels, model sha256 and configuration
(``numerics.VerdictCache``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from semif_adapter.engine.branches import Branches
from semif_adapter.engine.calls import PIECE_CANDIDATES
from semif_adapter.engine.numerics import FIXED_SPLIT, Verdict, VerdictCache, probe, probe_tiled
from semif_adapter.engine.planner import Planner
from semif_adapter.engine.prefill import Prefill
from semif_adapter.engine.tile_layout import TiledRuntime
from semif_adapter.errors import EngineFailure, SemifError
from semif_adapter.protocol import Decision
from semif_adapter.settings import EngineSettings

log = logging.getLogger(__name__)

_PROBE_STATE = "The build is green and all tests pass."
_PROBE_TOLERANCE = 1e-6
# The numerics probe's prompt: a state of a few hundred tokens and questions of different lengths.
_NUMERICS_STATE = (
    "Ticket 4471, enterprise plan: the nightly export to the data warehouse failed three nights in a row "
    "with a timeout after 30 minutes. The export job moved to a new worker pool last week; the old pool had "
    "twice the memory. Logs show 14 million rows read from the orders table before the timeout. The "
    "customer asks whether the export will run tonight and whether this month's invoices are affected. "
    "Two other customers on the same pool reported slow dashboards since Monday; the status page shows no "
    "incident. The on-call engineer has not yet replied, and the customer's contract promises a first "
    "answer within four hours for tickets marked urgent."
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
    (  # long enough that two suffixes 64 tokens apart can share a call (flash attention's pieces)
        "Taking into account the three failed nightly exports, the smaller memory of the new worker pool, "
        "the fourteen million rows read before each timeout, the slow dashboards of two other customers on "
        "the same pool and the four-hour answer the contract promises, what should the reply to the "
        "customer say first?",
        [
            "that the export is being moved back to the pool it ran on before, and will run tonight",
            "that the invoices of this month are computed from another system and are not affected",
            "that the team is still investigating, with the next update promised within four hours",
            "that the export will be split into smaller batches so that each finishes before the timeout",
            "that the customer should run the export by hand from the dashboard until it is fixed",
            "that nothing can be promised for tonight until the data platform team has looked at it",
        ],
    ),
)


def fork_mode(planner: Planner, prefill: Prefill, branches: Branches, forget: Callable[[], None]) -> str:
    """Sequence copy when it reproduces save/restore exactly; otherwise save/restore. ``forget`` empties
    the context and the prefix cache after (the probe's states must not serve a request)."""
    decision = Decision(
        id="probe",
        state=_PROBE_STATE,
        question="Is the build healthy?",
        options=[{"id": "yes"}, {"id": "no"}],
    )
    prefix_tokens, planned, cuts = planner.plan([decision])
    plan = planned[0]
    outcomes: dict[str, np.ndarray] = {}
    for mode in ("state", "copy"):
        prefill.fork_mode = mode
        prefill.reset()
        try:
            prefill.fill(prefix_tokens, cuts=cuts)
            readout = branches.branch(len(prefix_tokens), plan.suffix_tokens, plan.label_ids)
            outcomes[mode] = readout.option_logits
        except SemifError as exc:
            log.warning("fork mode %r failed its probe: %s", mode, exc)
    forget()
    if "copy" in outcomes and (
        "state" not in outcomes or np.max(np.abs(outcomes["copy"] - outcomes["state"])) <= _PROBE_TOLERANCE
    ):
        return "copy"
    if "state" in outcomes:
        log.warning("sequence copy does not reproduce the prefix state; using state save/restore")
        return "state"
    raise EngineFailure("neither sequence copy nor state save/restore works for this model")


def numerics_verdict(
    planner: Planner, prefill: Prefill, settings: EngineSettings, model_sha256: str
) -> Verdict:
    """Probe an invariant-configured context (``numerics``), or reuse the verdict kept for these
    libraries, this model (by its sha256) and this configuration."""
    runtime = prefill.runtime
    if not runtime.invariant:
        return Verdict(FIXED_SPLIT, "the context was created for the fixed split")
    if prefill.fork_mode != "copy":
        return Verdict(FIXED_SPLIT, "sequence copy does not reproduce this model's prefix state")
    cache = VerdictCache.default() if settings.numerics_probe_cache else VerdictCache(None)
    config: dict[str, int | str] = {
        "n_threads": settings.n_threads,
        "n_batch": runtime.n_batch,
        "n_gpu_layers": settings.n_gpu_layers,
        "n_seq_max": runtime.n_seq_max,
        "flash_attention": settings.flash_attention,
        "n_ctx": runtime.n_ctx,
        "cpu_kernels": " ".join(runtime.system_info().split()),
    }
    if isinstance(runtime, TiledRuntime):
        config["kv_layout"] = "tiled"
        config["regions"] = runtime.regions  # the probe checks requests in regions where there are several
    key = VerdictCache.key(runtime.library_files, model_sha256, config)
    verdict = cache.get(key)
    if verdict is None:
        prefix, suffixes = _numerics_prompt(planner)
        # every branch holds the prefix and one suffix; the padding checks add filler of up to the
        # largest piece the probe may prove, plus one token
        filler = max(PIECE_CANDIDATES[-1], runtime.min_rows) + 1
        needed = len(prefix) + max(len(s) for s in suffixes) + filler
        if needed > runtime.n_ctx:  # nothing proven, nothing kept: a larger context may prove it
            verdict = Verdict(
                FIXED_SPLIT, f"the probe needs a context of {needed} tokens; this one holds {runtime.n_ctx}"
            )
        else:
            started = time.perf_counter()
            if isinstance(runtime, TiledRuntime):
                verdict = probe_tiled(runtime, prefix, suffixes)
            else:
                verdict = probe(runtime, prefix, suffixes)
            log.info(
                "numerics probe: %s in %.2f s (%s)",
                verdict.mode,
                time.perf_counter() - started,
                verdict.reason,
            )
            cache.put(key, verdict)
    prefill.reset(wipe=True)
    return verdict


def _numerics_prompt(planner: Planner) -> tuple[list[int], list[list[int]]]:
    """The probe's prefix and suffixes: real decisions of several lengths (the longest over 64 tokens,
    so that every piece candidate can be tried)."""
    decisions = [
        Decision(id=f"p{i}", state=_NUMERICS_STATE, question=q, options=[{"id": o} for o in options])
        for i, (q, options) in enumerate(_NUMERICS_QUESTIONS)
    ]
    # the probe is not a caller's request: the request limits (SEMIF_MAX_REQUEST_TOKENS) do not apply
    prefix_tokens, planned, _ = planner.plan(decisions, budget=False)
    return prefix_tokens, [p.suffix_tokens for p in planned]
