"""The struct layout probe (semif-ops image abi): a C probe compiled with gcc against the llama.h of real
llama-cpp-python sdists, checked for the fields the engine sets and compared with the ctypes layout of real
bindings. No library is built or loaded."""

from __future__ import annotations

import ctypes
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from semif_adapter.engine import abi
from semif_ops.image import abi as llama_abi
from tests.helpers.sdists import sdist

LLAMA_STRUCTS = ("llama_model_params", "llama_context_params", "llama_batch")


def tree(version: str) -> Path:
    return sdist(version) / "vendor" / "llama.cpp"


def package(version: str) -> Path:
    return sdist(version) / "llama_cpp"


@pytest.mark.parametrize("version", ["0.3.30", "0.3.35", "0.3.36"])
def test_each_binding_matches_its_own_vendored_header(version: str) -> None:
    headers = llama_abi.resolve_headers(tree(version), Path("/nonexistent"))
    module = llama_abi.binding.binding_module(package(version))
    layouts = llama_abi.check(headers)
    assert set(layouts) == set(LLAMA_STRUCTS)
    assert llama_abi.compare(layouts, module, "binding", "llama.h") == []
    # Every field of the header is probed, and the binding names the same ones.
    for struct, layout in layouts.items():
        assert [f.name for f in layout.fields] == [f[0] for f in getattr(module, struct)._fields_]
        assert (layout.size, layout.align) == (ctypes.sizeof(getattr(module, struct)), 8)


@pytest.mark.parametrize("version", ["0.3.30", "0.3.35", "0.3.36"])
def test_the_probe_reads_the_c_type_of_every_engine_field(version: str) -> None:
    layouts = llama_abi.c_layout(llama_abi.resolve_headers(tree(version), Path("/nonexistent")))
    for struct, fields in abi.ENGINE_FIELDS.items():
        for name, kind in fields.items():
            assert layouts[struct].field(name).kind == kind, (struct, name)  # type: ignore[union-attr]
    batch = layouts["llama_batch"]
    assert batch.field("seq_id").decl == "llama_seq_id **"  # type: ignore[union-attr]
    assert batch.field("embd").kind == "*?"  # a pointer the engine never follows  # type: ignore[union-attr]
    # the probed layout builds a ctypes class of the same size, the engine fields where C has them
    cls = abi.struct_class(layouts["llama_context_params"])
    assert ctypes.sizeof(cls) == layouts["llama_context_params"].size
    assert cls.kv_unified.offset == layouts["llama_context_params"].field("kv_unified").offset  # type: ignore[union-attr]


def _patched(tmp_path: Path, old: str, new: str) -> llama_abi.Headers:
    target = tmp_path / "llama.cpp"
    shutil.copytree(tree("0.3.36"), target)
    llama_h = target / "include" / "llama.h"
    text = llama_h.read_text()
    assert old in text
    llama_h.write_text(text.replace(old, new, 1))
    return llama_abi.resolve_headers(target, tmp_path)


def test_an_older_layout_is_usable_by_the_engine() -> None:
    """0.3.35 (like DLC b10433) lacks lazy_mode: the binding's structs do not fit, the engine's do."""
    layouts = llama_abi.check(llama_abi.resolve_headers(tree("0.3.35"), Path("/nonexistent")))
    assert layouts["llama_model_params"].size == 72


def test_a_renamed_engine_field_is_refused_naming_it(tmp_path: Path) -> None:
    headers = _patched(tmp_path, "uint32_t n_ubatch;", "uint32_t n_ubatch_max;")
    with pytest.raises(llama_abi.AbiError) as refused:
        llama_abi.check(headers)
    message = str(refused.value)
    assert "llama_context_params.n_ubatch: the engine sets this field; this llama.h lacks it" in message
    assert len(message.splitlines()) == 1


def test_a_retyped_engine_field_is_refused_naming_both_types(tmp_path: Path) -> None:
    headers = _patched(tmp_path, "int8_t       *  logits;", "float        *  logits;")
    with pytest.raises(llama_abi.AbiError, match=r"llama_batch\.logits: the engine needs C type int8_t \*, "
                       r"this llama\.h declares float \* \(float \*\)"):  # fmt: skip
        llama_abi.check(headers)


def test_lazy_mode_moves_llama_model_params_from_72_to_80_bytes() -> None:
    old = llama_abi.c_layout(llama_abi.resolve_headers(tree("0.3.35"), Path("/nonexistent")))
    new = llama_abi.c_layout(llama_abi.resolve_headers(tree("0.3.36"), Path("/nonexistent")))
    assert (old["llama_model_params"].size, new["llama_model_params"].size) == (72, 80)
    assert old["llama_model_params"].field("lazy_mode") is None
    assert new["llama_model_params"].field("lazy_mode").offset == 28  # type: ignore[union-attr]
    assert (
        old["llama_model_params"].field("main_gpu").offset == 28  # type: ignore[union-attr]
        and new["llama_model_params"].field("main_gpu").offset == 32  # type: ignore[union-attr]
    )
    assert old["llama_context_params"].size == new["llama_context_params"].size  # unchanged in between


