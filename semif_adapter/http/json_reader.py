"""The one JSON reader for every request body: strict RFC 8259 JSON within explicit limits.

``json.loads`` as is accepts NaN/Infinity and lone surrogate escapes, lets the last of duplicate keys
win (so a proxy and this server could disagree on what a body says), and raises RecursionError on deep
nesting and ValueError on integers over 4,300 digits — errors that would surface as a 500. orjson
refuses more on its own but still keeps the last duplicate key and silently turns integers above
2**64 into floats, so it would need the same second pass; measured side by side it is not faster on
text-heavy bodies either (``benchmarks/json_reader.py``). So this wraps the standard parser:

* **UTF-8 only**, checked strictly (no UTF-16/32 detection, no encoded surrogates). One leading
  UTF-8 byte order mark is ignored, as RFC 8259 §8.1 allows.
* **Strings** (keys and values) may not hold an unpaired surrogate escape (``"\\ud800"``): such text
  cannot be encoded as UTF-8 for the tokenizer or echoed back. Nor a NUL character (``\\u0000``; a raw
  NUL byte is not JSON at all): it means nothing to a model and C string layers stop at it.
* **Numbers**: no ``NaN``/``Infinity``; integers within 64 bits (−2**63 … 2**64−1), other numbers must
  be finite doubles (``1e400`` is refused, not read as infinity).
* **Objects** may not repeat a key.
* **Nesting**: at most ``max_depth`` levels of arrays/objects, the top level counting as one.

Every violation is a :class:`JsonError` carrying where it is: ``path`` (keys and indices) for values
that parsed, otherwise ``line``/``column``/``pos`` in the text. Each HTTP path renders it in its own
error shape.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

DEFAULT_MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
_INT_DIGITS = len(str(INT_MAX))  # a longer literal is out of range without converting it
_BOM = b"\xef\xbb\xbf"
# Cheap screens on the raw text; only a hit pays for a walk over the parsed strings.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89abcdefABCDEF])")
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
# Strings as whole tokens (so brackets inside them are skipped), and brackets.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_SHOWN_KEY = 40

Path = tuple[str | int, ...]


class JsonError(ValueError):
    """A body that is not JSON this server reads, with where: ``path`` or ``line``/``column``."""

    def __init__(
        self,
        message: str,
        *,
        path: Sequence[str | int] = (),
        line: int | None = None,
        column: int | None = None,
        pos: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path: Path = tuple(_cut(part) if isinstance(part, str) else part for part in path)
        self.line = line
        self.column = column
        self.pos = pos

    @property
    def position(self) -> str:
        """``line L column C`` when the error has a text position, else ``""``."""
        return f"line {self.line} column {self.column}" if self.line is not None else ""

    def __str__(self) -> str:
        where = self.position or ".".join(str(part) for part in self.path)
        return f"{where}: {self.message}" if where else self.message


def _cut(key: str) -> str:
    """Keys in messages are cut short: a caller's key may be megabytes long."""
    return key if len(key) <= _SHOWN_KEY else key[:_SHOWN_KEY] + "…"


def show_key(key: str) -> str:
    return repr(_cut(key))


class _Refused:
    """Stands in for a value the parser hooks refuse, so the walk can report it with its path."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class _DuplicateKeys(dict[str, Any]):
    """An object that repeated ``key``; found (with its path) by the walk."""

    __slots__ = ("key",)
    key: str


class _Hooks:
    """Parser hooks for one document; ``flagged`` tells whether the walk has anything to find."""

    def __init__(self) -> None:
        self.flagged = False

    def refuse(self, message: str) -> _Refused:
        self.flagged = True
        return _Refused(message)

    def pairs(self, items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        self.flagged = True
        seen: set[str] = set()
        marked = _DuplicateKeys(obj)
        for key, _ in items:
            if key in seen:
                marked.key = key
                break
            seen.add(key)
        return marked

    def integer(self, literal: str) -> int | _Refused:
        digits = literal.lstrip("-")
        if len(digits) <= _INT_DIGITS:
            value = int(literal)
            if INT_MIN <= value <= INT_MAX:
                return value
        return self.refuse(f"integer {_shorten(literal)} is outside the 64-bit range (-2**63 to 2**64-1)")

    def number(self, literal: str) -> float | _Refused:
        value = float(literal)
        if math.isinf(value):
            return self.refuse(f"number {_shorten(literal)} is too large for a double")
        return value

    def constant(self, name: str) -> _Refused:
        return self.refuse(f"{name} is not JSON (numbers must be finite)")


def _shorten(literal: str) -> str:
    return literal if len(literal) <= 24 else f"{literal[:12]}…({len(literal)} characters)"


def _decode(data: bytes) -> str:
    """Strict UTF-8; an error's position counts bytes of the body as sent (BOM included)."""
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        pos = skip + exc.start
        prefix = data[:pos]
        line = prefix.count(b"\n") + 1
        column = pos - (prefix.rfind(b"\n") + 1) + 1
        raise JsonError(
            f"not valid UTF-8 (byte {pos}: {exc.reason})", line=line, column=column, pos=pos
        ) from exc


