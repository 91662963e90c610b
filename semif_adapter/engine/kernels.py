"""Which CPU kernels the loaded llama.cpp runs, and whether the weights may take its extra buffer types.

The kernels are a fact of the library, not of a setting: a wheel built natively on an AVX-512 machine
runs AVX-512 code, the DLC's build (``GGML_CPU_ALL_VARIANTS``) loads the best of its
``libggml-cpu-<variant>.so`` plugins for the instance it starts on, and the answers differ between
kernel sets (AVX-512 against AVX2: up to |Δp| 0.067 on the test models). So the engine reports what it
got (start-up log, ``model.kernels``, ``/metrics``) and the scoring version carries it
(``scoring.llama_cpp_part``).

Extra buffer types (``use_extra_bufts``) let llama.cpp repack weights for its fastest matrix kernels:
``CPU_REPACK`` and, on CPUs that advertise AMX, ggml's ``AMX`` buffer type, whose kernels crashed in
``llama_decode`` on an Intel VM. Batch-invariant numerics turn them all off (repacked weights take
batch-shaped kernels). In the fixed split they stay off where the CPU advertises AMX and the build has
AMX kernels, unless ``SEMIF_CPU_EXTRA_BUFFERS=on`` says otherwise; elsewhere repacking is on, as
llama.cpp defaults.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_FEATURE = re.compile(r"([A-Za-z0-9_]+) = 1\b")
_BUFFER = re.compile(r"(\S+) model buffer size")
CPUINFO = Path("/proc/cpuinfo")
MAPS = Path("/proc/self/maps")
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_complex"})


def cpu_features(system_info: str) -> list[str]:
    """The features ``llama_print_system_info()`` reports switched on, in its order."""
    return _FEATURE.findall(system_info)


def cpu_variant(features: Sequence[str]) -> str:
    """A short name for the CPU kernels a build runs: ``avx512``, ``avx2``, ``avx``, ``sse``, ``neon``,
    ``sve`` (with ``+amx`` where AMX kernels are compiled in), or ``generic``."""
    have = set(features)
    if any(f.startswith("AVX512") for f in have):
        name = "avx512"
    elif "AVX2" in have:
        name = "avx2"
    elif "AVX" in have:
        name = "avx"
    elif "SVE" in have:
        name = "sve"
    elif "NEON" in have:
        name = "neon"
    elif any(f.startswith("SSE") for f in have):
        name = "sse"
    else:
        name = "generic"
    return name + ("+amx" if any(f.startswith("AMX") for f in have) else "")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first CPU's feature flags in ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    try:
        return cpu_flags(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def advertises_amx(flags: Iterable[str], features: Iterable[str]) -> bool:
    """The CPU says it has AMX and the loaded library was built with AMX kernels: ggml registers its AMX
    buffer type only then (compiled in, and the CPU's tiles granted at run time). Either alone cannot
    use it: the portable AVX2 plugin on an AMX CPU repacks as it does on any other CPU, so its answers
    do not depend on the host."""
    return bool(AMX_FLAGS & set(flags)) and any(f.startswith("AMX") for f in features)


@dataclass(frozen=True)
class ExtraBuffers:
    use: bool
    reason: str


def extra_buffers(setting: str, *, invariant: bool, amx: bool) -> ExtraBuffers:
    """Whether the weights may go into llama.cpp's extra buffer types (repacking, AMX), and why.

    ``setting`` is ``SEMIF_CPU_EXTRA_BUFFERS``: ``auto`` (off where AMX is advertised), ``on``, ``off``.
    Invariant numerics need them off whatever the setting: the probe proved the plain kernels only."""
    if invariant:
        return ExtraBuffers(False, "invariant numerics: repacked weights take batch-shaped kernels")
    if setting == "off":
        return ExtraBuffers(False, "SEMIF_CPU_EXTRA_BUFFERS=off")
    if setting == "on":
        return ExtraBuffers(True, "SEMIF_CPU_EXTRA_BUFFERS=on")
    if amx:
        return ExtraBuffers(
            False,
            "the CPU advertises AMX, whose buffer type crashed llama_decode on a VM; "
            "SEMIF_CPU_EXTRA_BUFFERS=on enables it",
        )
    return ExtraBuffers(True, "weight repacking on (no AMX advertised)")


def weight_buffers(load_log: Iterable[str]) -> list[str]:
    """The buffer types llama.cpp put the weights in (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``AMX``,
    ``CUDA0``…), from its load log's ``<type> model buffer size`` lines, in order, once each."""
    seen: list[str] = []
    for line in load_log:
        for name in _BUFFER.findall(line):
            if name not in seen:
                seen.append(name)
    return seen


#: The CPU backend's library: ``libggml-cpu-haswell.so`` where the build carries one plugin per variant and
#: loaded the best, ``libggml-cpu.so`` otherwise.
CPU_BACKEND = ("libggml-cpu",)
#: The library files whose code computes a CPU forward pass: llama.cpp itself, ggml's core and ops, and
#: the CPU backend (a CUDA or Vulkan plugin computes nothing on the CPU, and hashing one takes seconds).
NUMERICS_LIBRARIES = ("libllama", "libggml-base", "libggml.", *CPU_BACKEND)


def mapped_library_paths(maps: str, prefixes: tuple[str, ...] = NUMERICS_LIBRARIES) -> list[Path]:
    """The files mapped into this process (``/proc/self/maps``) whose names start with ``prefixes``."""
    paths = set()
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[-1]).name.startswith(prefixes):
            paths.add(Path(fields[-1]))
    return sorted(paths)


def read_mapped_library_paths(path: Path = MAPS) -> list[Path]:
    """:func:`mapped_library_paths` of this process: every :data:`NUMERICS_LIBRARIES` file."""
    try:
        return mapped_library_paths(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def cpu_library_paths(paths: Iterable[Path]) -> list[Path]:
    """The CPU backend's files among ``paths``."""
    return [p for p in paths if p.name.startswith(CPU_BACKEND)]


def library_names(paths: Iterable[Path]) -> str | None:
    """``paths`` as a report names them (file names, comma-separated), or None where there are none."""
    return ", ".join(sorted({p.name for p in paths})) or None
