"""Hostile input shared by the in-process suite (tests/http) and the live-server suite (tests/contract).

Each case is something a careless or hostile caller can send. The promise checked everywhere: a 4xx
in the path's own error shape (or, for broken HTTP framing, a 4xx or a closed connection from the HTTP
layer itself), never a 5xx or a hang, and the server answers a fixed decision the same way afterwards.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
import zlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import zstandard
from hypothesis import strategies as st

DECISION = {
    "id": "fixed",
    "state": "A customer was charged twice for the same seat this month.",
    "question": "Which queue should own this ticket?",
    "options": [{"id": "billing", "description": "charges and refunds"}, {"id": "technical"}],
}
MAX_BODY = 6 * 1024 * 1024  # the default SEMIF_MAX_BODY_BYTES

# JSON text fragments that break one reader limit each; used as a decision's ``state`` and elsewhere.
POISONS: dict[str, bytes] = {
    "nesting 100k": b"[" * 100_000 + b"]" * 100_000,
    "nesting over the limit": b"[" * 300 + b"]" * 300,  # deeper than any SEMIF_MAX_JSON_DEPTH
    "nesting in objects": b'{"a":' * 300 + b"1" + b"}" * 300,
    "5000-digit integer": b"1" * 5000,
    "integer over 64 bits": b"18446744073709551616",
    "negative integer under 64 bits": b"-9223372036854775809",
    "float overflow": b"1e400",
    "NaN": b"NaN",
    "Infinity": b"[1, Infinity]",
    "-Infinity": b'{"x": -Infinity}',
    "duplicate key": b'{"a": 1, "b": 2, "a": 3}',
    "duplicate key nested": b'[{"k": [{"x": 1, "x": 1}]}]',
    "lone high surrogate": b'"text \\ud800 more"',
    "lone low surrogate": b'"\\udfff"',
    "lone surrogate in a key": b'{"\\ud83d": 1}',
    "surrogate as UTF-8 bytes": b'"\xed\xa0\x80"',
    "invalid UTF-8": b'"\xff\xfe"',
    "overlong UTF-8": b'"\xc0\xaf"',
    "truncated UTF-8": b'"\xe2\x82"',
    "raw NUL": b'"a\x00b"',
    "escaped NUL": b'"a\\u0000b"',
    "escaped NUL in a key": b'{"k\\u0000": 1}',
    "broken string": b'"no end',
}


_HOSTILE = b'{"id": "hostile", "state": '
_REST = b', "question": "Is it urgent?", "options": [{"id": "yes"}, {"id": "no"}]}'


def decision_body(state: bytes) -> bytes:
    return b'{"decision": ' + _HOSTILE + state + _REST + b"}"


def jsonlines_body(state: bytes) -> bytes:
    """A good first line, the poison on line 3 (after a blank line)."""
    return json.dumps(DECISION).encode() + b"\n\n" + _HOSTILE + state + _REST + b"\n"


def systemone_body(state: bytes) -> bytes:
    question = b'{"type": "noul", "instructions": "Is this urgent?"}'
    return b'{"model": "jev-latest", "state": ' + state + b', "questions": {"q": ' + question + b"}}"


def _options(count: int) -> list[dict[str, str]]:
    return [{"id": f"option-{i}"} for i in range(count)]


def _dup_id_body() -> bytes:
    text = json.dumps({"decision": DECISION})
    return text.replace('"id": "fixed"', '"id": "first", "id": "second"', 1).encode()


@cache
def whole_bodies() -> dict[str, bytes]:
    """Decision-API bodies hostile as a whole; each must be refused with a 4xx."""
    six_mb_id = {**DECISION, "id": "i" * (MAX_BODY - 1024)}
    many_ids = [{**DECISION, "id": f"decision-{i:07d}"} for i in range(MAX_BODY // 400)]
    return {
        "nesting 100k at the top": POISONS["nesting 100k"],
        "duplicate decision id key": _dup_id_body(),
        "duplicate top-level key": b'{"decision": {}, "decision": ' + json.dumps(DECISION).encode() + b"}",
        "UTF-16 body": json.dumps({"decision": DECISION}).encode("utf-16"),
        "two byte order marks": b"\xef\xbb\xbf\xef\xbb\xbf" + json.dumps({"decision": DECISION}).encode(),
        "empty body": b"",
        "only whitespace": b" \r\n\t ",
        "NUL bytes only": b"\x00" * 1024,
        "256 options": json.dumps({"decision": {**DECISION, "options": _options(256)}}).encode(),
        "20000 options": json.dumps({"decision": {**DECISION, "options": _options(20_000)}}).encode(),
        "6 MB decision id": json.dumps({"decision": six_mb_id}).encode(),
        "6 MB of decision ids": json.dumps({"decisions": many_ids}).encode(),
    }


def systemone_whole_bodies() -> dict[str, bytes]:
    """System One bodies hostile as a whole; each must be a 422 (or 413 when over the body limit)."""
    question = {"type": "noul", "instructions": "Is this urgent?"}
    many = {f"question-{i:07d}": question for i in range(MAX_BODY // 80)}
    return {
        "nesting 100k at the top": POISONS["nesting 100k"],
        "duplicate question id": b'{"model": "jev-latest", "state": "s", "questions": {"q": '
        + json.dumps(question).encode()
        + b', "q": '
        + json.dumps(question).encode()
        + b"}}",
        "256 choice criteria": json.dumps(
            {
                "model": "jev-latest",
                "state": "s",
                "questions": {
                    "q": {
                        "type": "choice",
                        "instructions": "Pick one",
                        "criteria": {f"c{i}": None for i in range(256)},
                    }
                },
            }
        ).encode(),
        "6 MB of question ids": json.dumps({"model": "jev-latest", "state": "s", "questions": many}).encode(),
        "UTF-16 body": json.dumps({"model": "jev-latest", "state": "s", "questions": {}}).encode("utf-16"),
    }


# --- hostile encodings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    body: bytes
    encoding: str
    status: int  # what the decision API must answer
    needle: str = ""  # and what its message must say


@cache
def _bomb_source() -> bytes:
    return b" " * (64 * 1024 * 1024)  # ten times the body limit; compresses to ~64 KB


@cache
def encoded_bodies() -> dict[str, Encoded]:
    valid = json.dumps({"decision": DECISION}).encode()
    big = json.dumps({"decision": {**DECISION, "state": _noise(400_000)}}).encode()
    gzipped = gzip.compress(big)
    zstded = zstandard.ZstdCompressor().compress(big)
    zstd_stream = zstandard.ZstdCompressor().compressobj()
    streamed = zstd_stream.compress(big) + zstd_stream.flush()
    return {
        "gzip bomb": Encoded(_gzip_bomb(), "gzip", 413),
        "zstd bomb": Encoded(zstandard.ZstdCompressor(level=3).compress(_bomb_source()), "zstd", 413),
        "gzip truncated": Encoded(gzipped[: len(gzipped) // 2], "gzip", 400, "truncated"),
        "gzip missing its trailer": Encoded(gzipped[:-8], "gzip", 400, "truncated"),
        "zstd truncated": Encoded(zstded[: len(zstded) // 2], "zstd", 400, "truncated"),
        "zstd streamed frame truncated": Encoded(streamed[: len(streamed) - 3], "zstd", 400, "truncated"),
        "gzip then garbage": Encoded(gzip.compress(valid) + b"garbage", "gzip", 400),
        "plain body labelled gzip": Encoded(valid, "gzip", 400),
        "plain body labelled zstd": Encoded(valid, "zstd", 400),
        "gzip labelled zstd": Encoded(gzip.compress(valid), "zstd", 400),
        "zstd labelled gzip": Encoded(zstandard.ZstdCompressor().compress(valid), "gzip", 400),
        "gzip labelled gzip twice": Encoded(gzip.compress(valid), "gzip, gzip", 400),
        "deflate": Encoded(zlib.compress(valid), "deflate", 415),
        "br": Encoded(valid, "br", 415),
        "unknown coding": Encoded(valid, "x-hostile", 415),
        "gzip of a deep document": Encoded(gzip.compress(POISONS["nesting 100k"]), "gzip", 400),
        "300,000 empty gzip members": Encoded(_many(gzip.compress(b"")), "gzip", 400, "more than 1024"),
        "700,000 empty zstd frames": Encoded(
            _many(zstandard.ZstdCompressor().compress(b"")), "zstd", 400, "more than 1024"
        ),
        "empty body labelled gzip": Encoded(b"", "gzip", 400),
    }


def _many(part: bytes) -> bytes:
    """As many copies of a tiny part as fit the body limit: linear work, refused past 1024 parts."""
    return part * ((MAX_BODY - 1024) // len(part))


def _gzip_bomb() -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(_bomb_source()) + compressor.flush()


def _noise(size: int) -> str:
    """Text that does not compress to nothing, so a cut stream ends mid-frame (deterministic)."""
    words = ["alpha", "billing", "refund", "seat", "charged", "twice", "ticket", "queue", "urgent"]
    out: list[str] = []
    length = 0
    state = 7
    while length < size:
        state = (state * 1103515245 + 12345) % 2**31
        word = words[state % len(words)]
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def multi_part_jsonlines() -> dict[str, tuple[bytes, str]]:
    """Valid bodies in several gzip members / zstd frames: every part must be read (2 lines each)."""
    first = json.dumps(DECISION).encode() + b"\n"
    second = json.dumps({**DECISION, "id": "second"}).encode() + b"\n"
    zstd = zstandard.ZstdCompressor()
    return {
        "gzip members": (gzip.compress(first) + gzip.compress(second), "gzip"),
        "zstd frames": (zstd.compress(first) + zstd.compress(second), "zstd"),
    }


# --- checks -----------------------------------------------------------------------------------------


def _short(status: int, body: Any) -> str:
    return f"{status}: {str(body)[:400]}"  # a body may echo megabytes


def check_every_part_read(client: Any, name: str) -> None:
    """A JSON Lines body split over gzip members / zstd frames answers every line (``client``: httpx or
    Starlette's TestClient, so the same check runs in-process and against a live server)."""
    body, encoding = multi_part_jsonlines()[name]
    headers = {"Content-Type": "application/jsonlines", "Content-Encoding": encoding}
    response = client.post("/invocations", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert [json.loads(row)["id"] for row in response.text.splitlines()] == ["fixed", "second"]


def check_decision_refusal(status: int, body: Any, expected: int | None = None) -> None:
    """A decision-API refusal: a 4xx ``{"error", "type"}``, never a 5xx."""
    assert 400 <= status < 500, _short(status, body)
    if expected is not None:
        assert status == expected, _short(status, body)
    assert isinstance(body, dict) and set(body) >= {"error", "type"}, _short(status, body)
    assert body["error"] and body["type"] != "internal_error", _short(status, body)


def check_systemone_refusal(status: int, body: Any) -> None:
    """A System One refusal: 422 ``detail[]`` naming a ``body`` location, or another 4xx ``detail``."""
    assert 400 <= status < 500, _short(status, body)
    detail = body["detail"]
    if status == 422:
        assert isinstance(detail, list) and detail, _short(status, body)
        located = all(item["loc"][0] == "body" and item["msg"] and item["type"] for item in detail)
        assert located, _short(status, body)
    else:
        assert detail["error_type"] and detail["message"], _short(status, body)


# --- hypothesis: documents with or without one poison ------------------------------------------------

_safe_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12
)
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _safe_text,
).map(lambda value: json.dumps(value).encode())


