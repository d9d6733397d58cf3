"""A bound on the response bytes handed to gRPC at once, so a reconnect storm's memory is bounded.

A stream's response lives twice while it is written: the bytes the servicer encoded and gRPC's
own copy, until the peer has read enough of it. When a whole fleet connects at once (the server
started, a replica gone), every stream is handed its first, largest responses together: at
10,000 services each sidecar's first clusters and assignments are some megabytes, and 2,000
streams written at once held the server at twice its steady memory until the slowest client had
read. The bytes in flight do not make anyone's config arrive sooner (the clients read them at
their own pace), so a stream waits here for room before it encodes, and the peak is the budget
plus what the server holds anyway.

The pushes of a change to streams that already hold config are bounded separately and loosely
(`CHANGE_FACTOR` times the bound on first responses). Measured at 10,000 services x 2,000 proxies,
the connect storm makes the peak, not a change (a change's pushes are a route configuration or a
cluster set per proxy, and its clients are reading); but with one bound for both, the pushes of
a VirtualService change to all 2,000 waited for room up to 3 s each at 256 MB, which is most of
what stood between the change and a p99 under 3 s. So a stream's first response of each type
waits for room within the tight bound, a change's push within the loose one, and a waiting
change goes before a waiting connect (its operator is waiting for it). Changes count in the
bytes held, so connects wait while a change is in flight.

Three rules keep the wait from ever becoming a stall:

- a response larger than the whole budget is written when nothing else is in flight (alone);
- a write that is still in progress after `linger` seconds stops counting: a client that stops
  reading (or reads very slowly) must not hold the room of the others. Such a client costs the
  memory of its one response, as it did without the budget, and the abusive-client bounds
  (`limits.py`) deal with it;
- a waiter cancelled (its stream gone) passes its turn, or the room it was just granted, on.

Every burst of waiting is logged once it ends (how many writes of each kind waited, for how
long in all and at most, how many lingered): what sizing `serve --max-write-buffer-mb` needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

#: The default bound on first responses (`serve --max-write-buffer-mb`): their bytes in gRPC's
#: hands at once. Measured with 2,000 proxies of a 10,000-service mesh connecting at once: the
#: server's peak was 1.94-2.18 GB with no bound or 256 MB (at 256 MB the clients, on the same two
#: cores, read so slowly that thousands of writes outlived the linger and stopped counting),
#: 1.29-1.60 GB with 128 MB, 1.29 GB with 64 MB.
DEFAULT_BYTES = 128 * 1024 * 1024
#: The bound on a change's pushes to streams that hold config, as a multiple of the bound on
#: first responses: 1 GB at the default. With no bound on changes at all, a VirtualService change
#: pushed to 2,000 proxies of a 10,000-service mesh took the server's peak from 1.60 GB (the
#: connect storm's) to 1.79 GB: this bound is not meant to pace such a change, only to cap one.
CHANGE_FACTOR = 8
#: How long a write counts against the budget at most.
DEFAULT_LINGER = 2.0
#: Seconds after the waiting ends before it is logged (one line per burst, not per write).
_REPORT_AFTER = 1.0

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Hold:
    """Room taken for one write; given back once, by `WriteBudget.give_back` or by the linger."""

    size: int
    #: when the room was taken (the loop's clock): it stops counting `linger` seconds after
    since: float = field(default=0.0, repr=False)
    released: bool = False


@dataclass(slots=True)
class Waits:
    """Writes of one kind that waited for room, and for how long in all (seconds)."""

    count: int = 0
    seconds: float = 0.0
    longest: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds
        self.longest = max(self.longest, seconds)


class WriteBudget:
    """Bytes in writes at once: at most `limit` for a stream's first responses, at most
    `change_limit` for the pushes of a change to streams that hold config (see the module
    docstring). Event loop only."""

    def __init__(
        self, limit: int = DEFAULT_BYTES, linger: float = DEFAULT_LINGER, change_limit: int | None = None
    ) -> None:
        if limit <= 0:
            raise ValueError(f"a write budget must be positive, not {limit!r}")
        self.limit = limit
        self.change_limit = max(limit, change_limit if change_limit is not None else limit * CHANGE_FACTOR)
        self.linger = linger
        #: bytes counted now
        self.held = 0
        #: the most bytes ever counted at once (for tests and /debug)
        self.peak = 0
        #: writes that waited for room (first responses, change pushes), and writes that stopped
        #: counting while still in progress
        self.first_waits = Waits()
        self.change_waits = Waits()
        self.lingered = 0
        #: waiting: changes are served before first responses (their clients read; a change is
        #: what an operator waits for)
        self._changes: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._firsts: deque[tuple[int, asyncio.Future[None]]] = deque()
        #: what waited since the last log line
        self._unreported = (Waits(), Waits())
        self._report: asyncio.TimerHandle | None = None
        #: the holds by the time they were taken (so by when they linger: the linger is one for
        #: all), and the one timer that lets them linger: a timer per write, armed and cancelled,
        #: cost a tenth of a stream's push
        self._holds: deque[Hold] = deque()
        self._sweep: asyncio.TimerHandle | None = None

    @property
    def waited(self) -> int:
        return self.first_waits.count + self.change_waits.count

    def _fits(self, size: int, first: bool) -> bool:
        return self.held == 0 or self.held + size <= (self.limit if first else self.change_limit)

    async def take(self, size: int, *, first: bool = True) -> Hold:
        """Room for `size` bytes, waiting in turn (first come, first served among writes of a
        kind, changes before first responses) until there is. `first`: a stream's first
        response of its type (a connect), else a change pushed to a stream that holds config."""
        queue = self._firsts if first else self._changes
        if not queue and (not first or not self._changes) and self._fits(size, first):
            return self._grant(size)
        loop = asyncio.get_running_loop()
        since = loop.time()
        future: asyncio.Future[None] = loop.create_future()
        entry = (size, future)
        queue.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Granted as the stream was cancelled: the room goes to the next in line.
                self.held -= size
                self._wake()
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                    queue.remove(entry)
                self._wake()  # the one behind may fit now
            raise
        waited = loop.time() - since
        (self.first_waits if first else self.change_waits).add(waited)
        self._unreported[0 if first else 1].add(waited)
        return self._track(size)

    def give_back(self, hold: Hold) -> None:
        """The write is done (or failed): its room goes to whoever waits."""
        self._release(hold)

    def _grant(self, size: int) -> Hold:
        self.held += size
        return self._track(size)

    def _track(self, size: int) -> Hold:
        self.peak = max(self.peak, self.held)
        loop = asyncio.get_running_loop()
        hold = Hold(size, loop.time())
        self._holds.append(hold)
        if self._sweep is None:
            self._sweep = loop.call_at(hold.since + self.linger, self._linger)
        return hold

    def _linger(self) -> None:
        """Holds taken `linger` seconds ago or more and still counting stop counting; the timer
        is armed again for the oldest left, or not at all when none is."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        due = loop.time() - self.linger
        holds = self._holds
        while holds and (holds[0].released or holds[0].since <= due):
            hold = holds.popleft()
            if not hold.released:
                self.lingered += 1
                self._release(hold)
        if holds:
            self._sweep = loop.call_at(holds[0].since + self.linger, self._linger)

    def _release(self, hold: Hold) -> None:
        if hold.released:
            return
        hold.released = True
        self.held -= hold.size
        self._wake()

    def _wake(self) -> None:
        """Grant the waiters at the head of each line that fit, in order: changes first."""
        for queue, first in ((self._changes, False), (self._firsts, True)):
            while queue:
                size, future = queue[0]
                if future.done():  # cancelled while queued; `take` removes it, skip it meanwhile
                    queue.popleft()
                    continue
                if not self._fits(size, first):
                    return
                queue.popleft()
                self.held += size
                future.set_result(None)
        if self._report is None and (self._unreported[0].count or self._unreported[1].count):
            self._report = asyncio.get_running_loop().call_later(_REPORT_AFTER, self._log)

    def _log(self) -> None:
        """One line for the writes that waited since the last: what an operator sizing
        `--max-write-buffer-mb` needs (how long the bound held connects and changes back)."""
        self._report = None
        firsts, changes = self._unreported
        self._unreported = (Waits(), Waits())
        logger.info(
            "write budget: %d first responses waited %.1fs in all (longest %.2fs), %d change pushes "
            "waited %.1fs (longest %.2fs); %d writes lingered so far, peak %.0f MB",
            firsts.count,
            firsts.seconds,
            firsts.longest,
            changes.count,
            changes.seconds,
            changes.longest,
            self.lingered,
            self.peak / (1 << 20),
        )
