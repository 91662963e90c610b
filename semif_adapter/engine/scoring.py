"""The scoring version: one short value that changes whenever anything that can move a probability does.

A decision model sits behind thresholds, fitted temperatures and audit logs, so a caller must be able to
tell from a result alone that the numbers behind it are the ones it validated. The version has five parts,
each a short name or hash, so that a change says *what* moved:

- ``prompt``: the prompt text and the template handling: the prompt version and a hash of the exact text
  a fixed set of decisions renders to with this model's chat template;
- ``split``: tokenization and the cut rule: a hash of the token ids, the prefix/suffix boundary, the
  prefix's cuts and the label tokens of the same decisions;
- ``numerics``: how the tokens are decoded: the fixed split and its call size, or the batch-invariant mode
  and its shortest piece (``numerics``), flash attention, and the engine's decode/readout revision;
- ``llama_cpp``: the library build: its commit, the device that computes (CPU or GPU offload), the CPU
  kernel variant and a hash of every feature the build reports;
- ``model``: the GGUF's sha256 (its first 16 hex digits).

The combined ``version`` hashes the five. It is derived, not declared: the two hashed parts are computed
at load from the engine's own rendering and planning of :data:`REFERENCE_REQUESTS`, so editing the prompt
text or the cut rule changes the version without anyone remembering to bump it. What no derived part can
see (the order of a readout's arithmetic, which calls the engine makes) is covered by the revisions below,
bumped by hand in the commit that changes them, with the golden answers (``make golden``).

Calibration is not a part: a calibration is fitted *under* a scoring version (``calibration``), and every
calibrated result names the temperature it applied.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from semif_adapter.engine.kernels import cpu_features, cpu_variant

#: Revision of the split rule beyond what the derived hash sees; bump when a change moves answers.
SPLIT_REVISION = "s1"
#: Revision of the decode plan and the readout (label logits, softmax); bump when a change moves answers.
NUMERICS_REVISION = "n2"
SCORING_PREFIX = "sv1-"

# The decisions the derived parts are computed from: a short plain state, a plain state long enough for
# several prefix blocks, a JSON transcript (cut at its elements) and an object state; 2, 3 and 5 options.
_LONG_STATE = " ".join(
    f"Step {i}: the operator checked queue {i % 7}, found {i * 3} waiting jobs and moved {i % 4} of them."
    for i in range(1, 17)
)
_TRANSCRIPT = [
    {"role": "user", "content": "My export failed again last night."},
    {"role": "assistant", "content": "I see three failed runs. Did anything change on your side?"},
    {"role": "user", "content": "We moved the job to the new worker pool on Monday."},
    {"role": "tool", "content": "export_job: timeout after 1800 s, 14,021,334 rows read"},
    {"role": "assistant", "content": "The new pool has half the memory of the old one."},
]


def _options(*ids: str) -> list[dict[str, str]]:
    return [{"id": option, "description": f"the {option} option"} for option in ids]


REFERENCE_REQUESTS: tuple[tuple[dict[str, Any], ...], ...] = (
    (
        {
            "id": "short",
            "state": "The build is green and all tests pass.",
            "question": "Can this change be merged?",
            "options": _options("yes", "no"),
        },
    ),
    (
        {
            "id": "long-a",
            "state": _LONG_STATE,
            "question": "Which queue is busiest?",
            "options": _options("0", "3", "6"),
        },
        {
            "id": "long-b",
            "state": _LONG_STATE,
            "question": "Is the operator done?",
            "options": _options("yes", "no"),
        },
    ),
    (
        {
            "id": "transcript",
            "state": _TRANSCRIPT,
            "question": "What should the agent do next?",
            "options": _options("move back", "raise timeout", "split export", "ask", "escalate"),
        },
    ),
    (
        {
            "id": "object",
            "state": {"order": 1234, "days_since_delivery": 40, "plan": "business", "refunds_this_year": 0},
            "question": "Should the refund be granted?",
            "options": _options("grant", "deny", "escalate"),
        },
    ),
)


@dataclass(frozen=True)
class ScoringParts:
    """The five parts; :attr:`version` is the one value to compare."""

    prompt: str
    split: str
    numerics: str
    llama_cpp: str
    model: str

    @property
    def version(self) -> str:
        joined = "\x00".join([self.prompt, self.split, self.numerics, self.llama_cpp, self.model])
        return SCORING_PREFIX + hashlib.sha256(joined.encode()).hexdigest()[:12]

    def as_dict(self) -> dict[str, str]:
        return {
            "version": self.version,
            "prompt": self.prompt,
            "split": self.split,
            "numerics": self.numerics,
            "llama_cpp": self.llama_cpp,
            "model": self.model,
        }

    def changed(self, other: ScoringParts) -> list[str]:
        """Names of the parts that differ from ``other``'s."""
        mine, theirs = self.as_dict(), other.as_dict()
        return [name for name in mine if name != "version" and mine[name] != theirs[name]]


def short_hash(payload: object) -> str:
    """Eight hex digits of the sha256 of ``payload``'s canonical JSON."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]


def prompt_part(prompt_version: str, render: Callable[[Sequence[dict[str, Any]]], object]) -> str:
    """``<prompt version>.<hash of what the reference requests render to>``."""
    return f"{prompt_version}.{short_hash([render(request) for request in REFERENCE_REQUESTS])}"


def split_part(plan: Callable[[Sequence[dict[str, Any]]], object]) -> str:
    """``<split revision>.<hash of the reference requests' tokens, boundary, cuts and label tokens>``."""
    return f"{SPLIT_REVISION}.{short_hash([plan(request) for request in REFERENCE_REQUESTS])}"


def numerics_part(mode: str, *, min_piece: int, n_batch: int, attention: str, extra_buffers: bool) -> str:
    """``invariant.p<min piece>.<attention>.<revision>`` or
    ``fixed-split.b<call size>.<attention>.xb-<on|off>.<revision>``.

    In invariant numerics the minimum piece and the attention path decide the numbers (with flash
    attention every piece is padded to a 64-row tile: ``p64.fa-on``); extra buffers are never used
    there (``kernels.extra_buffers``), so the part does not name them. In the fixed split the call size
    decides them too, and so does whether the weights sit in llama.cpp's extra buffer types: repacked
    weights take other kernels, whose sums differ in the last bits, and the choice follows
    ``SEMIF_CPU_EXTRA_BUFFERS`` and the CPU's AMX flag, neither of which the ``llama_cpp`` part sees.
    ``<attention>`` is ``fa-on``, ``fa-off`` or ``fa-auto`` (llama.cpp decides); ``<revision>`` is the
    decode/readout revision."""
    if mode == "invariant":
        return f"invariant.p{min_piece}.{attention}.{NUMERICS_REVISION}"
    buffers = "xb-on" if extra_buffers else "xb-off"
    return f"fixed-split.b{n_batch}.{attention}.{buffers}.{NUMERICS_REVISION}"


def llama_cpp_part(commit: str | None, system_info: str, *, gpu_offload: bool) -> str:
    """``<commit>.<cpu|gpu>-<variant>.<hash of the reported features>``."""
    features = cpu_features(system_info)
    device = "gpu" if gpu_offload else "cpu"
    build = (commit or "unknown").strip() or "unknown"
    return f"{build}.{device}-{cpu_variant(features)}.{short_hash(' '.join(system_info.split()))[:6]}"


def model_part(sha256: str) -> str:
    return sha256[:16]
