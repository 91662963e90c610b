"""llama.cpp's by-value structs, laid out as the loaded library has them rather than as the binding guessed.

Three structs cross the C boundary by value in the calls the engine makes: ``llama_model_params`` and
``llama_context_params`` (returned by the ``*_default_params`` functions, passed to the model and context
constructors) and ``llama_batch`` (returned by ``llama_batch_init``, passed to ``llama_decode``). A field
added in the middle of one (``lazy_mode`` in ``llama_model_params``) moves every later field, and a struct
of the wrong size passed by value corrupts the call. llama-cpp-python's hand-written ctypes classes match
exactly one llama.cpp; the DLC ships others.

So the engine builds its own ctypes classes from a :class:`Layout` — every field's offset, size and
alignment, as a C compiler measured them against the library's own ``llama.h`` (``semif-ops image abi``) —
and calls those seven functions through prototypes of its own. Only the fields the engine reads or writes
(:data:`ENGINE_FIELDS`) get typed ctypes members; every other field is carried as opaque bytes of the right
size and alignment, so the library's defaults pass through untouched whatever they mean. A layout is usable
when each engine field exists with the C type the engine expects; otherwise :class:`LayoutError` names it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from semif_adapter.errors import ModelLoadError

BY_VALUE_STRUCTS = ("llama_model_params", "llama_context_params", "llama_batch")

# The fields the engine touches, with the C type it relies on: i32/u32 = (u)int32_t, bool, and pointer
# kinds ("*i32" = int32_t *, "**i32" = int32_t **). Changing the engine's use of a field means changing this.
ENGINE_FIELDS: dict[str, dict[str, str]] = {
    "llama_model_params": {"n_gpu_layers": "i32", "use_extra_bufts": "bool"},
    "llama_context_params": {
        "n_ctx": "u32",
        "n_batch": "u32",
        "n_ubatch": "u32",
        "n_seq_max": "u32",
        "n_threads": "i32",
        "n_threads_batch": "i32",
        "embeddings": "bool",
        "no_perf": "bool",
        "kv_unified": "bool",
        "swa_full": "bool",
        "flash_attn_type": "i32",
    },
    "llama_batch": {
        "n_tokens": "i32",
        "token": "*i32",
        "pos": "*i32",
        "n_seq_id": "*i32",
        "seq_id": "**i32",
        "logits": "*i8",
    },
}

_SCALARS: dict[str, Any] = {
    "i8": ctypes.c_int8,
    "u8": ctypes.c_uint8,
    "i16": ctypes.c_int16,
    "u16": ctypes.c_uint16,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "bool": ctypes.c_bool,
}
_OPAQUE_UNITS = {8: ctypes.c_uint64, 4: ctypes.c_uint32, 2: ctypes.c_uint16, 1: ctypes.c_uint8}


class LayoutError(ModelLoadError):
    """A layout the engine cannot use; the message is one line naming the struct and field."""


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int
    align: int
    kind: str  # "i32", "u32", "bool", "*i32", ... or "?" when it is none of the kinds the engine uses
    decl: str = ""  # the declared C type as the header spells it, for messages


@dataclass(frozen=True)
class Layout:
    name: str
    size: int
    align: int
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "align": self.align, "fields": [asdict(f) for f in self.fields]}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> Layout:
        fields = tuple(Field(**f) for f in data["fields"])
        return cls(name, int(data["size"]), int(data["align"]), fields)


# --- layouts from the binding's own ctypes classes (the library the binding was generated for) -----------


def ctypes_kind(ctype: Any) -> str:
    """The kind of a ctypes type, in the same vocabulary as the C probe's."""
    if isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer):
        inner = ctypes_kind(ctype._type_)
        return "*" + inner if inner != "?" else "?"
    code = getattr(ctype, "_type_", None)
    if not isinstance(code, str):
        return "?"
    if code == "?":
        return "bool"
    if code in "fd":
        return f"f{8 * ctypes.sizeof(ctype)}"
    if code in "bhilq":
        return f"i{8 * ctypes.sizeof(ctype)}"
    if code in "BHILQ":
        return f"u{8 * ctypes.sizeof(ctype)}"
    return "?"


def layout_of_ctypes(cls: Any) -> Layout:
    fields = tuple(
        Field(
            name,
            getattr(cls, name).offset,
            ctypes.sizeof(ctype),
            ctypes.alignment(ctype),
            ctypes_kind(ctype),
            getattr(ctype, "__name__", ""),
        )
        for name, ctype, *_ in cls._fields_
    )
    return Layout(cls.__name__, ctypes.sizeof(cls), ctypes.alignment(cls), fields)


def binding_layouts(module: Any) -> dict[str, Layout]:
    """The layouts llama-cpp-python's ``llama_cpp.llama_cpp`` module declares."""
    return {name: layout_of_ctypes(getattr(module, name)) for name in BY_VALUE_STRUCTS}


# --- what the engine needs of a layout --------------------------------------------------------------------


