"""The image build's own checks, run here on real files: docker/check-base.sh against library directories laid
out like the DLC's, and semif-ops image context's wheel retagging and header export."""

from __future__ import annotations

import email.parser
import json
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from semif_ops.errors import OperationFailed
from semif_ops.image import abi as llama_abi
from semif_ops.image import context as prepare_image_context
from tests.helpers.deploy import REPO_ROOT
from tests.helpers.sdists import sdist

CHECK = REPO_ROOT / "docker" / "check-base.sh"
HERE_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def dlc_lib_dir(root: Path, names: tuple[str, ...]) -> Path:
    """A directory like the DLC's /opt/llama.cpp/bin (empty files are enough for a layout check)."""
    directory = root / "opt" / "llama.cpp" / "bin"
    directory.mkdir(parents=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


DLC_CPU = (
    "libllama.so",
    "libllama.so.0",
    "libggml.so",
    "libggml-base.so",
    "libggml-cpu-x64.so",
    "libggml-cpu-haswell.so",
)


def check_base(
    tmp_path: Path, lib_dir: Path, plugin: str = "libggml-cpu", **context: str
) -> subprocess.CompletedProcess[str]:
    ctx = tmp_path / "context.json"
    ctx.write_text(json.dumps({"python": HERE_PYTHON, "arch": platform.machine(), **context}, indent=2))
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "LLAMA_LIB_DIR": str(lib_dir)}
    return subprocess.run(
        ["sh", str(CHECK), str(ctx), plugin, str(tmp_path / "base.env")],
        capture_output=True,
        text=True,
        env=env,
    )


def test_check_base_accepts_a_dlc_layout_and_records_what_it_found(tmp_path: Path) -> None:
    lib_dir = dlc_lib_dir(tmp_path, DLC_CPU)
    result = check_base(tmp_path, lib_dir)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "base.env").read_text() == f"PYTHON={sys.executable}\nLLAMA_LIB_DIR={lib_dir}\n"
    assert result.stdout.startswith(f"base: Python {HERE_PYTHON} at {sys.executable}, {platform.machine()},")
    assert "libggml-cpu-haswell.so" in result.stdout


@pytest.mark.parametrize(
    ("names", "plugin", "context", "message"),
    [
        (
            DLC_CPU,
            "libggml-cpu",
            {"python": "3.99"},
            f"is {HERE_PYTHON} but the wheelhouse is for 3.99; run: make image-context "
            f"IMAGE_PYTHON={HERE_PYTHON}",
        ),
        (
            DLC_CPU,
            "libggml-cpu",
            {"arch": "riscv64"},
            f"the base is {platform.machine()} but the wheelhouse is for riscv64",
        ),
        (DLC_CPU, "libggml-cuda", {}, "no ggml backend plugin libggml-cuda*.so beside libllama in"),
        (
            ("libllama.so", "libggml-base.so", "libggml-cpu.a"),
            "libggml-cpu",
            {},
            "(found: libggml-base.so libggml-cpu.a libllama.so )",
        ),
        (("libllama.so", "libggml-cpu-x64.so"), "libggml-cpu", {}, "no libggml-base.so* beside libllama"),
        (("libggml.so",), "libggml-cpu", {}, "holds no libllama.so*"),
    ],
    ids=["python", "arch", "no-cuda-plugin", "static-only", "no-ggml-base", "no-libllama"],
)
def test_check_base_refuses_with_one_line_saying_what_it_found(
    tmp_path: Path, names: tuple[str, ...], plugin: str, context: dict[str, str], message: str
) -> None:
    result = check_base(tmp_path, dlc_lib_dir(tmp_path, names), plugin, **context)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: base image check: "), result.stderr
    assert message in lines[0]
    assert not (tmp_path / "base.env").exists()