def test_old_header_with_new_binding_fails_naming_struct_field_and_both_offsets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = llama_abi.main(["compare", "--headers", str(tree("0.3.35")), "--binding", str(package("0.3.36"))])
    err = capsys.readouterr().err
    assert rc == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "llama-cpp-python 0.3.36" in err
    assert "llama_model_params: field 'main_gpu' at offset 28 in llama.h but 32 in binding" in err
    assert "llama_model_params: field 'lazy_mode' at offset 28 in binding does not exist in llama.h" in err
    assert "llama_model_params: size 72 bytes in llama.h but 80 in binding" in err
    assert "llama_context_params" not in err and "llama_batch" not in err
    assert err.index("size 72 bytes") < err.index("'lazy_mode'") < err.index("'main_gpu'")  # cause first


def test_new_header_with_old_binding_names_the_field_the_binding_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = llama_abi.main(["compare", "--headers", str(tree("0.3.36")), "--binding", str(package("0.3.35"))])
    err = capsys.readouterr().err
    assert rc == 1
    assert "field 'lazy_mode' at offset 28 in llama.h is missing from binding" in err


def test_matching_pair_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc = llama_abi.main(["compare", "--headers", str(tree("0.3.36")), "--binding", str(package("0.3.36"))])
    assert rc == 0
    assert capsys.readouterr().out.startswith("ok: llama_model_params, llama_context_params, llama_batch")


def test_headers_from_a_release_tarball_and_a_flat_include_dir(tmp_path: Path) -> None:
    source = tree("0.3.36")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(source, arcname="llama.cpp-b0000")
    tarball = tmp_path / "llama.cpp-b0000.tar.gz"
    tarball.write_bytes(buffer.getvalue())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    from_tar = llama_abi.resolve_headers(tarball, scratch)
    assert from_tar.version == "0.5.0-dev"
    flat = tmp_path / "include"
    flat.mkdir()
    for header in [*(source / "include").glob("*.h"), *(source / "ggml" / "include").glob("*.h")]:
        (flat / header.name).write_bytes(header.read_bytes())
    (flat / "VERSION.json").write_text(json.dumps({"version": "0.5.0-dev", "commit": "0c1e57098"}))
    from_flat = llama_abi.resolve_headers(flat, tmp_path)
    assert (from_flat.version, from_flat.commit) == ("0.5.0-dev", "0c1e57098")
    assert llama_abi.c_layout(from_tar) == llama_abi.c_layout(from_flat)


def test_header_field_reader_handles_function_pointers_and_arrays() -> None:
    text = """
    struct llama_x {
        // a comment; with a semicolon
        int32_t a; /* block; comment */
        bool (*abort_cb)(void * data);
        char name[128];
        float b, c;
    };"""
    assert llama_abi.header_fields(text, "llama_x") == ["a", "abort_cb", "name", "b", "c"]
    with pytest.raises(llama_abi.AbiError, match="llama_y: not defined"):
        llama_abi.header_fields(text, "llama_y")


def test_missing_headers_are_refused_with_what_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert llama_abi.main(["compare", "--headers", str(tmp_path), "--binding", str(package("0.3.36"))]) == 1
    assert f"{tmp_path} holds no llama.h" in capsys.readouterr().err


def test_verify_against_the_installed_library_records_the_verified_pair(tmp_path: Path) -> None:
    """The build step on the real libllama of the test install (llama.cpp vendored in 0.3.36)."""
    record = tmp_path / "llama-abi.json"
    argv = [
        "verify",
        "--headers",
        str(tree("0.3.36")),
        "--expect-version",
        "0.5.0-dev",
        "--record",
        str(record),
    ]
    assert llama_abi.main(argv) == 0
    data = json.loads(record.read_text())
    live = llama_abi.binding.library_version(llama_abi.binding.load().llama_cpp._lib)
    assert data["library"] == {"llama": "0.5.0-dev", "ggml": live.ggml, "commit": live.commit}
    assert data["binding"] == "0.3.36" and data["library_path"].endswith("libllama.so")
    fields = {f["name"]: f for f in data["structs"]["llama_model_params"]["fields"]}
    assert fields["lazy_mode"]["offset"] == 28 and fields["n_gpu_layers"]["kind"] == "i32"
    assert data["structs"]["llama_model_params"]["size"] == 80


def test_verify_says_which_build_args_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_abi.main(["verify", "--headers", str(tree("0.3.36")), "--expect-version", ""]) == 1
    err = capsys.readouterr().err
    assert "reports llama.cpp 0.5.0-dev" in err and "the build was not told which llama.cpp to expect" in err
    assert "pass --build-arg LLAMA_CPP_VERSION=0.5.0-dev --build-arg LLAMA_CPP_COMMIT=" in err


def test_verify_refuses_headers_of_another_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_abi.main(["verify", "--headers", str(tree("0.3.35")), "--expect-version", "0.5.0-dev"]) == 1
    err = capsys.readouterr().err
    assert "are llama.cpp 0.1.0-dev but libllama at" in err and "reports llama.cpp 0.5.0-dev" in err
