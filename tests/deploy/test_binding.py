"""The tolerant loader (semif_adapter/engine/binding.py) against real shared libraries.

A tiny libllama is built with gcc exporting only chosen symbols (as an older llama.cpp release would) and
the real llama-cpp-python 0.3.36 binding from its sdist is imported against it, each case in a fresh
interpreter (a binding can be imported once per process). The installed binding's own libllama is used
for the case of a symbol no release has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from semif_adapter.engine.llama_backend import REQUIRED_SYMBOLS
from semif_ops.image import abi as llama_abi
from tests.helpers.deploy import REPO_ROOT
from tests.helpers.sdists import sdist

VERSIONS = {"llama_version": "0.4.1", "ggml_version": "0.9.4", "ggml_commit": "f00dcafe"}


def fake_libllama(directory: Path, symbols: list[str], versions: dict[str, str] = VERSIONS) -> Path:
    """libllama.so exporting exactly ``symbols`` (plus what the binding reads at import) as no-ops."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["#include <stddef.h>", "size_t llama_max_devices(void) { return 16; }"]
    lines += [f'const char * {name}(void) {{ return "{value}"; }}' for name, value in versions.items()]
    lines += [f"void {name}(void) {{}}" for name in symbols]
    source = directory / "fake.c"
    source.write_text("\n".join(lines) + "\n")
    library = directory / "libllama.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def run_python(
    code: str, lib_dir: Path, binding: Path | None = None, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    paths = [str(REPO_ROOT)] + ([str(binding)] if binding else [])
    full_env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir), "PYTHONPATH": os.pathsep.join(paths), **env}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env)


LOAD = """
import json
from semif_adapter.engine import binding
from semif_adapter.engine.llama_backend import REQUIRED_SYMBOLS
llama_cpp = binding.load(REQUIRED_SYMBOLS)
print(json.dumps({"version": llama_cpp.__version__, "path": binding.loaded_path(),
                  "unbound": binding.unbound_wrappers(),
                  "reported": binding.library_version(llama_cpp.llama_cpp._lib).describe()}))
try:
    llama_cpp.llama_batch_ext_init(None, None)
except binding.MissingSymbolError as exc:
    print("called:", exc)
"""


def test_binding_imports_on_a_library_that_has_only_what_the_engine_calls(tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    fake_libllama(lib_dir, list(REQUIRED_SYMBOLS))
    result = run_python(LOAD, lib_dir, sdist("0.3.36"))
    assert result.returncode == 0, result.stderr
    first, called = result.stdout.strip().splitlines()
    report = json.loads(first)
    assert report["version"] == "0.3.36"
    assert report["path"] == str(lib_dir / "libllama.so")
    assert report["reported"] == "llama.cpp 0.4.1, ggml 0.9.4, commit f00dcafe"
    # The 15 wrappers v0.4.1 lacks are among the unbound ones, and none the engine calls is.
    assert {
        "llama_process",
        "llama_get_causal_attn",
        "llama_batch_ext_init",
        "llama_batch_ext_set_pos",
    } <= set(report["unbound"])
    assert not set(report["unbound"]) & set(REQUIRED_SYMBOLS)
    assert called == "called: llama_batch_ext_init is not exported by the loaded libllama"


def test_strict_binding_fails_on_the_same_library(tmp_path: Path) -> None:
    """Control: without the tolerant loader, this library breaks `import llama_cpp` (the bug being fixed)."""
    lib_dir = tmp_path / "lib"
    fake_libllama(lib_dir, list(REQUIRED_SYMBOLS))
    result = run_python("import llama_cpp", lib_dir, sdist("0.3.36"))
    assert result.returncode != 0
    assert "undefined symbol" in result.stderr and "Traceback" in result.stderr


def test_missing_engine_symbols_are_one_line_with_path_version_and_names(tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    fake_libllama(lib_dir, [s for s in REQUIRED_SYMBOLS if s not in {"llama_decode", "llama_memory_seq_cp"}])
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"decision": {"id": "d", "state": "s", "question": "q",
                                                "options": [{"id": "a", "description": "A"},
                                                            {"id": "b", "description": "B"}]}}))  # fmt: skip
    result = run_python(
        "import sys\nfrom semif_adapter.cli import main\nsys.exit(main(['score', sys.argv[1]]))",
        lib_dir,
        sdist("0.3.36"),
        str(request),
        SEMIF_GGUF_PATH=str(gguf),
        SEMIF_VERIFY_MANIFEST="false",
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0] == (
        f"semif-adapter: libllama at {lib_dir / 'libllama.so'} "
        "(llama.cpp 0.4.1, ggml 0.9.4, commit f00dcafe) "
        "lacks 2 symbol(s) the engine calls: llama_decode, llama_memory_seq_cp"
    )


