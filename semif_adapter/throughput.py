"""A running measure of decode throughput (tokens/s), used to refuse work that cannot finish in time.

Each engine operation reports the tokens it decoded and the seconds its decode calls took. The
measure is a decayed ratio of sums, so large operations (the ones a deadline is about) weigh most
and the figure follows the machine when its speed changes. Operations too small to say anything
(per-call overhead dominates) are ignored, and no figure is given until ``warmup_tokens`` were seen.
"""

from __future__ import annotations

import threading


class Throughput:
    def __init__(self, *, warmup_tokens: int = 2048, min_tokens: int = 256, decay: float = 0.8) -> None:
        self.warmup_tokens = warmup_tokens
        self.min_tokens = min_tokens
        self.decay = decay
        self._tokens = 0.0
        self._seconds = 0.0
        self._seen = 0
        self._lock = threading.Lock()

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < self.min_tokens or seconds <= 0:
            return
        with self._lock:
            self._tokens = self.decay * self._tokens + tokens
            self._seconds = self.decay * self._seconds + seconds
            self._seen += tokens

    @property
    def tokens_per_s(self) -> float | None:
        """The measure, or ``None`` during warm-up."""
        with self._lock:
            if self._seen < self.warmup_tokens or self._seconds <= 0:
                return None
            return self._tokens / self._seconds

    def seconds_for(self, tokens: int) -> float | None:
        rate = self.tokens_per_s
        return None if rate is None else tokens / rate
