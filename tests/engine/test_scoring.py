"""The scoring version (``engine.scoring``): on every result, stable across loads, and changed by whatever
moves a probability: the prompt text, the cut rule, the numerics mode, the library's kernels, the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from semif_adapter.engine import DecisionEngine, kernels, planner, prompt, scoring
from semif_adapter.engine.chunking import block_cuts, event_cuts
from tests.helpers.support import engine_settings

AVX2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | REPACK = 1 | "
AVX512 = AVX2.replace("AVX2 = 1 |", "AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 |")


def test_results_carry_the_version_their_model_info_explains(gemma_engine: DecisionEngine) -> None:
    result = gemma_engine.score([scoring.REFERENCE_REQUESTS[0][0]]).results[0]
    parts = result.model.scoring
    assert result.scoring_version == parts.version == gemma_engine.scoring.version
    assert parts.version.startswith(scoring.SCORING_PREFIX) and len(parts.version) == 16
    assert parts.model == result.model.sha256[:16]
    assert parts.prompt.startswith(prompt.PROMPT_VERSION + ".")
    assert parts.numerics.startswith(f"{result.model.numerics}.")


def test_the_version_is_derived_the_same_way_every_time(gemma_engine: DecisionEngine) -> None:
    assert gemma_engine._scoring_parts() == gemma_engine.scoring


def test_changing_the_prompt_text_changes_the_version(
    gemma_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = gemma_engine._scoring_parts()
    monkeypatch.setattr(prompt, "QUESTION_LEAD", "\n\nQuestion -")
    after = gemma_engine._scoring_parts()
    assert "prompt" in after.changed(before) and after.version != before.version


@pytest.mark.parametrize("rule", ["blocks", "elements"])
def test_changing_the_cut_rule_changes_the_version(
    gemma_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    before = gemma_engine._scoring_parts()
    if rule == "blocks":  # blocks of half the size
        monkeypatch.setattr(
            planner, "block_cuts", lambda n, b, h, limit=None: block_cuts(n, b // 2, h, limit)
        )
    else:  # a transcript not cut after its last element
        monkeypatch.setattr(planner, "event_cuts", lambda a, n, b, h: event_cuts(a[:-1], n, b, h))
    after = gemma_engine._scoring_parts()
    assert after.changed(before) == ["split"] and after.version != before.version


def test_the_numerics_mode_changes_the_version(
    gemma_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = gemma_engine._scoring_parts()
    monkeypatch.setattr(gemma_engine, "invariant", not gemma_engine.invariant)
    after = gemma_engine._scoring_parts()
    assert after.changed(before) == ["numerics"] and after.version != before.version
    assert {before.numerics.split(".")[0], after.numerics.split(".")[0]} == {"invariant", "fixed-split"}


def test_the_fixed_split_names_whether_weights_are_repacked(
    gemma_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repacked weights take other kernels (SEMIF_CPU_EXTRA_BUFFERS, or a CPU without AMX under ``auto``)
    and the ``llama_cpp`` part cannot see that choice, so the numerics part names it. Switching them on
    for real is a state this machine cannot run where it advertises AMX (that buffer type crashed), so the
    runtime's recorded choice is swapped instead."""
    monkeypatch.setattr(gemma_engine, "invariant", False)
    off = kernels.ExtraBuffers(False, "test")
    monkeypatch.setattr(gemma_engine.runtime, "extra_buffers", off)
    before = gemma_engine._scoring_parts()
    monkeypatch.setattr(gemma_engine.runtime, "extra_buffers", kernels.ExtraBuffers(True, "test"))
    after = gemma_engine._scoring_parts()
    assert after.changed(before) == ["numerics"] and after.version != before.version
    assert ".xb-off." in before.numerics and ".xb-on." in after.numerics


def test_a_fixed_split_engine_reports_its_own_buffer_choice(gemma_gguf: Path) -> None:
    engine = DecisionEngine.load(
        engine_settings(gguf_path=gemma_gguf, numerics="fixed-split", cpu_extra_buffers="off")
    )
    try:
        assert not engine.runtime.extra_buffers.use
        assert engine.scoring.numerics.startswith("fixed-split.") and ".xb-off." in engine.scoring.numerics
    finally:
        engine.close()


def test_only_the_fixed_split_names_extra_buffers(gemma_engine: DecisionEngine) -> None:
    """Invariant numerics always run without them (``kernels.extra_buffers``), so their part does not
    name them and their versions did not move."""
    if gemma_engine.invariant:
        assert not gemma_engine.runtime.extra_buffers.use
        assert ".xb-" not in gemma_engine.scoring.numerics
    else:
        assert ".xb-" in gemma_engine.scoring.numerics


def test_other_kernels_change_the_version(
    gemma_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = gemma_engine._scoring_parts()
    monkeypatch.setattr(gemma_engine.runtime, "system_info", lambda: AVX512)
    after = gemma_engine._scoring_parts()
    assert after.changed(before) == ["llama_cpp"] and ".cpu-avx512." in after.llama_cpp


def test_another_model_has_another_version(gemma_engine: DecisionEngine, qwen_engine: DecisionEngine) -> None:
    assert "model" in gemma_engine.scoring.changed(qwen_engine.scoring)
    assert gemma_engine.scoring.version != qwen_engine.scoring.version


def test_the_reference_requests_plan_in_any_context_size(gemma_gguf: Path) -> None:
    """A small context refuses the long reference state as a request, yet plans it for the version."""
    small = DecisionEngine.load(engine_settings(gguf_path=gemma_gguf, n_ctx=256, numerics="fixed-split"))
    try:
        assert small.scoring.split.startswith(scoring.SPLIT_REVISION + ".")
    finally:
        small.close()


@pytest.mark.parametrize(
    ("info", "variant"),
    [
        (AVX2, "avx2"),
        (AVX512, "avx512"),
        (AVX512 + "AMX_INT8 = 1 | ", "avx512+amx"),
        ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | ", "neon"),
        ("CPU : NEON = 1 | SVE = 1 | ", "sve"),
        ("CPU : SSE3 = 1 | SSSE3 = 1 | ", "sse"),
        ("CPU : AVX2 = 0 | ", "generic"),
        ("", "generic"),
    ],
)
def test_the_cpu_variant_names_the_best_kernels_built(info: str, variant: str) -> None:
    assert kernels.cpu_variant(kernels.cpu_features(info)) == variant


def test_the_library_part_names_commit_device_and_variant() -> None:
    part = scoring.llama_cpp_part("0c1e570", AVX2, gpu_offload=False)
    assert part.startswith("0c1e570.cpu-avx2.")
    assert scoring.llama_cpp_part("0c1e570", AVX2, gpu_offload=True).startswith("0c1e570.gpu-avx2.")
    assert scoring.llama_cpp_part(None, AVX2, gpu_offload=False).startswith("unknown.")
    assert scoring.llama_cpp_part("0c1e570", AVX2 + "LLAMAFILE = 1 | ", gpu_offload=False) != part