def test_check_base_without_a_prepared_wheelhouse(tmp_path: Path) -> None:
    result = subprocess.run(
        ["sh", str(CHECK), str(tmp_path / "missing.json"), "libggml-cpu", str(tmp_path / "env")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "prepare it first: make image-context" in result.stderr


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    dist = "demo-1.0.dist-info"
    meta = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist}/METADATA", b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        archive.writestr(f"{dist}/WHEEL", meta)
        archive.writestr(f"{dist}/RECORD", b"")
    return path


def test_pure_wheel_is_retagged_and_installs(tmp_path: Path) -> None:
    built = make_wheel(tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl", {"demo/__init__.py": b"X = 1\n"})
    out = tmp_path / "out"
    out.mkdir()
    retagged = prepare_image_context.retag_pure(built, out)
    assert retagged.name == "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(retagged) as archive:
        wheel_meta = archive.read("demo-1.0.dist-info/WHEEL").decode()
        record = archive.read("demo-1.0.dist-info/RECORD").decode()
    parsed = email.parser.Parser().parsestr(wheel_meta)  # as pip reads it: a blank line ends the headers
    assert parsed.get_all("Tag") == ["py3-none-any"] and parsed["Root-Is-Purelib"] == "true"
    assert "cp311" not in wheel_meta
    assert "demo-1.0.dist-info/WHEEL,sha256=" in record and "demo/__init__.py,sha256=" in record
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--target", str(target), str(retagged)],
        check=True,
    )  # fmt: skip
    assert (target / "demo" / "__init__.py").read_text() == "X = 1\n"


def test_wheel_with_native_code_is_not_retagged(tmp_path: Path) -> None:
    built = make_wheel(
        tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl",
        {"demo/__init__.py": b"", "demo/lib/libggml-base.bin": b"\x7fELF\x02\x01"},
    )
    with pytest.raises(OperationFailed, match=r"not pure Python \(contains demo/lib/libggml-base.bin\)"):
        prepare_image_context.retag_pure(built, tmp_path)


def test_header_sets_are_kept_per_llama_cpp_and_picked_by_the_library(tmp_path: Path) -> None:
    root = tmp_path / "llama-headers"
    new = prepare_image_context.write_headers(
        sdist("0.3.36") / "vendor" / "llama.cpp", root, None, "0c1e57098"
    )
    old = prepare_image_context.write_headers(
        sdist("0.3.35") / "vendor" / "llama.cpp", root, None, "4df29be4f"
    )
    assert (new["version"], new["commit"]) == ("0.5.0-dev", "0c1e57098")
    assert sorted(p.name for p in root.iterdir()) == ["0.1.0-dev-4df29be4f", "0.5.0-dev-0c1e57098"]
    assert {"llama.h", "ggml.h", "ggml-backend.h"} <= {p.name for p in Path(str(new["path"])).iterdir()}
    assert old["path"] == str(root / "0.1.0-dev-4df29be4f")
    library = llama_abi.binding.LibraryVersion("0.5.0-dev", "0.25.3", "0c1e570-dirty")
    sets = [llama_abi.resolve_headers(p, tmp_path) for p in llama_abi._prepared_sets(root)]
    chosen = [h for h in sets if llama_abi._matches(h, library)]
    assert [h.llama_h.parent.name for h in chosen] == ["0.5.0-dev-0c1e57098"]
    assert llama_abi.check(chosen[0])["llama_model_params"].size == 80


def test_auto_headers_pick_the_matching_set_or_say_what_is_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "llama-headers"
    prepare_image_context.write_headers(sdist("0.3.36") / "vendor" / "llama.cpp", root, None, "0c1e57098")
    prepare_image_context.write_headers(sdist("0.3.35") / "vendor" / "llama.cpp", root, None, "4df29be4f")
    monkeypatch.setattr(llama_abi, "PREPARED_HEADERS", root)
    monkeypatch.setattr(llama_abi, "find_base_headers", lambda: None)
    old_lib = llama_abi.binding.LibraryVersion("0.1.0-dev", "0.9.0", "4df29be")
    assert llama_abi._headers_arg("auto", tmp_path, old_lib).commit == "4df29be4f"
    other = llama_abi.binding.LibraryVersion("0.4.1", "0.9.4", "f00dcafe")
    with pytest.raises(
        llama_abi.AbiError, match=r"no prepared header set matches the libllama \(llama.cpp 0.4.1"
    ):
        llama_abi._headers_arg("auto", tmp_path, other)


def test_a_bare_commit_file_beside_the_sources_is_read(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    for part in ("include", "ggml/include"):
        (tree / part).mkdir(parents=True)
        for header in (sdist("0.3.36") / "vendor" / "llama.cpp" / part).glob("*.h"):
            (tree / part / header.name).write_bytes(header.read_bytes())
    (tree / "COMMIT").write_text("0c1e57098\n")
    assert llama_abi.resolve_headers(tree, tmp_path).commit == "0c1e57098"
