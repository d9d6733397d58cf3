"""When the directory watcher reloads, and what the reload covers: file events in, the next due
time and each round's paths out.

A reload is due when a burst of file events has been quiet for `debounce` seconds (or
`max_delay` after its first event at the latest), when the last reload failed or left a path
unwatched (then every `retry_interval`), when a file held back as still being written is to be
looked at again, and every `resync_period` seconds (0: never) for a full pass. A round takes the
paths events named since the last one, and is a full pass when events cannot say what changed (a
doubt, events lost, a root named by an event), after a failure, and when the resync is due.

Events arrive on watchdog's thread and reloads run on the watcher's thread or the caller's
(`reload_now`), so all of this is kept under one lock here. It is apart from the watcher
(`meshctl.config.watcher`), which reads the files and hands the store the result, because this
part never touches a file: it only decides when, and which paths.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from watchdog import events as ev

from meshctl.config.paths import is_doubt
from meshctl.debounce import Debouncer


@dataclass(frozen=True, slots=True)
class ReloadRound:
    """What one reload covers, taken from the schedule as it starts."""

    #: When it started (monotonic).
    now: float
    #: The roots events named (their watches are set up again by a full pass).
    stale: set[str]
    #: The paths events named since the round before.
    dirty: set[str]
    #: Only a full pass over the tree will do.
    full: bool


class ReloadSchedule:
    """The watcher's scheduling state: the events since the last reload, and when the next is due."""

    def __init__(
        self, roots: Sequence[str], *, debounce: float, max_delay: float, retry_interval: float, resync_period: float
    ) -> None:
        self._roots = tuple(roots)
        self._retry_interval, self._resync_period = retry_interval, resync_period
        self._cond = threading.Condition()  # guards everything below
        #: The burst of file events not yet reloaded (`meshctl.debounce`).
        self._burst = Debouncer(debounce, max_delay)
        self._last_reload = 0.0
        self._degraded = self._stopping = False
        self._retry_at: float | None = None  # when to look again at files held back as being written
        self._stale_roots: set[str] = set()
        #: Files written to since they were last closed, as file events tell (see `_note_writer`).
        self._open_writes: set[str] = set()
        #: The paths events named since the last reload, and whether only a full pass can tell
        #: what they changed (`is_doubt`, lost events); when the last full pass started.
        self._dirty: set[str] = set()
        self._doubt = False
        self._last_full: float | None = None

    # -- events --

    def note_event(self, event: ev.FileSystemEvent, paths: list[str], relevant: list[str]) -> None:
        """A file event: `paths` are its paths as the user named them, `relevant` those of them
        a reload must look at."""
        now = time.monotonic()
        with self._cond:
            self._stale_roots.update(p for p in paths if p in self._roots)
            doubt = any(is_doubt(p, self._roots, is_directory=event.is_directory) for p in relevant)
            self._doubt = self._doubt or doubt
            self._dirty.update(relevant)
            self._note_writer(event, paths)
            self._burst.note(now)
            self._cond.notify_all()

    def note_lost_events(self) -> None:
        """Events were lost: a full pass, as soon as the debounce allows."""
        with self._cond:
            self._doubt = True
            self._burst.note(time.monotonic())
            self._cond.notify_all()

    def _note_writer(self, event: ev.FileSystemEvent, paths: list[str]) -> None:
        """Which files a writer has modified and not closed yet (under `_cond`): a file closed
        after its last write, or renamed into place, is complete whatever its age."""
        if event.is_directory:
            return
        if isinstance(event, (ev.FileModifiedEvent, ev.FileCreatedEvent)):
            self._open_writes.add(paths[0])
        elif isinstance(event, (ev.FileClosedEvent, ev.FileDeletedEvent, ev.FileMovedEvent)):
            self._open_writes.difference_update(paths)

    def open_for_writing(self, path: str) -> bool:
        with self._cond:
            return path in self._open_writes

    # -- when --

    def _next_due(self) -> float | None:
        burst = self._burst.due()
        due: list[float] = [burst] if burst is not None else []
        if self._degraded:
            due.append(self._last_reload + self._retry_interval)
        if self._retry_at is not None:
            due.append(self._retry_at)
        if (resync := self._resync_at()) is not None:
            due.append(resync)
        return min(due, default=None)

    def _resync_at(self) -> float | None:
        """When the next periodic full pass is due (under `_cond`)."""
        period = self._resync_period
        return None if period <= 0 or self._last_full is None else self._last_full + period

    def wait(self) -> bool:
        """Block until a reload is due: True, or False once the schedule is stopped."""
        with self._cond:
            while not self._stopping:
                due, now = self._next_due(), time.monotonic()
                if due is not None and now >= due:
                    return True
                self._cond.wait(None if due is None else due - now)
            return False

    def start(self) -> None:
        with self._cond:
            self._stopping = False

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    # -- rounds --

    def begin(self, *, background: bool, full: bool) -> ReloadRound:
        """Start a reload (a full pass when `full` or not `background`): events from here on
        are not covered by its reads, so they schedule the next."""
        with self._cond:
            self._burst.take()
            self._retry_at = None
            now = self._last_reload = time.monotonic()
            stale, self._stale_roots = self._stale_roots, set()
            dirty, self._dirty = self._dirty, set()
            resync = self._resync_at()
            full = (
                full
                or not background
                or self._doubt
                or self._degraded
                or bool(stale)
                or (resync is not None and now >= resync)
            )
            self._doubt = False
        return ReloadRound(now, stale, dirty, full)

    def full_pass_started(self, now: float) -> None:
        with self._cond:
            self._last_full = now

    def reloaded(self, retry_at: float | None, *, degraded: bool | None = None) -> None:
        """A reload reached the store: files held back are looked at again at `retry_at`, and
        (after a full pass) `degraded` says whether a path is left unwatched or unread."""
        with self._cond:
            if degraded is not None:
                self._degraded = degraded
            self._retry_at = retry_at
            self._cond.notify_all()  # the watcher thread may be waiting for a later time

    def failed(self) -> None:
        """A reload failed: try again after `retry_interval` even if no event comes."""
        with self._cond:
            self._degraded = True