def test_unloadable_library_is_one_line_naming_the_path(tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    (lib_dir / "libllama.so").write_bytes(b"not an ELF file")
    result = run_python(LOAD, lib_dir, sdist("0.3.36"))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"semif_adapter.engine.binding.BindingError: cannot load libllama ({lib_dir / 'libllama.so'}):"
    )


def test_real_library_missing_a_required_symbol(tmp_path: Path) -> None:
    """The installed binding on its own libllama, with a symbol no release exports added to the list."""
    code = (
        "from semif_adapter.engine import binding\n"
        "from semif_adapter.engine.llama_backend import REQUIRED_SYMBOLS\n"
        "try:\n    binding.load((*REQUIRED_SYMBOLS, 'llama_no_such_symbol'))\n"
        "except binding.BindingError as exc:\n    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert "libllama.so (llama.cpp " in line and "commit " in line
    assert line.endswith("lacks 1 symbol(s) the engine calls: llama_no_such_symbol")


IMPORT = (
    "import sys\nfrom pathlib import Path\nfrom semif_adapter.engine import llama_backend\n"
    "record = Path(sys.argv[1]) if len(sys.argv) > 1 else None\n"
    "try:\n    _, calls = llama_backend.import_llama_cpp(record)\n"
    "except llama_backend.ModelLoadError as exc:\n    print(exc)\n"
    "else:\n    print('accepted', calls.layouts['llama_model_params'].size)\n"
)


def _binding_env(lib_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LLAMA_CPP_LIB_PATH": str(lib_dir),
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{sdist('0.3.36')}",
    }


def test_recorded_version_mismatch_refuses_to_serve(tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    fake_libllama(lib_dir, list(REQUIRED_SYMBOLS))
    record = tmp_path / "llama-abi.json"
    headers = llama_abi.resolve_headers(sdist("0.3.35") / "vendor" / "llama.cpp", tmp_path)
    structs = {name: layout.to_json() for name, layout in llama_abi.c_layout(headers).items()}
    same = {
        "library": {"llama": "0.4.1", "ggml": "0.9.4", "commit": "f00dcafe"},
        "binding": "0.3.36",
        "structs": structs,
    }
    record.write_text(json.dumps(same))
    full = [sys.executable, "-c", IMPORT, str(record)]
    env = _binding_env(lib_dir)
    # the record's layouts are the ones used: 0.3.35's 72-byte llama_model_params, not the binding's 80
    assert subprocess.run(full, capture_output=True, text=True, env=env).stdout.strip() == "accepted 72"
    record.write_text(json.dumps({**same, "library": {**same["library"], "llama": "0.5.0-dev"}}))
    out = subprocess.run(full, capture_output=True, text=True, env=env).stdout.strip()
    assert "reports llama.cpp 0.4.1, ggml 0.9.4, commit f00dcafe with llama-cpp-python 0.3.36" in out
    assert "was proven for llama.cpp 0.5.0-dev" in out and "rebuild the image on this base" in out
    record.write_text(json.dumps({k: v for k, v in same.items() if k != "structs"}))
    out = subprocess.run(full, capture_output=True, text=True, env=env).stdout.strip()
    assert out.startswith(f"cannot read the proven llama.cpp record {record}") and "'structs'" in out


def test_a_record_whose_layout_lacks_an_engine_field_is_refused_naming_it(tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    fake_libllama(lib_dir, list(REQUIRED_SYMBOLS))
    headers = llama_abi.resolve_headers(sdist("0.3.36") / "vendor" / "llama.cpp", tmp_path)
    structs = {name: layout.to_json() for name, layout in llama_abi.c_layout(headers).items()}
    batch = structs["llama_batch"]["fields"]
    next(f for f in batch if f["name"] == "logits")["kind"] = "*u8"
    record = tmp_path / "llama-abi.json"
    library = {"llama": "0.4.1", "ggml": "0.9.4", "commit": "f00dcafe"}
    record.write_text(json.dumps({"library": library, "binding": "0.3.36", "structs": structs}))
    done = subprocess.run([sys.executable, "-c", IMPORT, str(record)], capture_output=True, text=True,
                          env=_binding_env(lib_dir))  # fmt: skip
    out = done.stdout.strip()
    assert out.startswith("llama.cpp struct layout: llama_batch.logits: the engine needs C type int8_t *")
    assert "declares uint8_t *" in out and str(record) in out


@pytest.mark.parametrize(
    ("commit", "accepted"), [("0c1e57098", True), ("0c1e570-dirty", True), ("4df29be4f", False), ("", False)]
)
def test_without_a_record_only_the_bindings_own_llama_cpp_is_used(
    tmp_path: Path, commit: str, accepted: bool
) -> None:
    """No record: the library must report the commit llama-cpp-python 0.3.36 vendors (0c1e57098)."""
    lib_dir = tmp_path / "lib"
    versions = {"llama_version": "0.5.0-dev", "ggml_version": "0.9.4"}
    if commit:
        versions["ggml_commit"] = commit
    fake_libllama(lib_dir, list(REQUIRED_SYMBOLS), versions)
    out = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True,
                         env=_binding_env(lib_dir)).stdout.strip()  # fmt: skip
    if accepted:
        assert out == "accepted 80"  # the binding's own layout
        return
    assert f"reports llama.cpp 0.5.0-dev, ggml 0.9.4, commit {commit or '(no ggml_commit)'}" in out
    assert "but llama-cpp-python 0.3.36 was written for llama.cpp commit 0c1e57098" in out
    assert "semif-ops image abi verify --lib-dir" in out and "SEMIF_LLAMA_ABI_RECORD=llama-abi.json" in out
    assert len(out.splitlines()) == 1


def test_the_binding_commit_table_matches_the_sdists_changelog() -> None:
    from semif_adapter.engine import binding
    from tests.image.dlc_standin import vendored_commit

    for version, commit in binding.BINDING_LLAMA_COMMITS.items():
        assert vendored_commit((sdist(version) / "CHANGELOG.md").read_text()) == commit


@pytest.mark.parametrize("helper", ["ctypes_function_for_shared_library", "load_shared_library"])
def test_a_binding_without_the_wrapped_helpers_is_refused(tmp_path: Path, helper: str) -> None:
    package = tmp_path / "llama_cpp"
    package.mkdir()
    source = (sdist("0.3.36") / "llama_cpp" / "_ctypes_extensions.py").read_text()
    (package / "_ctypes_extensions.py").write_text(source.replace(f"def {helper}(", f"def renamed_{helper}("))
    (package / "__init__.py").write_text("")
    result = run_python(LOAD, tmp_path / "lib", tmp_path)
    assert result.returncode == 1
    assert f"has no {helper}(); this binding version is not one the tolerant loader supports" in result.stderr


def test_load_after_a_strict_import_reports_the_library_it_found(tmp_path: Path) -> None:
    """llama_cpp was imported strictly first (so every wrapper bound): load() still answers."""
    lib_dir = tmp_path / "lib"
    bound = re.findall(
        r'@ctypes_function\(\s*"(\w+)"', (sdist("0.3.36") / "llama_cpp" / "llama_cpp.py").read_text()
    )
    assert len(bound) > 200
    fake_libllama(lib_dir, sorted(set(bound) - set(VERSIONS) - {"llama_max_devices"}))
    code = "import llama_cpp\n" + LOAD.split("try:")[0]
    result = run_python(code, lib_dir, sdist("0.3.36"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["path"] == str(lib_dir / "libllama.so") and report["unbound"] == []
