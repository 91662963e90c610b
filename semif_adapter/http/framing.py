"""Refuse a request whose HTTP framing is ambiguous, before any route reads it.

uvicorn's HTTP/1.1 parser (h11) accepts a request that carries both ``Transfer-Encoding`` and
``Content-Length``, frames its body by ``Transfer-Encoding`` and keeps the connection open. A proxy in
front that framed it by ``Content-Length`` would then disagree on where the next request starts
(request smuggling). RFC 9112 §6.3 allows rejecting such a request and requires closing the
connection after answering it: this does both. Every other framing error (conflicting lengths,
bad chunk sizes, oversized headers, garbage) h11 itself answers with a plain 400 and a close.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

MESSAGE = "a request may not carry both Transfer-Encoding and Content-Length"


class AmbiguousFramingGuard:
    """ASGI middleware: 400 (in the path's error shape) and ``Connection: close`` for TE + CL."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"transfer-encoding" in names and b"content-length" in names:
                if scope["path"].startswith("/v1/"):
                    body: dict[str, object] = {
                        "detail": {"error_type": "invalid_request", "message": MESSAGE}
                    }
                else:
                    body = {"error": MESSAGE, "type": "invalid_request"}
                response = JSONResponse(body, status_code=400, headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
