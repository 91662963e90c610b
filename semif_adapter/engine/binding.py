"""Load llama-cpp-python's ctypes bindings against whatever libllama the image carries.

llama-cpp-python binds every wrapper at import time with ``getattr(lib, name)`` and no fallback, so one
symbol the library lacks (a wrapper this engine never calls) makes ``import llama_cpp`` fail. The DLC ships
a llama.cpp release that is older than the one the binding was generated from, so that is the normal case.

How: before ``llama_cpp.llama_cpp`` runs, its helper module ``llama_cpp._ctypes_extensions`` is imported on
its own (without running the package ``__init__``) and two of its functions are wrapped:

- ``ctypes_function_for_shared_library``: a symbol the library lacks becomes a stub that raises
  :class:`MissingSymbolError` when called, and its name is recorded;
- ``load_shared_library``: the path it opened is recorded, and a failure becomes one line.

Why a runtime wrap and not an install-time patch of ``llama_cpp.py``: nothing on disk changes, so the
installed wheel stays verifiable by its RECORD hashes; the wrap works for every binding version that keeps
those two helpers (0.3.x all do), and when a future binding drops them the loader refuses with one line
naming what it expected instead of silently loading an unpatched, intolerant binding. The engine's own
symbols are still checked by name after the import (:func:`load`), so tolerance never hides a symbol the
engine calls.

The same wrap, with a library that has no symbols at all, gives the binding's module without any libllama
(:func:`binding_module`), so ``semif-ops image abi compare`` can set its structs beside a header's.

Which struct layouts the engine then uses is decided here too: a proven record's (:func:`check_recorded`),
or, with no record, the binding's own, and only for the llama.cpp build the binding was written for
(:func:`binding_layouts_for`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from semif_adapter.engine import abi
from semif_adapter.errors import ModelLoadError

HELPERS = "llama_cpp._ctypes_extensions"


class BindingError(ModelLoadError):
    """The bindings cannot be used with the library found; the message is one line."""


class MissingSymbolError(AttributeError):
    """A wrapper whose symbol the loaded libllama does not export was called."""


@dataclass(frozen=True)
class LibraryVersion:
    """What a libllama says about itself; ``None`` where this build does not export the function."""

    llama: str | None
    ggml: str | None
    commit: str | None

    def describe(self) -> str:
        parts = [
            f"llama.cpp {self.llama or '(no llama_version)'}",
            f"ggml {self.ggml or '(no ggml_version)'}",
            f"commit {self.commit or '(no ggml_commit)'}",
        ]
        return ", ".join(parts)


@dataclass
class LoadReport:
    """What one tolerant load saw: the library path and the wrappers left unbound."""

    path: str | None = None
    missing: list[str] | None = None


_report = LoadReport(missing=[])


def library_version(lib: Any) -> LibraryVersion:
    """``llama_version()``, ``ggml_version()`` and ``ggml_commit()`` where exported (dlsym on a libllama
    handle also finds the ggml symbols of the libggml-base it links)."""

    def call(name: str) -> str | None:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            return None
        fn.argtypes = []
        fn.restype = ctypes.c_char_p
        raw = fn()
        return raw.decode("utf-8", "replace") if raw else None

    return LibraryVersion(call("llama_version"), call("ggml_version"), call("ggml_commit"))


def loaded_library_files(lib: Any) -> list[Path]:
    """The file a ctypes handle was opened from (``CDLL._name``), where it names one that exists: what
    is known of the libllama build where the process's mappings cannot be read (no ``/proc``)."""
    name = getattr(lib, "_name", None)
    if not isinstance(name, str) or not Path(name).is_file():
        return []
    return [Path(name).resolve()]