def _too_deep_at(text: str, max_depth: int) -> int:
    """Where nesting first passes ``max_depth`` (after the parser itself gave up on it)."""
    depth = 0
    for match in _TOKEN.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                return match.start()
        elif char in "]}":
            depth -= 1
    return 0


def _at(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _depth_error(max_depth: int, **where: Any) -> JsonError:
    return JsonError(f"JSON nested deeper than {max_depth} levels (SEMIF_MAX_JSON_DEPTH)", **where)


def _walk(root: Any, max_depth: int, check_depth: bool, check_strings: bool) -> None:
    """Raise for a refused value, repeated key, bad character or too-deep container (the first one met)."""
    containers = (dict, list, _DuplicateKeys)
    if type(root) not in containers:
        _check_leaf(root, (), check_strings)
        return
    stack: list[tuple[Any, int, Path]] = [(root, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if check_depth and depth > max_depth:
            raise _depth_error(max_depth, path=path)
        if type(node) is _DuplicateKeys:
            raise JsonError(f"duplicate key {show_key(node.key)} in one object", path=path)
        children: list[tuple[Any, int, Path]] = []
        for key, value in node.items() if type(node) is dict else enumerate(node):
            if check_strings and type(key) is str and _BAD_CHAR.search(key):
                raise JsonError(f"key {show_key(key)}: {_bad_char_message(key)}", path=path)
            if type(value) in containers:
                children.append((value, depth + 1, (*path, key)))
            else:
                _check_leaf(value, (*path, key), check_strings)
        stack.extend(reversed(children))


def _check_leaf(value: Any, path: Path, check_strings: bool) -> None:
    if type(value) is _Refused:
        raise JsonError(value.message, path=path)
    if check_strings and type(value) is str and _BAD_CHAR.search(value):
        raise JsonError(_bad_char_message(value), path=path)


def _bad_char_message(text: str) -> str:
    match = _BAD_CHAR.search(text)
    assert match is not None
    what = "a NUL character" if match.group() == "\x00" else "an unpaired surrogate escape"
    return f"text holds {what} (\\u{ord(match.group()):04x}) at position {match.start()}"


def read_json(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse one JSON document, or raise :class:`JsonError` naming the first limit it breaks."""
    text = _decode(data)
    hooks = _Hooks()
    try:
        value = json.loads(
            text,
            object_pairs_hook=hooks.pairs,
            parse_int=hooks.integer,
            parse_float=hooks.number,
            parse_constant=hooks.constant,
        )
    except json.JSONDecodeError as exc:
        raise JsonError(f"malformed JSON: {exc.msg}", line=exc.lineno, column=exc.colno, pos=exc.pos) from exc
    except RecursionError as exc:
        pos = _too_deep_at(text, max_depth)
        line, column = _at(text, pos)
        raise _depth_error(max_depth, line=line, column=column, pos=pos) from exc
    # Only a text with more brackets than the limit can nest too deep, and only a \u0000 or
    # \ud800-style escape can put a bad character in a string: both are cheap to screen for.
    check_depth = text.count("[") + text.count("{") > max_depth
    check_strings = _SUSPECT_ESCAPE.search(text) is not None
    if check_strings or hooks.flagged or (check_depth and _deeper_than(value, max_depth)):
        _walk(value, max_depth, check_depth, check_strings)  # slower, but finds where
    return value


def _deeper_than(root: Any, max_depth: int) -> bool:
    """Level by level, containers only: four times faster than the walk on 6 MB of small objects."""
    level = [root]
    depth = 1
    while level:
        if depth > max_depth:
            return True
        below: list[Any] = []
        for node in level:
            values = node if type(node) is list else node.values() if type(node) is dict else ()
            below += [v for v in values if type(v) is dict or type(v) is list]
        level = below
        depth += 1
    return False