def engine_field_problems(layouts: Mapping[str, Layout]) -> list[str]:
    """One line per engine field that is missing or has another C type; empty when the layouts are usable."""
    problems: list[str] = []
    for struct, wanted in ENGINE_FIELDS.items():
        layout = layouts.get(struct)
        if layout is None:
            problems.append(f"{struct}: not measured")
            continue
        for name, kind in wanted.items():
            found = layout.field(name)
            if found is None:
                problems.append(f"{struct}.{name}: the engine sets this field; this llama.h lacks it")
            elif found.kind != kind:
                spelled = f" ({found.decl})" if found.decl else ""
                problems.append(
                    f"{struct}.{name}: the engine needs C type {_c_name(kind)}, this llama.h declares "
                    f"{_c_name(found.kind)}{spelled}"
                )
        if layout.size <= 16:
            problems.append(f"{struct}: {layout.size} bytes; the engine passes only structs over 16 bytes")
    return problems


def _c_name(kind: str) -> str:
    stars = len(kind) - len(kind.lstrip("*"))
    base = kind.lstrip("*")
    names = {"bool": "bool", "f32": "float", "f64": "double", "?": "another type"}
    text = names.get(base) or (f"int{base[1:]}_t" if base.startswith("i") else f"uint{base[1:]}_t")
    return text + " " + "*" * stars if stars else text


def require_engine_fields(layouts: Mapping[str, Layout], origin: str) -> None:
    problems = engine_field_problems(layouts)
    if problems:
        raise LayoutError(f"{origin}: " + "; ".join(problems))


# --- ctypes classes and prototypes from a layout ----------------------------------------------------------


def _ctype_for(kind: str) -> Any:
    if kind.startswith("*"):
        return ctypes.POINTER(_ctype_for(kind[1:]))
    return _SCALARS[kind]


def _opaque(name: str, size: int, align: int) -> list[tuple[str, Any]]:
    """Scalar members covering ``size`` bytes at ``align``. Scalars, not arrays: libffi is given a plain
    description of the struct, and ctypes has a history of misdescribing arrays inside by-value structs."""
    unit = _OPAQUE_UNITS.get(align, ctypes.c_uint8)
    if size % ctypes.sizeof(unit):
        unit = ctypes.c_uint8
    count = size // ctypes.sizeof(unit)
    return [(name if count == 1 else f"{name}__{k}", unit) for k in range(count)]


def struct_class(layout: Layout) -> type[ctypes.Structure]:
    """A ctypes class with the layout's exact size, alignment and engine-field offsets."""
    used = ENGINE_FIELDS.get(layout.name, {})
    members: list[tuple[str, Any]] = []
    position = 0
    for index, field in enumerate(sorted(layout.fields, key=lambda f: f.offset)):
        if field.offset < position:
            raise LayoutError(f"{layout.name}.{field.name}: overlaps the field before it ({field.offset})")
        if field.offset > position:
            members += _opaque(f"_gap{index}", field.offset - position, 1)
        if field.name in used:
            members.append((field.name, _ctype_for(used[field.name])))
        else:
            members += _opaque(field.name, field.size, field.align)
        position = field.offset + field.size
    if layout.size > position:
        members += _opaque("_tail", layout.size - position, 1)
    cls = type(layout.name, (ctypes.Structure,), {"_fields_": members})
    measured = (ctypes.sizeof(cls), ctypes.alignment(cls))
    if measured != (layout.size, layout.align):
        raise LayoutError(
            f"{layout.name}: ctypes gives {measured[0]} bytes aligned to {measured[1]}, the header "
            f"{layout.size} aligned to {layout.align}"
        )
    for name in used:
        offset = getattr(cls, name).offset
        expected = layout.field(name)
        if expected is None or offset != expected.offset:
            raise LayoutError(f"{layout.name}.{name}: ctypes placed it at {offset}")
    return cls


class ByValueCalls:
    """The seven calls that take or return a by-value struct, bound to the library with ``layouts``."""

    def __init__(self, lib: Any, layouts: Mapping[str, Layout]) -> None:
        require_engine_fields(layouts, "llama.cpp struct layout")
        self.layouts = dict(layouts)
        self.ModelParams = struct_class(layouts["llama_model_params"])
        self.ContextParams = struct_class(layouts["llama_context_params"])
        self.Batch = struct_class(layouts["llama_batch"])
        p, i32 = ctypes.c_void_p, ctypes.c_int32

        def bind(name: str, restype: Any, *argtypes: Any) -> Any:
            # A fresh foreign function: setting types on lib.<name> would change the binding's own wrapper.
            return ctypes.CFUNCTYPE(restype, *argtypes)((name, lib))

        self.model_default_params = bind("llama_model_default_params", self.ModelParams)
        self.context_default_params = bind("llama_context_default_params", self.ContextParams)
        self.model_load_from_file = bind("llama_model_load_from_file", p, ctypes.c_char_p, self.ModelParams)
        self.init_from_model = bind("llama_init_from_model", p, p, self.ContextParams)
        self.batch_init = bind("llama_batch_init", self.Batch, i32, i32, i32)
        self.batch_free = bind("llama_batch_free", None, self.Batch)
        self.decode = bind("llama_decode", i32, p, self.Batch)
