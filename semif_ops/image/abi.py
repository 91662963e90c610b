"""Prove that llama-cpp-python's ctypes structs have the C layout of a given llama.h.

A small C program is generated from the header's own field lists, compiled against that header with the
C compiler at hand, and prints the size, every field offset and every field size of the structs the engine
passes or receives by value (``STRUCTS``). Those numbers are compared with the binding's ctypes layout; a
mismatch names the struct, the field and both offsets. A symbol check alone cannot see a field inserted in
the middle of a struct (``lazy_mode`` in ``llama_model_params``), and a struct passed by value with the wrong
shape gives garbage or a crash, so the image build runs this before it records anything.

    # compare a header with a binding, no library needed (unit tests, a quick look at a release):
    semif-ops image abi compare --headers vendor/llama.cpp --binding path/to/llama_cpp
    # image build: load the base's libllama, prove the layout, record the verified pair:
    semif-ops image abi verify --lib-dir /opt/semif/llama-lib --headers auto \
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

from semif_adapter.engine import abi, binding

# Structs crossing the C boundary by value in calls the engine makes: llama_model_load_from_file,
# llama_init_from_model, llama_*_default_params (returned), llama_batch_init (returned), llama_decode.
STRUCTS = ("llama_model_params", "llama_context_params", "llama_batch")
PREPARED_HEADERS = Path(__file__).resolve().parents[2] / "docker" / "llama-headers"
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
    """VERSION.json (written by semif-ops image context), else a bare COMMIT file beside the sources."""
    meta = directory / "VERSION.json"
    if meta.is_file():
        data = json.loads(meta.read_text(encoding="utf-8"))
        return data.get("version"), data.get("commit")
    commit = directory / "COMMIT"
    return None, (commit.read_text(encoding="utf-8").strip() or None) if commit.is_file() else None


def resolve_headers(source: Path, scratch: Path) -> Headers:
    """Headers from a source tree, a tarball or a flat include directory."""
    source = origin = Path(source)
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
    vendored = source / "vendor" / "llama.cpp"
    if (vendored / "include" / "llama.h").is_file():  # an easy mistake: the binding's sdist, not llama.cpp
        where = vendored if origin.is_dir() else f"<unpacked {origin.name}>/{vendored.relative_to(source)}"
        raise AbiError(
            f"llama.cpp headers: {origin} is a llama-cpp-python sdist, which vendors llama.cpp one folder "
            f"down; pass {where} instead (or a llama.cpp release .tar.gz)"
        )
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


def header_declarations(text: str, struct: str) -> list[tuple[str, str]]:
    """``(field name, declared C type)`` of ``struct <name> { ... }`` in declaration order."""
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
    fields: list[tuple[str, str]] = []
    for decl in (" ".join(d.split()) for d in body.split(";")):
        if not decl:
            continue
        pointer_to_function = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
        if pointer_to_function:
            fields.append((pointer_to_function[1], "function pointer"))
            continue
        first, *more = decl.split(",")
        name = re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "", first))[-1]
        prefix = first[: first.rindex(name)]
        base = " ".join(w for w in prefix.replace("*", " ").split() if w not in {"const", "volatile"})
        fields.append((name, _spell(base, prefix.count("*"))))
        for declarator in more:
            other = re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "", declarator))[-1]
            fields.append((other, _spell(base, declarator.count("*"))))
    return fields


def _spell(base: str, stars: int) -> str:
    return f"{base} {'*' * stars}" if stars else base


def header_fields(text: str, struct: str) -> list[str]:
    """Field names of ``struct <name> { ... }`` in declaration order, read from the header text."""
    return [name for name, _ in header_declarations(text, struct)]


# Kind of a scalar C expression: signedness/float/bool by _Generic, width by sizeof (done in Python).
_KIND_MACRO = """#define SEMIF_KIND(x) _Generic((x), _Bool: "bool", char: "char", signed char: "i", \\
    unsigned char: "u", short: "i", unsigned short: "u", int: "i", unsigned int: "u", long: "i", \\
    unsigned long: "u", long long: "i", unsigned long long: "u", float: "f", double: "f", default: "?")"""


def probe_source(fields: dict[str, list[tuple[str, str]]]) -> str:
    """A C program printing, per field: offset, size, alignment, and the C kind of the field (or, for the
    engine's pointer fields, of what they point to). Only those are dereferenced: others may point to
    incomplete types."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "llama.h"', _KIND_MACRO, "",
             "int main(void) {"]  # fmt: skip
    for struct, decls in fields.items():
        lines.append(
            f'    printf("{struct} . %zu %zu\\n", sizeof(struct {struct}), __alignof__(struct {struct}));'
        )
        wanted = abi.ENGINE_FIELDS.get(struct, {})
        for name, decl in decls:
            member = f"((struct {struct} *)0)->{name}"
            stars = decl.count("*") if name in wanted and wanted[name].startswith("*") else 0
            if decl.split()[0:1] == ["void"]:
                stars = 0
            target = "*" * stars + member if stars else member
            lines.append(
                f'    printf("{struct} {name} %zu %zu %zu {"*" * stars}%s %zu\\n", offsetof(struct {struct}, '
                f"{name}), sizeof({member}), __alignof__({member}), SEMIF_KIND({target}), sizeof({target}));"
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


def _kind(stars: str, category: str, width: int) -> str:
    if category == "?" or (stars == "" and category == "char"):
        base = "?" if category == "?" else "i8"
    elif category == "bool":
        base = "bool"
    elif category == "char":
        base = "i8"
    else:
        base = f"{category}{8 * width}"
    return stars + base if base != "?" or not stars else stars + "?"


def c_layout(
    headers: Headers, structs: Sequence[str] = STRUCTS, cc: Sequence[str] | None = None
) -> dict[str, abi.Layout]:
    """Compile and run the probe against ``headers``; the layouts the C compiler gives."""
    text = headers.llama_h.read_text(encoding="utf-8", errors="replace")
    fields = {s: header_declarations(text, s) for s in structs}
    command = list(cc or compiler())
    with tempfile.TemporaryDirectory(prefix="llama-abi-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(probe_source(fields), encoding="utf-8")
        includes = [f"-I{d}" for d in headers.include_dirs]
        env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": os.environ.get("ZIG_GLOBAL_CACHE_DIR", f"{tmp}/zig")}
        built = subprocess.run(
            [*command, "-std=gnu11", "-O0", *includes, str(src), "-o", str(exe)],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if built.returncode != 0:
            first = next((ln for ln in built.stderr.splitlines() if "error" in ln), built.stderr.strip())
            raise AbiError(f"the layout probe does not compile against {headers.llama_h}: {first}")
        ran = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    sizes: dict[str, tuple[int, int]] = {}
    measured: dict[str, list[abi.Field]] = {s: [] for s in structs}
    for line in ran.stdout.splitlines():
        struct, field, *rest = line.split()
        if field == ".":
            sizes[struct] = (int(rest[0]), int(rest[1]))
            continue
        offset, size, align, kind, width = rest
        stars = kind[: len(kind) - len(kind.lstrip("*"))]
        decl = dict(fields[struct])[field]
        if not stars and "*" in decl:
            resolved = "*?"  # a pointer the engine does not follow
        elif decl == "function pointer":
            resolved = "?"
        else:
            resolved = _kind(stars, kind.lstrip("*"), int(width))
        measured[struct].append(abi.Field(field, int(offset), int(size), int(align), resolved, decl))
    return {s: abi.Layout(s, *sizes[s], tuple(measured[s])) for s in structs}


# --- comparison --------------------------------------------------------------------------------------------


def compare(c: dict[str, abi.Layout], module: object, binding_name: str, header_name: str) -> list[str]:
    """One line per difference between the C layouts and the binding's ctypes structs; per struct the size
    and the fields only one side has come first (the cause), then the fields that moved (the effect)."""
    py = abi.binding_layouts(module)
    problems: list[str] = []
    for struct, cl in c.items():
        pl = py[struct]
        c_fields = {f.name: f for f in cl.fields}
        p_fields = {f.name: f for f in pl.fields}
        cause: list[str] = []
        effect: list[str] = []
        if pl.size != cl.size:
            cause.append(f"{struct}: size {cl.size} bytes in {header_name} but {pl.size} in {binding_name}")
        for name, cf in c_fields.items():
            pf = p_fields.get(name)
            if pf is None:
                cause.append(
                    f"{struct}: field '{name}' at offset {cf.offset} in {header_name} "
                    f"is missing from {binding_name}"
                )
            elif pf.offset != cf.offset:
                effect.append(
                    f"{struct}: field '{name}' at offset {cf.offset} in {header_name} but {pf.offset} "
                    f"in {binding_name}"
                )
            elif pf.size != cf.size:
                cause.append(
                    f"{struct}: field '{name}' is {cf.size} bytes in {header_name} but "
                    f"{pf.size} in {binding_name}"
                )
        for name, pf in p_fields.items():
            if name not in c_fields:
                cause.append(
                    f"{struct}: field '{name}' at offset {pf.offset} in {binding_name} "
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


def check(headers: Headers, cc: Sequence[str] | None = None) -> dict[str, abi.Layout]:
    """The C layouts, or AbiError naming each field the engine sets that this llama.h lacks or retyped."""
    layouts = c_layout(headers, cc=cc)
    problems = abi.engine_field_problems(layouts)
    if problems:
        version = f", llama.cpp {headers.version}" if headers.version else ""
        raise AbiError(
            f"llama.h ({headers.origin}{version}) cannot be used by the engine: " + "; ".join(problems)
        )
    return layouts


def differences(layouts: dict[str, abi.Layout], module: object) -> str:
    """How the probed layouts differ from the binding's: sizes and fields only one side has (informational:
    the engine adapts)."""
    theirs = abi.binding_layouts(module)
    lines: list[str] = []
    for name, mine in layouts.items():
        other = theirs[name]
        if mine.size != other.size:
            lines.append(f"{name} is {mine.size} bytes (binding: {other.size})")
        mine_names, other_names = {f.name for f in mine.fields}, {f.name for f in other.fields}
        lines += [f"{name}.{f} absent" for f in sorted(other_names - mine_names)]
        lines += [f"{name}.{f} added" for f in sorted(mine_names - other_names)]
    return ", ".join(lines)


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
    return not (headers.commit and found.commit and not binding.same_commit(headers.commit, found.commit))


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
    """Header vs binding, field by field: how far the binding's hand-written structs are from this llama.h."""
    headers = _headers_arg(args.headers, scratch)
    package = Path(args.binding) if args.binding else _installed_binding_dir()
    module = binding.binding_module(package)
    label = f"llama-cpp-python {binding_version(package)}"
    layouts = c_layout(headers, cc=shlex.split(args.cc) if args.cc else None)
    problems = compare(layouts, module, "binding", "llama.h")
    if problems:
        version = f", llama.cpp {headers.version}" if headers.version else ""
        raise AbiError(
            f"struct layout mismatch between llama.h ({headers.origin}{version}) and {label}: "
            + "; ".join(problems)
        )
    print(f"ok: {', '.join(STRUCTS)} match between {headers.llama_h} and {label}")
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
    if headers.commit and found.commit and not binding.same_commit(headers.commit, found.commit):
        raise AbiError(
            f"headers {headers.origin} are commit {headers.commit} "
            f"but libllama at {where} reports {found.describe()}"
        )
    version = llama_cpp.__version__
    layouts = check(headers, shlex.split(args.cc) if args.cc else None)
    want_version, want_commit = args.expect_version, args.expect_commit or ""
    if want_version is not None and (
        want_version != found.llama or not binding.same_commit(want_commit, found.commit or "")
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
        "structs": {k: v.to_json() for k, v in layouts.items()},
        "unbound_wrappers": binding.unbound_wrappers(),
    }
    if args.record:
        Path(args.record).parent.mkdir(parents=True, exist_ok=True)
        Path(args.record).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    sizes = ", ".join(f"{k} {v.size} B" for k, v in layouts.items())
    print(f"ok: {found.describe()} at {where} with llama-cpp-python {version}: {sizes}; "
          f"{len(record['unbound_wrappers'])} wrapper(s) unbound (never called by the engine)")  # fmt: skip
    if drift := differences(layouts, raw):
        print(f"note: the binding's own structs differ ({drift}); the engine uses the probed layout")
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
