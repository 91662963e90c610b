"""Reading request bodies: bounded in size and time, decoded from gzip/zstd.

The whole body is read before the engine is asked for, so a slow upload never holds the model.
Decompression is capped at ``max_body_bytes`` of output, so a small compressed bomb is refused.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Callable
from typing import Protocol, TypeVar

import zstandard
from starlette.requests import ClientDisconnect, Request

from semif_adapter.errors import SemifError
from semif_adapter.settings import Settings


class BodyTooLarge(SemifError):
    code = "payload_too_large"
    status = 413


class BodyTimeout(SemifError):
    code = "request_timeout"
    status = 408
    close_connection = True  # the rest of a trickled body must not be read as a next request


class UnsupportedEncoding(SemifError):
    code = "unsupported_content_encoding"
    status = 415


class MalformedBody(SemifError):
    code = "invalid_request"
    status = 400


async def _read_raw(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {int(declared)} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


MAX_PARTS = 1024  # gzip members / zstd frames per body; senders concatenate a few, not thousands
_WINDOW = 64 * 1024  # compressed bytes fed per call: bounds what each part's leftover input copies


class _Decoder(Protocol):
    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...


D = TypeVar("D", bound=_Decoder)


def _each_part(
    data: bytes,
    limit: int,
    name: str,
    new_decoder: Callable[[], D],
    decompress: Callable[[D, memoryview, int], bytes],
) -> bytes:
    """Decode every part (member or frame) in turn; a cut-off part is an error, never a shorter body.

    Input goes in windows so that a body of many tiny parts costs linear, not quadratic, copying;
    ``decompress`` gets the output budget left (``limit - produced + 1``) and may stop there.
    """
    view = memoryview(data)
    out: list[bytes] = []
    size = pos = parts = 0
    while parts == 0 or pos < len(data):
        parts += 1
        if parts > MAX_PARTS:
            raise MalformedBody(f"{name} body has more than {MAX_PARTS} members/frames")
        decoder = new_decoder()
        while not decoder.eof:
            if pos >= len(data):
                raise MalformedBody(f"{name} body is truncated")
            window = view[pos : pos + _WINDOW]
            piece = decompress(decoder, window, limit - size + 1)
            size += len(piece)
            if size > limit:
                raise BodyTooLarge(f"decompressed body exceeds the {limit}-byte limit")
            out.append(piece)
            pos += len(window) - (len(decoder.unused_data) if decoder.eof else 0)
    return b"".join(out)


def _gunzip(data: bytes, limit: int) -> bytes:
    try:
        return _each_part(
            data,
            limit,
            "gzip",
            lambda: zlib.decompressobj(wbits=16 + zlib.MAX_WBITS),
            lambda decoder, window, budget: decoder.decompress(window, budget),
        )
    except zlib.error as exc:
        raise MalformedBody(f"body is not valid gzip: {exc}") from exc


def _unzstd(data: bytes, limit: int) -> bytes:
    """zstd's frame decoder has no output cap, so a bounded read across all frames comes first (bombs)."""
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        produced = 0
        while chunk := reader.read(limit + 1 - produced):
            produced += len(chunk)
            if produced > limit:
                raise BodyTooLarge(f"decompressed body exceeds the {limit}-byte limit")
        return _each_part(
            data,
            limit,
            "zstd",
            lambda: zstandard.ZstdDecompressor().decompressobj(),
            lambda decoder, window, _: decoder.decompress(window),
        )
    except zstandard.ZstdError as exc:
        raise MalformedBody(f"body is not valid zstd: {exc}") from exc


def decode_content(data: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (identity, gzip, zstd); anything else is a 415."""
    for name in [e.strip().lower() for e in (encoding or "").split(",") if e.strip()][::-1]:
        if name == "identity":
            continue
        if name in ("gzip", "x-gzip"):
            data = _gunzip(data, limit)
        elif name == "zstd":
            data = _unzstd(data, limit)
        else:
            raise UnsupportedEncoding(
                f"Content-Encoding {name!r} is not supported (use gzip, zstd or identity)"
            )
    return data


async def read_body(request: Request, settings: Settings) -> bytes:
    """The decoded request body, or a 4xx ``SemifError`` (413 too large, 408 too slow, 415, 400)."""
    limit = settings.max_body_bytes
    try:
        raw = await asyncio.wait_for(_read_raw(request, limit), timeout=settings.body_timeout_s)
    except asyncio.TimeoutError as exc:  # not the builtin before Python 3.11
        raise BodyTimeout(f"request body not received within {settings.body_timeout_s:g} s") from exc
    except ClientDisconnect as exc:
        raise MalformedBody("client disconnected while sending the body") from exc
    encoding = request.headers.get("content-encoding")
    if not encoding or encoding.strip().lower() == "identity":
        return raw
    # decompressing up to 6 MB takes tens of milliseconds: on a worker thread, so /ping never waits for it
    return await asyncio.to_thread(decode_content, raw, encoding, limit)


# Bodies above this size are parsed and validated on a worker thread, so /ping never waits behind them.
OFF_LOOP_BYTES = 64 * 1024
_PARSERS = threading.BoundedSemaphore(2)  # at most two large bodies parsed at once: CPU and memory bounded
T = TypeVar("T")


async def off_loop(size: int, parse: Callable[[], T]) -> T:
    """Run ``parse`` inline for small bodies, else on a worker thread (at most two at a time)."""
    if size <= OFF_LOOP_BYTES:
        return parse()

    def bounded() -> T:
        with _PARSERS:
            return parse()

    return await asyncio.to_thread(bounded)
