"""Per-request deadlines and cancellation: one small token the HTTP layer creates and the engine consults.

Work never outlives its caller. A :class:`Deadline` is cancelled when its time passes or when the
caller leaves; the engine stops at the next check point:

* before every decision and before every ``n_batch`` decode chunk (``check``, any backend), and
* between llama.cpp graph nodes on CPU: the runtime installs llama.cpp's abort callback with the token's
  flag byte as its data, so a cancel from another thread stops a long chunk mid-graph without the
  callback ever entering Python (no GIL, no per-node cost).

The token also counts the tokens decoded for the request, so an abort can say how far it got, and it
refuses at once (``begin``) a request that the measured throughput says cannot finish in time.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from semif_adapter.errors import SemifError, ShuttingDown

DEADLINE = "deadline"
DISCONNECTED = "disconnected"
SHUTTING_DOWN = "shutting_down"


class DeadlineExceeded(SemifError):
    """The request's deadline passed (or would pass) before its tokens were decoded.

    Not retryable unchanged: the same request needs the same time again. ``extra`` goes on the wire.
    """

    code = "deadline_exceeded"
    status = 504

    def __init__(self, message: str, *, tokens_done: int, tokens_needed: int, limit_s: float | None) -> None:
        super().__init__(message)
        self.extra: dict[str, Any] = {
            "tokens_done": tokens_done,
            "tokens_needed": tokens_needed,
            "limit_s": limit_s,
        }


class ClientDisconnected(SemifError):
    """The caller left; nobody reads this answer, it only names the status in logs and metrics."""

    code = "client_disconnected"
    status = 499


def _fmt(seconds: float) -> str:
    return f"{seconds:.3g}"


class Deadline:
    """A cancel token with an optional time limit; ``cancel`` is safe from any thread.

    ``limit_s=None`` means no time limit (the token still cancels on disconnect).
    ``started`` is when the clock began (``time.monotonic``), normally the request's arrival.
    ``estimate`` maps a token count to predicted decode seconds, or ``None`` while it has no measure.
    """

    def __init__(
        self,
        limit_s: float | None,
        *,
        started: float | None = None,
        estimate: Callable[[int], float | None] | None = None,
    ) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic() if started is None else started
        self.expires_at = None if limit_s is None else self.started + limit_s
        self.reason: str | None = None
        self.tokens_needed = 0
        self.tokens_done = 0
        self.decode_seconds = 0.0
        self.max_chunk_seconds = 0.0
        self.refused = False
        self._estimate = estimate
        self._lock = threading.Lock()
        # Two bytes, the second always NUL: the runtime's abort callback reads the first as a C string
        # length, so "\x01\0" aborts and "\0\0" continues.
        self._flag = ctypes.create_string_buffer(2)
        self._listeners: list[Callable[[Deadline], None]] = []

    # --- state --------------------------------------------------------------------------------
    @property
    def flag_address(self) -> int:
        """Address of the flag byte (llama.cpp's ``abort_callback_data``); valid while the token lives."""
        return ctypes.addressof(self._flag)

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def remaining(self) -> float | None:
        return None if self.expires_at is None else self.expires_at - time.monotonic()

    def cancel(self, reason: str = DISCONNECTED) -> None:
        """Stop the work at the next check point; the first reason wins."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            self._flag[0] = b"\x01"
            listeners = list(self._listeners)
        for listener in listeners:
            listener(self)

    def on_cancel(self, listener: Callable[[Deadline], None]) -> None:
        """Call ``listener(self)`` once when the token is cancelled (at once if it already is)."""
        with self._lock:
            if self.reason is None:
                self._listeners.append(listener)
                return
        listener(self)

    def off_cancel(self, listener: Callable[[Deadline], None]) -> None:
        """Forget ``listener`` (a shared call that ended no longer needs to hear of this token)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def expire(self) -> None:
        self.cancel(DEADLINE)

    # --- check points (engine thread) ------------------------------------------------------------
    def begin(self, tokens: int) -> None:
        """The engine is about to decode ``tokens``: refuse now if they cannot finish in time."""
        self.tokens_needed += tokens
        self.check()
        remaining = self.remaining()
        predicted = self._estimate(tokens) if self._estimate is not None and tokens else None
        if remaining is None or predicted is None or predicted <= remaining:
            return
        self.refused = True
        rate = tokens / predicted
        raise DeadlineExceeded(
            f"refused before decoding: the request needs {tokens} tokens, about {_fmt(predicted)} s at the "
            f"measured {rate:.0f} tokens/s, but only {_fmt(max(remaining, 0.0))} s of its "
            f"{_fmt(self.limit_s or 0.0)} s deadline remain; send fewer tokens per request "
            "(split the decisions or shorten the state)",
            tokens_done=self.tokens_done,
            tokens_needed=self.tokens_needed,
            limit_s=self.limit_s,
        )

    def advance(self, tokens: int, seconds: float) -> None:
        """One decode chunk finished."""
        self.tokens_done += tokens
        self.decode_seconds += seconds
        self.max_chunk_seconds = max(self.max_chunk_seconds, seconds)

    def check(self) -> None:
        """Raise the abort error if the token was cancelled or its time has passed."""
        if self.reason is None and self.expires_at is not None and time.monotonic() >= self.expires_at:
            self.expire()
        if self.reason is not None:
            raise self.error()

    def error(self) -> SemifError:
        """The error that ends an aborted request."""
        done, needed = self.tokens_done, self.tokens_needed
        if self.reason == DISCONNECTED:
            return ClientDisconnected(f"the client disconnected; stopped after {done} of {needed} tokens")
        if self.reason == SHUTTING_DOWN:
            return ShuttingDown(
                f"the server is shutting down and its grace period ended after {done} of {needed} tokens; "
                "retry on another instance"
            )
        return DeadlineExceeded(
            f"the request's {_fmt(self.limit_s or 0.0)} s deadline passed after {done} of {needed} tokens "
            f"({needed - done} still needed); send fewer tokens per request",
            tokens_done=done,
            tokens_needed=needed,
            limit_s=self.limit_s,
        )


class Joint(Deadline):
    """The cancel token of a decode call that several requests share: it aborts the call only once every
    member is cancelled, so one caller's deadline or disconnect never stops another's work mid-call
    (the engine drops a cancelled member between calls; see ``engine.shared_calls``).

    Its own counts are not the members': the engine gives each member its share of a shared call."""

    def __init__(self, members: list[Deadline]) -> None:
        super().__init__(None)
        self.members = list(dict.fromkeys(members))  # one request may bring several parts
        for member in self.members:
            member.on_cancel(self._member_cancelled)

    def close(self) -> None:
        """Detach from the members once the shared call is over: a request that takes part in many calls
        keeps no listener per call."""
        for member in self.members:
            member.off_cancel(self._member_cancelled)

    def _member_cancelled(self, _member: Deadline) -> None:
        if all(member.cancelled for member in self.members):
            self.cancel(self.members[0].reason or DISCONNECTED)

    def check(self) -> None:
        for member in self.members:  # an expired member is noticed here, between calls
            if (
                member.reason is None
                and member.expires_at is not None
                and time.monotonic() >= member.expires_at
            ):
                member.expire()
        super().check()