def _tolerant_function_factory(original: Callable[..., Any], missing: list[str]) -> Callable[..., Any]:
    @functools.wraps(original)
    def ctypes_function_for_shared_library(lib: Any) -> Callable[..., Any]:
        strict = original(lib)

        def ctypes_function(name: str, argtypes: list[Any], restype: Any, enabled: bool = True) -> Any:
            if not enabled or hasattr(lib, name):
                return strict(name, argtypes, restype, enabled)

            def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
                missing.append(name)

                @functools.wraps(f)
                def unavailable(*_: Any, **__: Any) -> Any:
                    raise MissingSymbolError(f"{name} is not exported by the loaded libllama")

                return unavailable

            return decorator

        return ctypes_function

    return ctypes_function_for_shared_library


def _recording_loader(original: Callable[..., Any], report: LoadReport) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_shared_library(lib_base_name: str, base_path: Path) -> Any:
        report.path = str(Path(base_path) / f"lib{lib_base_name}.so")
        return original(lib_base_name, base_path)

    return load_shared_library


def _wrap_helpers(module: types.ModuleType, report: LoadReport) -> None:
    for attr in ("ctypes_function_for_shared_library", "load_shared_library"):
        if not callable(getattr(module, attr, None)):
            raise BindingError(
                f"llama-cpp-python's {module.__name__} has no {attr}(); this binding version is not one the "
                "tolerant loader supports (0.3.x)"
            )
    if getattr(module, "_semif_tolerant", False):
        return
    assert report.missing is not None
    module.ctypes_function_for_shared_library = _tolerant_function_factory(  # type: ignore[attr-defined]
        module.ctypes_function_for_shared_library, report.missing
    )
    module.load_shared_library = _recording_loader(module.load_shared_library, report)  # type: ignore[attr-defined]
    module._semif_tolerant = True  # type: ignore[attr-defined]


