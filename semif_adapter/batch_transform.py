"""Fit the server to a SageMaker batch transform job, or refuse to start with the mismatch named.

SageMaker tells a transform job's container its limits through ``SAGEMAKER_BATCH``,
``SAGEMAKER_MAX_PAYLOAD_IN_MB`` and ``SAGEMAKER_MAX_CONCURRENT_TRANSFORMS``. A job made by any tool
(not only ``semif-ops endpoint batch``) may send larger bodies than ``SEMIF_MAX_BODY_BYTES`` or more
requests at once than one model context and ``SEMIF_MAX_QUEUE`` admit: every such request would fail
with 413 or 503 deep into the job. A limit left at its default is raised to what the job sends; one
set explicitly (``SEMIF_*``) is the operator's word, so a conflict stops start-up instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from semif_adapter.settings import Settings

MIB = 1024 * 1024  # SageMaker's MB in MaxPayloadInMB
QUEUE_LIMIT: int = next(c.le for c in Settings.model_fields["max_queue"].metadata if hasattr(c, "le"))


class BatchTransformMismatch(Exception):
    """The job's limits and the server's settings cannot both hold; the message names both."""


def _whole_number(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise BatchTransformMismatch(f"{name}={raw!r} is not a whole number")
    return int(raw)


def fit_to_batch_transform(
    settings: Settings, environ: Mapping[str, str] = os.environ
) -> tuple[Settings, list[str]]:
    """The settings fitted to the job (unchanged outside one) and a line per limit that was raised."""
    if environ.get("SAGEMAKER_BATCH", "").strip().lower() != "true":
        return settings, []
    explicit = settings.model_fields_set
    update: dict[str, int] = {}
    notes: list[str] = []

    payload_mb = _whole_number(environ, "SAGEMAKER_MAX_PAYLOAD_IN_MB")
    if payload_mb == 0:
        raise BatchTransformMismatch(
            "SAGEMAKER_MAX_PAYLOAD_IN_MB=0 lets the job stream bodies of any size, but this server refuses "
            f"bodies above SEMIF_MAX_BODY_BYTES={settings.max_body_bytes}; give the job a MaxPayloadInMB"
        )
    if payload_mb is not None and payload_mb * MIB > settings.max_body_bytes:
        payload = payload_mb * MIB
        if "max_body_bytes" in explicit:
            raise BatchTransformMismatch(
                f"SAGEMAKER_MAX_PAYLOAD_IN_MB={payload_mb} lets the job send {payload}-byte bodies, above "
                f"SEMIF_MAX_BODY_BYTES={settings.max_body_bytes}; raise SEMIF_MAX_BODY_BYTES to {payload} "
                f"or lower the job's MaxPayloadInMB to {settings.max_body_bytes // MIB}"
            )
        update["max_body_bytes"] = payload
        notes.append(
            f"batch transform: SEMIF_MAX_BODY_BYTES raised to {payload} (MaxPayloadInMB={payload_mb})"
        )

    concurrent = _whole_number(environ, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS")
    if concurrent is not None and concurrent - 1 > settings.max_queue:
        waiting = concurrent - 1  # one request is scored at a time: the model has one context
        if "max_queue" in explicit or waiting > QUEUE_LIMIT:
            raise BatchTransformMismatch(
                f"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS={concurrent} sends {concurrent} requests at once, but "
                f"one model context scores one at a time and SEMIF_MAX_QUEUE={settings.max_queue} lets "
                f"{settings.max_queue} wait, so the rest would get 503; set the job's "
                f"MaxConcurrentTransforms to {settings.max_queue + 1} (no slower) or SEMIF_MAX_QUEUE to "
                f"{waiting}"
            )
        update["max_queue"] = waiting
        notes.append(
            f"batch transform: SEMIF_MAX_QUEUE raised to {waiting} (MaxConcurrentTransforms={concurrent}); "
            f"queued requests share SEMIF_REQUEST_TIMEOUT_S={settings.request_timeout_s:g} with the scoring"
        )
    if not update:
        return settings, notes
    return settings.model_copy(update=update), notes
