"""Prove that llama-cpp-python's ctypes structs have the C layout of a given llama.h.

A small C program is generated from the header's own field lists, compiled against that header with the
C compiler at hand, and prints the size, every field offset and every field size of the structs the engine
passes or receives by value (``STRUCTS``). Those numbers are compared with the binding's ctypes layout; a
mismatch names the struct, the field and both offsets. A symbol check alone cannot see a field inserted in
the middle of a struct (``lazy_mode`` in ``llama_model_params``), and a struct passed by value with the wrong
shape gives garbage or a crash, so the image build runs this before it records anything.

    # compare a header with a binding, no library needed (unit tests, a quick look at a release):
    python scripts/llama_abi.py compare --headers vendor/llama.cpp --binding path/to/llama_cpp
    # image build: load the base's libllama, prove the layout, record the verified pair:
    python scripts/llama_abi.py verify --lib-dir /opt/semif/llama-lib --headers auto \
        --expect-version 0.4.1 --record /opt/semif/llama-abi.json

``--headers`` takes a llama.cpp source tree, a release tarball (.tar.gz), a directory holding llama.h and
the ggml headers side by side (an installed include dir), or ``auto``: the base's own llama.h when it ships
one, else the headers prepared into the build context (docker/llama-headers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    from semif_adapter.engine import binding
except ModuleNotFoundError:  # run as a file from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from semif_adapter.engine import binding

# Structs crossing the C boundary by value in calls the engine makes: llama_model_load_from_file,
# llama_init_from_model, llama_*_default_params (returned), llama_batch_init (returned), llama_decode.
STRUCTS = ("llama_model_params", "llama_context_params", "llama_batch")
PREPARED_HEADERS = Path(__file__).resolve().parents[1] / "docker" / "llama-headers"
SEARCH_ROOTS = ("/usr/local/include", "/usr/include", "/app", "/opt", "/usr/local", "/usr/lib", "/usr/lib64")


class AbiError(Exception):
    """A refusal; its message is one line and says what was found."""


@dataclass(frozen=True)
class Headers:
    include_dirs: tuple[Path, ...]
    llama_h: Path
    version: str | None  # llama.cpp version of the source, when it says
    commit: str | None
    origin: str


# --- where the headers come from ---------------------------------------------------------------------------


def _cmake_version(tree: Path) -> str | None:
    """LLAMA_VERSION as the tree's CMakeLists.txt defines it (base + "-dev" unless a release build)."""
    cmake = tree / "CMakeLists.txt"
    if not cmake.is_file():
        return None
    text = cmake.read_text(encoding="utf-8", errors="replace")
    parts = [re.search(rf"set\(LLAMA_VERSION_{p}\s+(\d+)\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        return None
    base = ".".join(m[1] for m in parts if m)
    dev = re.search(r'option\(LLAMA_BUILD_IS_DEV\s+"[^"]*"\s+(ON|OFF)\)', text)
    return f"{base}-dev" if dev and dev[1] == "ON" else base


def _version_file(directory: Path) -> tuple[str | None, str | None]:
    """VERSION.json (written by prepare_image_context.py), else a bare COMMIT file beside the sources."""
    meta = directory / "VERSION.json"
    if meta.is_file():
        data = json.loads(meta.read_text(encoding="utf-8"))
        return data.get("version"), data.get("commit")
    commit = directory / "COMMIT"
    return None, (commit.read_text(encoding="utf-8").strip() or None) if commit.is_file() else None


def resolve_headers(source: Path, scratch: Path) -> Headers:
    """Headers from a source tree, a tarball or a flat include directory."""
    source = Path(source)
    if source.is_file() and source.name.endswith((".tar.gz", ".tgz", ".tar.xz", ".tar")):
        with tarfile.open(source) as archive:
            members = [
                m for m in archive.getmembers() if m.name.endswith(".h") or m.name.endswith("CMakeLists.txt")
            ]
            archive.extractall(scratch, members=members, filter="data")
        tops = [p for p in scratch.iterdir() if p.is_dir()]
        source = tops[0] if len(tops) == 1 else scratch
    if not source.is_dir():
        raise AbiError(f"llama.cpp headers: {source} is neither a directory nor a .tar.gz")
    version, commit = _version_file(source)
    if (source / "include" / "llama.h").is_file() and (source / "ggml" / "include" / "ggml.h").is_file():
        return Headers(
            (source / "include", source / "ggml" / "include"),
            source / "include" / "llama.h",
            version or _cmake_version(source),
            commit,
            f"llama.cpp source tree {source}",
        )
    if (source / "llama.h").is_file() and (source / "ggml.h").is_file():
        return Headers((source,), source / "llama.h", version, commit, f"include directory {source}")
    raise AbiError(
        f"llama.cpp headers: {source} holds no llama.h with ggml.h (tree: include/ + ggml/include/)"
    )


def find_base_headers(roots: Sequence[str] = SEARCH_ROOTS) -> Path | None:
    """The base image's own llama.h (with ggml.h beside it), if it ships one."""
    for root in roots:
        if not Path(root).is_dir():
            continue
        for llama_h in sorted(Path(root).rglob("llama.h")):
            if (llama_h.parent / "ggml.h").is_file():
                return llama_h.parent
            tree = llama_h.parent.parent
            if (tree / "ggml" / "include" / "ggml.h").is_file():
                return tree
    return None


# --- the C side --------------------------------------------------------------------------------------------


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def header_fields(text: str, struct: str) -> list[str]:
    """Field names of ``struct <name> { ... }`` in declaration order, read from the header text."""
    text = _strip_comments(text)
    match = re.search(rf"\bstruct\s+{re.escape(struct)}\s*\{{", text)
    if not match:
        raise AbiError(f"{struct}: not defined in llama.h")
    depth, start = 1, match.end()
    i = start
    while depth:
        if i >= len(text):
            raise AbiError(f"{struct}: unbalanced braces in llama.h")
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = text[start : i - 1]
    names: list[str] = []
    for decl in (d.strip() for d in body.split(";")):
        if not decl:
            continue
        pointer_to_function = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
        if pointer_to_function:
            names.append(pointer_to_function[1])
            continue
        first, *more = decl.split(",")
        names.append(re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "", first))[-1])
        names += [re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "", m))[-1] for m in more]
    return names