def _exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BindingError(f"cannot read {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _package_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise BindingError("llama-cpp-python is not installed (no llama_cpp package)")
    return Path(next(iter(spec.submodule_search_locations)))


def install_tolerant_loader() -> LoadReport:
    """Put the wrapped helpers in place before ``llama_cpp.llama_cpp`` is imported; idempotent."""
    if "llama_cpp.llama_cpp" in sys.modules:
        # Already imported (by us, or strictly by someone else, in which case every wrapper did bind).
        if _report.path is None:
            _report.path = getattr(getattr(sys.modules["llama_cpp.llama_cpp"], "_lib", None), "_name", None)
        return _report
    helpers = sys.modules.get(HELPERS) or _exec_file(HELPERS, _package_dir() / "_ctypes_extensions.py")
    _wrap_helpers(helpers, _report)
    return _report


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load(required: Iterable[str] = ()) -> Any:
    """Import ``llama_cpp`` tolerantly; every name in ``required`` must be bound to the library.

    Any failure is a :class:`BindingError` whose message is one line naming the library path, the version
    it reports and the missing symbols.
    """
    report = install_tolerant_loader()
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as raw
    except BindingError:
        raise
    except Exception as exc:
        where = report.path or "llama-cpp-python's default library path"
        raise BindingError(f"cannot load libllama ({where}): {_one_line(exc)}") from None
    lib = raw._lib
    absent = sorted(name for name in required if not hasattr(lib, name))
    if absent:
        raise BindingError(
            f"libllama at {report.path or getattr(lib, '_name', '?')} ({library_version(lib).describe()}) "
            f"lacks {len(absent)} symbol(s) the engine calls: {', '.join(absent)}"
        )
    return llama_cpp


def loaded_path() -> str | None:
    return _report.path


def unbound_wrappers() -> list[str]:
    """Wrappers of the binding that the loaded library could not back (never called by the engine)."""
    return sorted(set(_report.missing or []))


# --- the binding's struct layouts without a library -------------------------------------------------------


class _NoSymbols:
    """Stands in for a CDLL that exports nothing; ``llama_max_devices`` is read at import, so it answers."""

    class _MaxDevices:
        def __init__(self) -> None:
            self.argtypes: list[Any] = []
            self.restype: Any = None

        def __call__(self) -> int:
            return 16

    def __init__(self) -> None:
        self.llama_max_devices = self._MaxDevices()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


@contextmanager
def _isolated_modules(prefix: str) -> Iterator[None]:
    saved = {k: v for k, v in sys.modules.items() if k == prefix or k.startswith(prefix + ".")}
    for key in saved:
        del sys.modules[key]
    try:
        yield
    finally:
        for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
            del sys.modules[key]
        sys.modules.update(saved)


def binding_module(package_dir: Path | None = None) -> types.ModuleType:
    """``llama_cpp.llama_cpp`` of an installed or unpacked binding, executed against no library at all."""
    directory = Path(package_dir) if package_dir else _package_dir()
    with _isolated_modules("llama_cpp"):
        package = types.ModuleType("llama_cpp")
        package.__path__ = [str(directory)]
        sys.modules["llama_cpp"] = package
        helpers = _exec_file(HELPERS, directory / "_ctypes_extensions.py")
        _wrap_helpers(helpers, LoadReport(missing=[]))
        helpers.load_shared_library = lambda *_: _NoSymbols()  # type: ignore[attr-defined]
        return _exec_file("llama_cpp.llama_cpp", directory / "llama_cpp.py")


# --- which library may be used, and with which struct layouts ---------------------------------------------

# The llama.cpp commit each supported llama-cpp-python release vendors (its CHANGELOG's "update llama.cpp to
# ggml-org/llama.cpp@..."): without a proven record, the library must be that build. tests/deploy checks
# this table against the sdists.
BINDING_LLAMA_COMMITS = {"0.3.36": "0c1e57098"}
PROVE_HINT = (
    "prove it: semif-ops image abi verify --lib-dir <dir of that libllama.so> --headers "
    "<its llama.cpp source tree or release tarball> --record llama-abi.json, then start with "
    "SEMIF_LLAMA_ABI_RECORD=llama-abi.json"
)


def same_commit(a: str, b: str) -> bool:
    """Short and long hashes of one commit match (a "-dirty" build too); an empty side matches anything."""
    a, b = (x.strip().lower().removesuffix("-dirty") for x in (a, b))
    return not a or not b or a.startswith(b) or b.startswith(a)


def _where(lib: Any) -> str:
    return _report.path or str(getattr(lib, "_name", "?"))


def binding_layouts_for(lib: Any, module: Any, binding_version: str) -> dict[str, abi.Layout]:
    """No record: the library must be the llama.cpp build the binding was written for; its layouts then."""
    expected = BINDING_LLAMA_COMMITS.get(binding_version)
    found = library_version(lib)
    if expected is None:
        raise BindingError(
            f"llama-cpp-python {binding_version} is not a release this semif-adapter knows the llama.cpp of "
            f"(known: {', '.join(BINDING_LLAMA_COMMITS)}); {PROVE_HINT}"
        )
    if found.commit is None or found.commit == "unknown" or not same_commit(found.commit, expected):
        raise BindingError(
            f"libllama at {_where(lib)} reports {found.describe()}, but llama-cpp-python {binding_version} "
            f"was written for llama.cpp commit {expected} and no proven layout record is set; {PROVE_HINT}"
        )
    return abi.binding_layouts(module)


def check_recorded(lib: Any, record_path: Path, binding_version: str) -> dict[str, abi.Layout]:
    """The proven record's layouts; refuses a library other than the one the record was proven for."""
    try:
        record = json.loads(Path(record_path).read_text(encoding="utf-8"))
        expected = LibraryVersion(**record["library"])
        expected_binding = record["binding"]
        layouts = {name: abi.Layout.from_json(name, data) for name, data in record["structs"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BindingError(
            f"cannot read the proven llama.cpp record {record_path} (semif-ops image abi verify writes "
            f"it): {_one_line(exc)}"
        ) from None
    found = library_version(lib)
    if asdict(found) != asdict(expected) or binding_version != expected_binding:
        raise BindingError(
            f"libllama at {_where(lib)} reports {found.describe()} with llama-cpp-python {binding_version}, "
            f"but {record_path} was proven for {expected.describe()} with llama-cpp-python "
            f"{expected_binding}; rebuild the image on this base, or prove this library again"
        )
    return layouts
