"""Connection discipline in the server itself (no proxy in the image): uvicorn's HTTP/1.1 protocol, guarded.

uvicorn bounds a body's arrival (the app's 408) and an idle kept-alive connection, but not the arrival of a
request's headers, nor how many connections may be open: a client that sends one header byte every few
seconds holds a file descriptor forever, and enough of them exhaust the descriptors until ``/ping`` stops
answering and the orchestrator replaces a healthy instance. So:

- the header section of each request must be complete within ``header_timeout_s`` of its first byte (of the
  connection's opening, for the first request), else the connection is closed;
- at most ``max_connections`` are open; one more is answered at once with a JSON 503
  ``too_many_connections`` and ``Connection: close``, before anything is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("semif_adapter.connections")

# Descriptors kept free for the model file, log files, the engine's threads and the like.
FD_RESERVE = 64


def raise_fd_limit() -> int:
    """Lift the soft descriptor limit to the hard one (allowed without privilege); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


def default_max_connections(fd_limit: int) -> int:
    """Half of what the descriptor limit leaves: well under it, whatever else the process opens."""
    return max(16, (fd_limit - FD_RESERVE) // 2)


def _overload_response(limit: int, retry_after_s: int) -> bytes:
    body = json.dumps(
        {
            "error": f"too many open connections (limit {limit}, SEMIF_MAX_CONNECTIONS); retry later",
            "type": "too_many_connections",
            "retryable": True,
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"retry-after: {retry_after_s}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap; :func:`guarded_protocol` makes
    the subclass that carries the configured values."""

    guard_header_timeout_s: float = 10.0
    guard_max_connections: int = 1024
    guard_overload: bytes = b""
    _refused = False
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.guard_max_connections:
            self._refused = True
            transport.write(self.guard_overload)
            transport.close()
            log.warning("connection refused: %d open (SEMIF_MAX_CONNECTIONS)", len(self.connections))
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._awaiting_headers():
            self._arm_header_timer()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if not self._awaiting_headers():
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._disarm_header_timer()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if not self._refused:
            super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._awaiting_headers():  # a pipelined request was already complete
            self._disarm_header_timer()

    # --- the header timer -------------------------------------------------------------------------
    def _awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.guard_header_timeout_s, self._headers_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            log.info(
                "closing a connection whose request headers took over %.3g s (SEMIF_HEADER_TIMEOUT_S)",
                self.guard_header_timeout_s,
            )
            self.transport.close()


def guarded_protocol(
    header_timeout_s: float, max_connections: int, retry_after_s: int = 1
) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with the header timeout and the connection cap (``Config(http=...)``)."""
    attributes = {
        "guard_header_timeout_s": header_timeout_s,
        "guard_max_connections": max_connections,
        "guard_overload": _overload_response(max_connections, retry_after_s),
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attributes)
