"""A batch transform job's limits (SAGEMAKER_* at start-up): fitted when ours are defaults, else refused."""

from __future__ import annotations

import pytest

from semif_adapter.batch_transform import MIB, BatchTransformMismatch, fit_to_batch_transform
from semif_adapter.settings import Settings

BATCH = {"SAGEMAKER_BATCH": "true"}


def test_outside_a_transform_job_nothing_changes() -> None:
    settings = Settings()
    env = {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "50", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "8"}
    assert fit_to_batch_transform(settings, env) == (settings, [])


def test_limits_the_job_already_fits_stay() -> None:
    settings = Settings()
    env = {**BATCH, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "6", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "1"}
    assert fit_to_batch_transform(settings, env) == (settings, [])


def test_a_larger_payload_raises_the_default_body_limit() -> None:
    fitted, notes = fit_to_batch_transform(Settings(), {**BATCH, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20"})
    assert fitted.max_body_bytes == 20 * MIB
    assert notes == [f"batch transform: SEMIF_MAX_BODY_BYTES raised to {20 * MIB} (MaxPayloadInMB=20)"]


def test_a_payload_above_an_explicit_body_limit_is_refused() -> None:
    settings = Settings(max_body_bytes=4 * MIB)
    with pytest.raises(BatchTransformMismatch) as refused:
        fit_to_batch_transform(settings, {**BATCH, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20"})
    message = str(refused.value)
    assert "\n" not in message
    assert "SAGEMAKER_MAX_PAYLOAD_IN_MB=20" in message and f"SEMIF_MAX_BODY_BYTES={4 * MIB}" in message
    assert "MaxPayloadInMB to 4" in message


def test_an_unbounded_payload_is_refused() -> None:
    with pytest.raises(BatchTransformMismatch, match=r"SAGEMAKER_MAX_PAYLOAD_IN_MB=0 .* any size"):
        fit_to_batch_transform(Settings(), {**BATCH, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"})


def test_concurrent_transforms_wait_in_the_queue_when_it_is_a_default() -> None:
    fitted, notes = fit_to_batch_transform(Settings(), {**BATCH, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4"})
    assert fitted.max_queue == 3
    assert len(notes) == 1 and "SEMIF_MAX_QUEUE raised to 3 (MaxConcurrentTransforms=4)" in notes[0]


def test_concurrent_transforms_above_an_explicit_queue_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMIF_MAX_QUEUE", "1")  # set by the operator, through the environment
    with pytest.raises(BatchTransformMismatch) as refused:
        fit_to_batch_transform(Settings(), {**BATCH, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4"})
    message = str(refused.value)
    assert "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS=4" in message and "SEMIF_MAX_QUEUE=1" in message
    assert "MaxConcurrentTransforms to 2" in message and "SEMIF_MAX_QUEUE to 3" in message


def test_an_explicit_queue_that_is_large_enough_is_kept() -> None:
    settings = Settings(max_queue=5)
    env = {**BATCH, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4"}
    assert fit_to_batch_transform(settings, env) == (settings, [])


def test_more_concurrency_than_any_queue_is_refused() -> None:
    with pytest.raises(BatchTransformMismatch, match="SAGEMAKER_MAX_CONCURRENT_TRANSFORMS=2000"):
        fit_to_batch_transform(Settings(), {**BATCH, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "2000"})


@pytest.mark.parametrize("name", ["SAGEMAKER_MAX_PAYLOAD_IN_MB", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"])
def test_a_value_that_is_not_a_number_is_named(name: str) -> None:
    with pytest.raises(BatchTransformMismatch, match=f"{name}='six' is not a whole number"):
        fit_to_batch_transform(Settings(), {**BATCH, name: "six"})


def test_both_limits_are_fitted_together() -> None:
    env = {**BATCH, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "10", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "2"}
    fitted, notes = fit_to_batch_transform(Settings(), env)
    assert (fitted.max_body_bytes, fitted.max_queue, len(notes)) == (10 * MIB, 1, 2)