def probe_source(fields: dict[str, list[str]]) -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "llama.h"', "", "int main(void) {"]
    for struct, names in fields.items():
        lines.append(f'    printf("{struct} . %zu\\n", sizeof(struct {struct}));')
        for name in names:
            lines.append(
                f'    printf("{struct} {name} %zu %zu\\n", offsetof(struct {struct}, {name}), '
                f"sizeof(((struct {struct} *)0)->{name}));"
            )
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def compiler(explicit: str | None = None) -> list[str]:
    """The probe's C compiler: --cc, $CC, cc/gcc/clang on PATH, else zig from the ziglang wheel."""
    chosen = explicit or os.environ.get("CC")
    if chosen:
        return shlex.split(chosen)
    for name in ("cc", "gcc", "clang"):
        if path := shutil.which(name):
            return [path]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise AbiError("no C compiler for the layout probe (cc, gcc, clang or the ziglang wheel)") from None
    return [sys.executable, "-m", "ziglang", "cc"]


@dataclass(frozen=True)
class CLayout:
    size: int
    offsets: dict[str, int]
    sizes: dict[str, int]


def c_layout(
    headers: Headers, structs: Sequence[str] = STRUCTS, cc: Sequence[str] | None = None
) -> dict[str, CLayout]:
    """Compile and run the probe against ``headers``; the layouts the C compiler gives."""
    text = headers.llama_h.read_text(encoding="utf-8", errors="replace")
    fields = {s: header_fields(text, s) for s in structs}
    command = list(cc or compiler())
    with tempfile.TemporaryDirectory(prefix="llama-abi-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(probe_source(fields), encoding="utf-8")
        includes = [f"-I{d}" for d in headers.include_dirs]
        env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": os.environ.get("ZIG_GLOBAL_CACHE_DIR", f"{tmp}/zig")}
        built = subprocess.run(
            [*command, "-std=c11", "-O0", *includes, str(src), "-o", str(exe)],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if built.returncode != 0:
            first = next((ln for ln in built.stderr.splitlines() if "error" in ln), built.stderr.strip())
            raise AbiError(f"the layout probe does not compile against {headers.llama_h}: {first}")
        ran = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    result: dict[str, CLayout] = {}
    for line in ran.stdout.splitlines():
        struct, field, *numbers = line.split()
        if field == ".":
            result[struct] = CLayout(int(numbers[0]), {}, {})
        else:
            result[struct].offsets[field] = int(numbers[0])
            result[struct].sizes[field] = int(numbers[1])
    return result


# --- comparison --------------------------------------------------------------------------------------------


def _field_sizes(module: object, struct: str) -> dict[str, int]:
    cls = getattr(module, struct)
    return {f[0]: getattr(cls, f[0]).size for f in cls._fields_}


def compare(c: dict[str, CLayout], module: object, binding_name: str, header_name: str) -> list[str]:
    """One line per difference between the C layouts and the binding's ctypes structs; per struct the size
    and the fields only one side has come first (the cause), then the fields that moved (the effect)."""
    py = binding.ctypes_layout(module, c)
    problems: list[str] = []
    for struct, cl in c.items():
        pl = py[struct]
        py_sizes = _field_sizes(module, struct)
        cause: list[str] = []
        effect: list[str] = []
        if pl.size != cl.size:
            cause.append(f"{struct}: size {cl.size} bytes in {header_name} but {pl.size} in {binding_name}")
        for field, c_off in cl.offsets.items():
            if field not in pl.offsets:
                cause.append(
                    f"{struct}: field '{field}' at offset {c_off} in {header_name} "
                    f"is missing from {binding_name}"
                )
            elif pl.offsets[field] != c_off:
                effect.append(
                    f"{struct}: field '{field}' at offset {c_off} in {header_name} but {pl.offsets[field]} "
                    f"in {binding_name}"
                )
            elif py_sizes[field] != cl.sizes[field]:
                cause.append(
                    f"{struct}: field '{field}' is {cl.sizes[field]} bytes in {header_name} but "
                    f"{py_sizes[field]} in {binding_name}"
                )
        for field, p_off in pl.offsets.items():
            if field not in cl.offsets:
                cause.append(
                    f"{struct}: field '{field}' at offset {p_off} in {binding_name} "
                    f"does not exist in {header_name}"
                )
        problems += cause + effect
    return problems


def binding_version(package_dir: Path) -> str:
    match = re.search(
        r'__version__\s*=\s*"([^"]+)"', (package_dir / "__init__.py").read_text(encoding="utf-8")
    )
    return match[1] if match else "unknown"


def _installed_binding_dir() -> Path:
    return binding._package_dir()


def check(
    headers: Headers, module: object, binding_label: str, cc: Sequence[str] | None = None
) -> dict[str, CLayout]:
    """The C layouts, or AbiError naming every difference."""
    layouts = c_layout(headers, cc=cc)
    header_label = f"llama.h ({headers.origin}{', llama.cpp ' + headers.version if headers.version else ''})"
    problems = compare(layouts, module, "binding", "llama.h")
    if problems:
        raise AbiError(
            f"struct layout mismatch between {header_label} and {binding_label}: " + "; ".join(problems)
        )
    return layouts


# --- commands ----------------------------------------------------------------------------------------------


def _prepared_sets(root: Path | None = None) -> list[Path]:
    """docker/llama-headers/<label>/ sets (one per llama.cpp the context was prepared for)."""
    root = root or PREPARED_HEADERS
    if (root / "llama.h").is_file():
        return [root]
    return sorted(p for p in root.iterdir() if (p / "llama.h").is_file()) if root.is_dir() else []


def _matches(headers: Headers, found: binding.LibraryVersion | None) -> bool:
    if found is None:
        return True
    if headers.version and found.llama and headers.version != found.llama:
        return False
    return not (headers.commit and found.commit and not _same_commit(headers.commit, found.commit))


def _headers_arg(value: str, scratch: Path, found: binding.LibraryVersion | None = None) -> Headers:
    """Explicit headers; or ``auto``: the base's own llama.h, else the prepared set matching the library."""
    if value != "auto":
        return resolve_headers(Path(value), scratch)
    base = find_base_headers()
    if base is not None:
        return resolve_headers(base, scratch)
    sets = [resolve_headers(p, scratch) for p in _prepared_sets()]
    if not sets:
        raise AbiError(
            "no llama.h: the base image ships none and the build context has no docker/llama-headers "
            "(prepare it with: make image-context LLAMA_SOURCE=<llama.cpp tree or release tarball>)"
        )
    matching = [h for h in sets if _matches(h, found)]
    exact = [h for h in matching if h.commit] or matching
    if len(exact) == 1:
        return exact[0]
    have = "; ".join(f"{h.origin} (llama.cpp {h.version}, commit {h.commit})" for h in sets)
    what = found.describe() if found else "no library given"
    reason = "several prepared header sets match" if exact else "no prepared header set matches"
    raise AbiError(f"{reason} the libllama ({what}); prepared: {have}")


def cmd_compare(args: argparse.Namespace, scratch: Path) -> int:
    headers = _headers_arg(args.headers, scratch)
    package = Path(args.binding) if args.binding else _installed_binding_dir()
    module = binding.binding_module(package)
    check(
        headers,
        module,
        f"llama-cpp-python {binding_version(package)}",
        shlex.split(args.cc) if args.cc else None,
    )
    print(
        f"ok: {', '.join(STRUCTS)} match between {headers.llama_h} "
        f"and llama-cpp-python {binding_version(package)}"
    )
    return 0


def cmd_verify(args: argparse.Namespace, scratch: Path) -> int:
    from semif_adapter.engine.llama_backend import REQUIRED_SYMBOLS

    if args.lib_dir:
        os.environ["LLAMA_CPP_LIB_PATH"] = args.lib_dir
    llama_cpp = binding.load(REQUIRED_SYMBOLS)
    raw = llama_cpp.llama_cpp
    found = binding.library_version(raw._lib)
    where = binding.loaded_path()
    headers = _headers_arg(args.headers, scratch, found)
    if headers.version and found.llama and headers.version != found.llama:
        raise AbiError(
            f"headers {headers.origin} are llama.cpp {headers.version} "
            f"but libllama at {where} reports {found.describe()}"
        )
    if headers.commit and found.commit and not _same_commit(headers.commit, found.commit):
        raise AbiError(
            f"headers {headers.origin} are commit {headers.commit} "
            f"but libllama at {where} reports {found.describe()}"
        )
    version = llama_cpp.__version__
    layouts = check(headers, raw, f"llama-cpp-python {version}", shlex.split(args.cc) if args.cc else None)
    want_version, want_commit = args.expect_version, args.expect_commit or ""
    if want_version is not None and (
        want_version != found.llama or not _same_commit(want_commit, found.commit or "")
    ):
        told = (
            f"the build expects LLAMA_CPP_VERSION={want_version!r} LLAMA_CPP_COMMIT={want_commit!r}"
            if want_version
            else "the build was not told which llama.cpp to expect"
        )
        raise AbiError(
            f"libllama at {where} reports {found.describe()}; {told}; pass "
            f"--build-arg LLAMA_CPP_VERSION={found.llama} --build-arg LLAMA_CPP_COMMIT={found.commit}"
        )
    record = {
        "library": asdict(found),
        "library_path": where,
        "binding": version,
        "headers": headers.origin,
        "structs": {k: asdict(v) for k, v in layouts.items()},
        "unbound_wrappers": binding.unbound_wrappers(),
    }
    if args.record:
        Path(args.record).parent.mkdir(parents=True, exist_ok=True)
        Path(args.record).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    sizes = ", ".join(f"{k} {v.size} B" for k, v in layouts.items())
    print(f"ok: {found.describe()} at {where} with llama-cpp-python {version}: {sizes}; "
          f"{len(record['unbound_wrappers'])} wrapper(s) unbound (never called by the engine)")  # fmt: skip
    return 0


def _same_commit(a: str, b: str) -> bool:
    """Short and long hashes of one commit match (a "-dirty" build too); an empty side matches anything."""
    a, b = (x.strip().lower().removesuffix("-dirty") for x in (a, b))
    return not a or not b or a.startswith(b) or b.startswith(a)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="header vs binding, no library")
    cmp_.add_argument("--headers", required=True, help="llama.cpp tree, tarball, include dir, or auto")
    cmp_.add_argument("--binding", help="an unpacked llama_cpp package dir (default: the installed one)")
    cmp_.add_argument("--cc", help="C compiler command (default: $CC, cc, gcc, clang, zig)")
    ver = sub.add_parser("verify", help="load libllama, prove the layout, record the verified pair")
    ver.add_argument("--lib-dir", help="directory holding libllama.so (default: $LLAMA_CPP_LIB_PATH)")
    ver.add_argument("--headers", default="auto")
    ver.add_argument("--expect-version", help="llama_version() the library must report")
    ver.add_argument("--expect-commit", help="ggml_commit() the library must report (prefix match)")
    ver.add_argument("--record", help="write the verified pair to this JSON file")
    ver.add_argument("--cc")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llama-headers-") as scratch:
        try:
            return {"compare": cmd_compare, "verify": cmd_verify}[args.command](args, Path(scratch))
        except (AbiError, binding.BindingError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    raise SystemExit(main())
