"""The CPU kernels the engine reports, and the extra buffer types (repacking, AMX) it allows."""

from __future__ import annotations

from pathlib import Path

import pytest

from semif_adapter.engine import kernels
from semif_adapter.engine.llama_backend import LlamaRuntime

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni amx_bf16 amx_tile amx_int8
bugs\t\t: spectre_v1
"""
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\nCPU implementer\t: 0x41\n"
LOAD_LOG = [
    "load_tensors: loading model tensors, this can take a while... (mmap = true)\n",
    "load_tensors:   CPU_Mapped model buffer size =   241.18 MiB\n",
    "load_tensors:   CPU_REPACK model buffer size =    88.00 MiB\n",
    "load_tensors:          AMX model buffer size =    12.00 MiB\n",
    "load_tensors:   CPU_Mapped model buffer size =    10.00 MiB\n",
]
MAPS = """7f00-7f01 r-xp 00000000 fd:01 42 /opt/llama.cpp/bin/libggml-base.so
7f02-7f03 r-xp 00000000 fd:01 43 /opt/llama.cpp/bin/libggml-cpu-haswell.so
7f03-7f04 r--p 00010000 fd:01 43 /opt/llama.cpp/bin/libggml-cpu-haswell.so
7f05-7f06 rw-p 00000000 00:00 0
7f07-7f08 r-xp 00000000 fd:01 44 /opt/llama.cpp/bin/libllama.so
7f09-7f0a r-xp 00000000 fd:01 45 /opt/llama.cpp/bin/libggml-cuda.so
7f0b-7f0c r-xp 00000000 fd:01 46 /usr/lib64/libgomp.so.1.0.0
"""


def test_cpu_flags_are_read_on_x86_and_arm() -> None:
    assert {"avx512f", "amx_tile"} <= kernels.cpu_flags(X86_CPUINFO)
    assert "bugs" not in kernels.cpu_flags(X86_CPUINFO) and "spectre_v1" not in kernels.cpu_flags(X86_CPUINFO)
    assert kernels.cpu_flags(ARM_CPUINFO) == {"fp", "asimd", "evtstrm", "aes", "sve"}
    assert kernels.cpu_flags("") == frozenset()


def test_amx_takes_both_the_cpu_and_the_build() -> None:
    assert kernels.advertises_amx(kernels.cpu_flags(X86_CPUINFO), ["AVX512", "AMX_INT8"])
    assert not kernels.advertises_amx(kernels.cpu_flags(X86_CPUINFO), ["AVX2"])  # the AVX2 plugin
    assert not kernels.advertises_amx([], ["AVX2", "AMX_INT8"])
    assert not kernels.advertises_amx(["avx2", "avx512f"], ["AVX2", "AVX512"])


@pytest.mark.parametrize(
    ("setting", "invariant", "amx", "use"),
    [
        ("auto", True, False, False),  # invariant numerics were proven without them
        ("on", True, True, False),
        ("auto", False, True, False),  # the AMX buffer type crashed llama_decode on a VM
        ("auto", False, False, True),  # repacking, as llama.cpp defaults
        ("on", False, True, True),
        ("off", False, False, False),
    ],
)
def test_extra_buffers_stay_off_where_amx_is_advertised_unless_asked_for(
    setting: str, invariant: bool, amx: bool, use: bool
) -> None:
    chosen = kernels.extra_buffers(setting, invariant=invariant, amx=amx)
    assert chosen.use is use and chosen.reason


def test_the_weights_buffer_types_come_from_the_load_log_once_each() -> None:
    assert kernels.weight_buffers(LOAD_LOG) == ["CPU_Mapped", "CPU_REPACK", "AMX"]
    assert kernels.weight_buffers([]) == []


def test_the_cpu_backend_library_is_the_mapped_plugin() -> None:
    paths = kernels.cpu_library_paths(kernels.mapped_library_paths(MAPS))
    assert paths == [Path("/opt/llama.cpp/bin/libggml-cpu-haswell.so")]
    assert kernels.library_names(paths) == "libggml-cpu-haswell.so"
    assert kernels.mapped_library_paths("7f05-7f06 rw-p 00000000 00:00 0\n") == []
    assert kernels.library_names([]) is None
    assert kernels.read_mapped_library_paths(Path("/nonexistent/maps")) == []


def test_the_libraries_a_cpu_forward_pass_runs_are_llama_ggml_and_the_cpu_plugin() -> None:
    """What the numerics verdict is keyed by: no GPU plugin (it computes nothing on the CPU), no
    unrelated library."""
    names = [p.name for p in kernels.mapped_library_paths(MAPS)]
    assert names == ["libggml-base.so", "libggml-cpu-haswell.so", "libllama.so"]


def _runtime(gguf: Path, extra_buffers: str = "auto") -> LlamaRuntime:
    return LlamaRuntime(
        gguf, n_ctx=512, n_batch=64, n_threads=1, n_gpu_layers=0, invariant=False, extra_buffers=extra_buffers
    )


@pytest.mark.model
def test_the_loaded_model_never_uses_the_amx_buffer_type_by_default(gemma_gguf: Path) -> None:
    """On this machine's CPU, as it advertises itself: no AMX buffer in either configuration; where AMX
    is not advertised the fixed split repacks (so the buffer types are really read from llama.cpp)."""
    runtime = _runtime(gemma_gguf)
    try:
        buffers, chosen = runtime.weight_buffers, runtime.extra_buffers
        amx = kernels.advertises_amx(kernels.read_cpu_flags(), kernels.cpu_features(runtime.system_info()))
    finally:
        runtime.close()
    assert buffers and "AMX" not in buffers, buffers
    assert chosen.use is not amx
    if not amx:
        assert "CPU_REPACK" in buffers, buffers


@pytest.mark.model
def test_a_cpu_that_advertises_amx_loads_the_weights_without_extra_buffers(
    gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU's flags and the build's AMX kernels are the things faked: this machine cannot be made to
    advertise AMX, nor its build to have AMX kernels."""
    monkeypatch.setattr(kernels, "read_cpu_flags", lambda: kernels.cpu_flags(X86_CPUINFO))
    real_features = kernels.cpu_features
    monkeypatch.setattr(kernels, "cpu_features", lambda info: [*real_features(info), "AMX_INT8"])
    runtime = _runtime(gemma_gguf)
    try:
        assert not runtime.extra_buffers.use and "AMX" in runtime.extra_buffers.reason
        assert "CPU_REPACK" not in runtime.weight_buffers and "AMX" not in runtime.weight_buffers
    finally:
        runtime.close()
    asked = _runtime(gemma_gguf, extra_buffers="on")
    try:
        assert asked.extra_buffers.use and asked.extra_buffers.reason == "SEMIF_CPU_EXTRA_BUFFERS=on"
    finally:
        asked.close()


