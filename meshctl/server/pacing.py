"""A token bucket that paces new xDS streams, so a reconnect storm is spread over seconds.

When a replica dies its proxies reconnect to the others at once, and each new stream costs a
full generation; when it comes back, `--max-connection-age` moves a share of them back. A
replica that takes only so many new streams a second refuses the rest with UNAVAILABLE, which
Envoy retries with jittered backoff, and keeps its open streams served meanwhile. Istio paces
the same way (`PILOT_MAX_REQUESTS_PER_SECOND`, a token bucket in front of every new stream).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens a second, up to `burst` saved; `take` spends one if there is one.

    Not thread-safe: the ADS servicer takes tokens on the event loop only.
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a rate must be positive, not {rate!r}")
        self.rate = rate
        #: A second's worth by default: a pause refills to one second of streams, not more.
        self.burst = max(1.0, burst if burst is not None else rate)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()

    def take(self) -> bool:
        """Spend a token and return True, or return False (and spend nothing) when there is none."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
