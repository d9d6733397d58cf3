"""A bound on the response bytes handed to gRPC at once, so a reconnect storm's memory is bounded.

A stream's response lives twice while it is written: the bytes the servicer encoded and gRPC's
own copy, until the peer has read enough of it. When a whole fleet connects at once (the server
started, a replica gone), every stream is handed its first, largest responses together: at
10,000 services each sidecar's first clusters and assignments are some megabytes, and 2,000
streams written at once held the server at twice its steady memory until the slowest client had
read. The bytes in flight do not make anyone's config arrive sooner (the clients read them at
their own pace), so a stream waits here for room before it encodes, and the peak is the budget
plus what the server holds anyway.

Two rules keep the wait from ever becoming a stall:

- a response larger than the whole budget is written when nothing else is in flight (alone);
- a write that is still in progress after `linger` seconds stops counting: a client that stops
  reading (or reads very slowly) must not hold the room of the others. Such a client costs the
  memory of its one response, as it did without the budget, and the abusive-client bounds
  (`limits.py`) deal with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

#: The default budget (`serve --max-write-buffer-mb`): responses in gRPC's hands at once, in
#: bytes. Measured with 2,000 proxies of a 10,000-service mesh connecting at once: the server's
#: peak was 1.94 GB with no bound (and with 256 MB), 1.29 GB with 128 MB or 64 MB; a change
#: pushed to all of them took p99 2.85 s at 256 MB, 3.25 s at 128 MB and 3.53 s at 64 MB (one run
#: each: the bound also paces the pushes of a change when the clients are slow to read).
DEFAULT_BYTES = 128 * 1024 * 1024
#: How long a write counts against the budget at most.
DEFAULT_LINGER = 2.0


@dataclass(slots=True, eq=False)
class Hold:
    """Room taken for one write; given back once, by `WriteBudget.give_back` or by the linger timer."""

    size: int
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    released: bool = False


class WriteBudget:
    """Bytes in writes at once, at most `limit` (see the module docstring). Event loop only."""

    def __init__(self, limit: int = DEFAULT_BYTES, linger: float = DEFAULT_LINGER) -> None:
        if limit <= 0:
            raise ValueError(f"a write budget must be positive, not {limit!r}")
        self.limit = limit
        self.linger = linger
        #: bytes counted now
        self.held = 0
        #: the most bytes ever counted at once (for tests and /debug)
        self.peak = 0
        #: writes that waited for room, and writes that stopped counting while still in progress
        self.waited = 0
        self.lingered = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    async def take(self, size: int) -> Hold:
        """Room for `size` bytes, waiting in turn (first come, first served) until there is."""
        if not self._waiters and self._fits(size):
            return self._grant(size)
        self.waited += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Granted as the stream was cancelled: the room goes to the next in line.
                self.held -= size
                self._wake()
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                    self._waiters.remove(entry)
                self._wake()  # the one behind may fit now
            raise
        return self._track(size)

    def give_back(self, hold: Hold) -> None:
        """The write is done (or failed): its room goes to whoever waits."""
        if hold.timer is not None:
            hold.timer.cancel()
        self._release(hold)

    def _grant(self, size: int) -> Hold:
        self.held += size
        return self._track(size)

    def _track(self, size: int) -> Hold:
        self.peak = max(self.peak, self.held)
        hold = Hold(size)
        hold.timer = asyncio.get_running_loop().call_later(self.linger, self._lingered, hold)
        return hold

    def _lingered(self, hold: Hold) -> None:
        if not hold.released:
            self.lingered += 1
        self._release(hold)

    def _release(self, hold: Hold) -> None:
        if hold.released:
            return
        hold.released = True
        self.held -= hold.size
        self._wake()

    def _wake(self) -> None:
        """Grant the waiters at the head of the line that fit, in order."""
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():  # cancelled while queued; `take` removes it, skip it meanwhile
                self._waiters.popleft()
                continue
            if not self._fits(size):
                return
            self._waiters.popleft()
            self.held += size
            future.set_result(None)