@pytest.mark.model
def test_without_readable_mappings_the_libraries_are_the_libllama_file_the_binding_opened(
    gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there is no /proc (macOS) the numerics verdict's key still names the library build: the
    file behind the binding's handle. Faked: the mappings being unreadable, which Linux always allows."""
    read_mappings = kernels.read_mapped_library_paths
    monkeypatch.setattr(kernels, "read_mapped_library_paths", lambda path=kernels.MAPS: [])
    runtime = _runtime(gemma_gguf)
    try:
        files, mapped = runtime.library_files, read_mappings()
    finally:
        runtime.close()
    assert len(files) == 1 and files[0].name.startswith("libllama") and files[0].is_file(), files
    assert files[0] in [p.resolve() for p in mapped]  # the very file the process mapped


@pytest.mark.model
def test_the_engine_reports_its_kernels_in_the_model_meta(gemma_gguf: Path) -> None:
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.settings import EngineSettings

    engine = DecisionEngine.load(EngineSettings(gguf_path=gemma_gguf, numerics="fixed-split"))
    try:
        info = engine.model_info
        features = kernels.cpu_features(engine.runtime.system_info())
    finally:
        engine.close()
    assert info.kernels.features == features
    assert info.kernels.variant == kernels.cpu_variant(features)
    assert f"-{info.kernels.variant}." in info.scoring.llama_cpp
    assert info.kernels.library is not None and info.kernels.library.startswith("libggml-cpu")
    assert info.kernels.weight_buffers == engine.runtime.weight_buffers
