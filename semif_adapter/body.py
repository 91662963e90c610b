"""Reading request bodies: bounded in size and time, decoded from gzip/zstd.

The whole body is read before the engine is asked for, so a slow upload never holds the model.
Decompression is capped at ``max_body_bytes`` of output, so a small compressed bomb is refused.
"""

from __future__ import annotations

import asyncio
import zlib

import zstandard
from starlette.requests import ClientDisconnect, Request

from .errors import SemifError
from .settings import Settings


class BodyTooLarge(SemifError):
    code = "payload_too_large"
    status = 413


class BodyTimeout(SemifError):
    code = "request_timeout"
    status = 408


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


def _gunzip(data: bytes, limit: int) -> bytes:
    """Every member of a (possibly multi-member) gzip body; a cut-off member is an error, not less data."""
    out: list[bytes] = []
    size = 0
    while True:
        decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            chunk = decoder.decompress(data, limit - size + 1)
        except zlib.error as exc:
            raise MalformedBody(f"body is not valid gzip: {exc}") from exc
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"decompressed body exceeds the {limit}-byte limit")
        if not decoder.eof:
            raise MalformedBody("gzip body is truncated")
        out.append(chunk)
        data = decoder.unused_data
        if not data:
            return b"".join(out)


def _unzstd(data: bytes, limit: int) -> bytes:
    """Every frame of a zstd body, bounded by ``limit``; a cut-off frame is an error, not less data.

    zstandard's bounded reader neither says whether the last frame was complete nor, by default,
    reads past the first frame; so it only bounds the output, and a frame-by-frame pass (now known
    to stay within the limit) checks that each frame ends.
    """
    try:
        bounded = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read(limit + 1)
        if len(bounded) > limit:
            raise BodyTooLarge(f"decompressed body exceeds the {limit}-byte limit")
        out: list[bytes] = []
        while data:
            decoder = zstandard.ZstdDecompressor().decompressobj()
            out.append(decoder.decompress(data))
            if not decoder.eof:
                raise MalformedBody("zstd body is truncated")
            data = decoder.unused_data
    except zstandard.ZstdError as exc:
        raise MalformedBody(f"body is not valid zstd: {exc}") from exc
    return b"".join(out)


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
    return decode_content(raw, request.headers.get("content-encoding"), limit)