def _objects(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    entries = st.dictionaries(_safe_text, children, max_size=4)
    return entries.map(
        lambda d: b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in d.items()) + b"}"
    )


def _arrays(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(children, max_size=4).map(lambda items: b"[" + b",".join(items) + b"]")


clean_documents = st.recursive(_leaves, lambda c: _objects(c) | _arrays(c), max_leaves=20)
"""JSON texts (bytes) that break no limit and nest at most a few levels."""

poison_names = st.sampled_from(sorted(name for name in POISONS if name != "broken string"))


@st.composite
def poisoned_documents(draw: st.DrawFn) -> tuple[bytes, str]:
    """A clean document with one poison spliced in as an array element or object value."""
    document = draw(clean_documents)
    name = draw(poison_names)
    poison = POISONS[name]
    wrapper = draw(st.sampled_from(["array", "object", "top"]))
    if wrapper == "top":
        return poison, name
    if wrapper == "array":
        return b"[" + document + b"," + poison + b"]", name
    return b'{"clean": ' + document + b', "poisoned": ' + poison + b"}", name


# --- raw sockets ----------------------------------------------------------------------------------------

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@dataclass
class Exchange:
    """What came back on one connection: whole responses, and whether the server closed it."""

    responses: list[tuple[int, bytes]]
    closed: bool
    raw: bytes


def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    return host, int(port or 80)


def exchange(
    url: str,
    payload: bytes,
    *,
    expect: int = 1,
    shutdown_write: bool = False,
    wait_close_s: float = 0.0,
    timeout: float = 30.0,
) -> Exchange:
    """Send raw bytes, then read until ``expect`` responses arrived or the server closed.

    ``shutdown_write`` half-closes our side after sending (a client that gave up mid-body);
    ``wait_close_s`` then keeps reading that long to see whether the server closes the connection.
    No answer within ``timeout`` is a hang, and fails.
    """
    host, port = host_port(url)
    data = b""
    closed = False
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            # the server refused and closed while we were still sending (seen through podman's port
            # forwarding with a 1 MB header): a closed connection, with whatever it answered first
            data, _ = _receive(sock, data, time.monotonic() + 1)
            return Exchange(parse_responses(data), True, data)
        if shutdown_write:
            sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout
        while not closed and len(parse_responses(data)) < expect:
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer within {timeout} s (a hang); got {data[:300]!r}")
            data, closed = _receive(sock, data, deadline)
        close_deadline = time.monotonic() + wait_close_s
        while not closed and time.monotonic() < close_deadline:
            data, closed = _receive(sock, data, close_deadline)
    return Exchange(parse_responses(data), closed, data)


def _receive(sock: socket.socket, data: bytes, deadline: float) -> tuple[bytes, bool]:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        chunk = sock.recv(65536)
    except ConnectionResetError:
        return data, True
    except TimeoutError:
        return data, False
    return data + chunk, not chunk


def parse_responses(data: bytes) -> list[tuple[int, bytes]]:
    """Complete HTTP/1.1 responses in ``data``: Content-Length framed (the app's) or chunked (h11's 400)."""
    responses: list[tuple[int, bytes]] = []
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            return responses
        head = data[:head_end]
        match = STATUS_LINE.match(head)
        if match is None:
            raise AssertionError(f"not an HTTP response: {data[:200]!r}")
        rest = data[head_end + 4 :]
        if re.search(rb"(?im)^transfer-encoding:\s*chunked\s*$", head):
            parsed = _dechunk(rest)
            if parsed is None:
                return responses
            body, data = parsed
        else:
            length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
            size = int(length.group(1)) if length else 0
            if len(rest) < size:
                return responses
            body, data = rest[:size], rest[size:]
        responses.append((int(match.group(1)), body))


def _dechunk(data: bytes) -> tuple[bytes, bytes] | None:
    """(body, what follows) of a complete chunked body, or None while it is incomplete."""
    body = b""
    while True:
        line_end = data.find(b"\r\n")
        if line_end < 0:
            return None
        size = int(data[:line_end].split(b";")[0], 16)
        chunk_end = line_end + 2 + size
        if len(data) < chunk_end + 2:
            return None
        body += data[line_end + 2 : chunk_end]
        data = data[chunk_end + 2 :]
        if size == 0:
            return body, data


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """One well-formed HTTP/1.1 request as bytes (``Content-Length`` unless headers say otherwise)."""
    fields = {"Host": "localhost", "Content-Type": "application/json"}
    if body or method == "POST":
        fields["Content-Length"] = str(len(body))
    fields.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def framing_cases() -> dict[str, bytes]:
    """Broken or hostile HTTP framing; each request is one the app would refuse anyway (bad JSON)."""
    bad = b'{"decision": "not an object"}'
    head = "POST /invocations HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(bad), bad)
    many = "".join(f"X-Filler-{i}: {i}\r\n" for i in range(5000))
    return {
        "Content-Length and Transfer-Encoding": (
            f"{head}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunked
        ),
        "two different Content-Lengths": (
            f"{head}Content-Length: {len(bad)}\r\nContent-Length: 3\r\n\r\n".encode() + bad
        ),
        "negative Content-Length": f"{head}Content-Length: -5\r\n\r\n".encode() + bad,
        "non-numeric Content-Length": f"{head}Content-Length: 12abc\r\n\r\n".encode() + bad,
        "bad chunk size": (
            f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + b"zz\r\n" + bad + b"\r\n0\r\n\r\n"
        ),
        "unknown Transfer-Encoding": f"{head}Transfer-Encoding: hostile\r\n\r\n".encode() + bad,
        "1 MB header": (
            f"{head}X-Big: {'b' * 1024 * 1024}\r\nContent-Length: {len(bad)}\r\n\r\n".encode() + bad
        ),
        "5000 headers": f"{head}{many}Content-Length: {len(bad)}\r\n\r\n".encode() + bad,
        "garbage request line": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n",
        "header without a colon": f"{head}NoColonHere\r\nContent-Length: {len(bad)}\r\n\r\n".encode() + bad,
        "NUL in a header": f"{head}X-Nul: a\x00b\r\nContent-Length: {len(bad)}\r\n\r\n".encode() + bad,
    }
