"""Keeping the cyclic garbage collector off the fleet's long-lived objects.

`meshctl serve` freezes what start-up loaded (`Settings.freeze_startup`), but most of what a
large fleet keeps is made after that: every stream's connection and subscriptions, and the
config generated for the fleet as it connects and on every change. At 10,000 services x 2,000
proxies that is about 1.5 million objects the collector tracks, and a full collection walks
all of them: 0.7-0.8 s of CPU (`bench/push_cost.py` with the collector's callbacks), about
once per change and in the middle of its push, because the change is what allocates enough to
set one off.

`QuietFreezer` waits until the server has been quiet for a moment (no publication, no connect,
no write) and then moves what is alive into the collector's permanent generation
(`gc.freeze`), after collecting the young generations only (cheap), so a change's collections
walk what that change made, not the fleet. Frozen objects are still freed by reference
counting when dropped, which is how the server lets go of almost everything; what it leaves is
garbage in cycles (a stream's task and its callbacks when the stream ends). So every
`full_every` seconds, when quiet, the freezer thaws everything, collects it whole and freezes
again: such garbage lives at most that long, and the walk happens while nothing waits.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

logger = logging.getLogger("meshctl.server.collector")

#: Quiet this long (seconds) before freezing: a change's pushes and ACKs keep the server busy.
QUIET = 2.0
#: A whole collection (thaw, collect, freeze) at most this often (seconds), when quiet.
FULL_EVERY = 600.0


class QuietFreezer:
    """Freezes the collector's objects once the server has been quiet for `quiet` seconds after
    being busy (`busy()`), with a whole collection first at most every `full_every` seconds.
    One timer at a time; used from the event loop's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        quiet: float = QUIET,
        full_every: float = FULL_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._quiet = quiet
        self._full_every = full_every
        self._clock = clock
        self._last_busy = clock()
        self._last_full = clock()
        self._timer: asyncio.TimerHandle | None = None
        #: freezes done / of them, whole collections first (for tests and the log)
        self.freezes = 0
        self.full_collections = 0

    def busy(self) -> None:
        """Something happened (a publication, a connect, a write): freeze once it is quiet. A
        timestamp per call; the timer is armed once and moves itself on."""
        self._last_busy = self._clock()
        if self._timer is None and not self._loop.is_closed():
            self._timer = self._loop.call_later(self._quiet, self._check)

    def _check(self) -> None:
        self._timer = None
        waited = self._clock() - self._last_busy
        if waited < self._quiet:
            self._timer = self._loop.call_later(self._quiet - waited, self._check)
            return
        self.freeze()

    def freeze(self) -> None:
        """Collect the young generations (or, when due, everything) and freeze what is left."""
        started = time.process_time()
        whole = self._clock() - self._last_full >= self._full_every
        if whole:
            gc.unfreeze()
            gc.collect()
            self._last_full = self._clock()
            self.full_collections += 1
        else:
            gc.collect(1)
        gc.freeze()
        self.freezes += 1
        logger.debug(
            "froze %d objects out of the cyclic collector (%s collection first, %.3f s of CPU)",
            gc.get_freeze_count(), "a whole" if whole else "a young", time.process_time() - started,
        )  # fmt: skip

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
