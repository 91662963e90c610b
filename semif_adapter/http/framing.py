"""Refuse a request whose HTTP framing is ambiguous, before any route reads it.

uvicorn's HTTP/1.1 parser (h11) accepts a request that carries both ``Transfer-Encoding`` and
``Content-Length``, frames its body by ``Transfer-Encoding`` and keeps the connection open. A proxy in
front that framed it by ``Content-Length`` would then disagree on where the next request starts
(request smuggling). RFC 9112 §6.3 allows rejecting such a request and requires closing the
connection after answering it: this does both. Every other framing error (conflicting lengths,
bad chunk sizes, oversized headers, garbage) h11 itself answers with a plain 400 and a close.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from semif_adapter.errors import SemifError
from semif_adapter.http.rendering import ErrorRenderer

MESSAGE = "a request may not carry both Transfer-Encoding and Content-Length"


class AmbiguousFraming(SemifError):
    """A transport fault, not a field of the body: 400 in either API's shape (never a 422 list)."""

    code = "invalid_request"
    status = 400
    close_connection = True


class AmbiguousFramingGuard:
    """ASGI middleware: 400 (in the path's API error shape) and ``Connection: close`` for TE + CL."""

    def __init__(self, app: ASGIApp, renderer_for: Callable[[str], ErrorRenderer]) -> None:
        self.app = app
        self.renderer_for = renderer_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"transfer-encoding" in names and b"content-length" in names:
                response = self.renderer_for(scope["path"]).semif_error(AmbiguousFraming(MESSAGE), 0)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
