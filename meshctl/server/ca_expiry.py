"""Saying, in the log, that the mesh's CA nears its end or has passed it.

A CA that expires takes mutual TLS with it: nothing can be issued or renewed, and proxies lose
their certificates one renewal period later. A self-signed root lives ten years and a plug-in CA
as long as the operator's PKI made it, so the end comes without anyone looking: the server says it
at start-up and once a day from `EXPIRY_WARNING` before it (a warning), and once a minute after it
(an error), from the moment it passes. /metrics has the dates as Istio's citadel gauges
(`Metrics.watch_ca`), for alerts.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Final

from meshctl.security.ca import CertificateAuthority

logger = logging.getLogger("meshctl.server")

#: How often a CA near its end is warned about, and how often one past it is an error.
WARN_EVERY: Final = timedelta(days=1)
ERROR_EVERY: Final = timedelta(minutes=1)


class CaExpiryWatch:
    """Looks at the CA once a minute (and the moment it expires) and logs as the module says."""

    def __init__(self, ca: CertificateAuthority) -> None:
        self._ca = ca
        self._warned: datetime | None = None
        self._timer: asyncio.TimerHandle | None = None

    def check(self, now: datetime | None = None) -> float:
        """Log what is due at `now`; the seconds until the next look."""
        at = now or datetime.now(UTC)
        notice = self._ca.expiry_notice(at)
        if notice is not None:
            level, message = notice
            if level >= logging.ERROR or self._warned is None or at - self._warned >= WARN_EVERY:
                logger.log(level, "%s", message)
                self._warned = at
        left = (self._ca.not_after - at).total_seconds()
        if left > 0:
            # Wake just after the end as well, so the first error comes with it, not up to a minute late.
            return max(0.05, min(ERROR_EVERY.total_seconds(), left + 0.05))
        return ERROR_EVERY.total_seconds()

    def start(self) -> None:
        self._run()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.check(), self._run)
