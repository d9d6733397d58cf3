"""The inotify watches behind the directory watcher: which directories are watched, what an
event's path is called as the user gave it, and whether events may have been lost.

Each directory root is watched recursively by its real path, and each root's parent too (to see
the root itself deleted, recreated or re-pointed); a root given as a symlink is watched where it
leads, and event paths are translated back to the name it was given by. Apart from the watcher
(`meshctl.config.watcher`) so that its module is about what to reload and when.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from watchdog import events as ev
from watchdog.observers.api import BaseObserver, ObservedWatch

from meshctl.config.findings import Finding, Severity
from meshctl.config.paths import dir_identity, is_under

logger = logging.getLogger("meshctl.config.watcher")

#: Events that can change what a reload reads. Opens and read-only closes are left out: the
#: reload's own reads would otherwise schedule the next reload.
EVENT_FILTER: Final[list[type[ev.FileSystemEvent]]] = [
    *(ev.FileCreatedEvent, ev.FileDeletedEvent, ev.FileModifiedEvent, ev.FileMovedEvent, ev.FileClosedEvent),
    *(ev.FileAttribEvent, ev.DirCreatedEvent, ev.DirDeletedEvent, ev.DirMovedEvent, ev.DirAttribEvent),
]

#: Where watchdog's inotify layer logs that events were lost (see `_LostEvents`).
_INOTIFY_LOGGERS: Final = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")


class _LostEvents(logging.Handler):
    """A warning from watchdog's inotify layer means events were lost (its queue overflowed, a
    watch could not be set up again). watchdog tells its log and no event handler, so the
    watches listen there; should that log be silenced, the periodic full pass still repairs
    whatever was lost."""

    def __init__(self, on_lost: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_lost = on_lost

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:  # its errors are about its own threads stopping
            self._on_lost()


class Watches:
    """The watches of some roots on one watchdog observer (none when it could not start)."""

    def __init__(
        self, roots: Sequence[str], handler: ev.FileSystemEventHandler, on_lost: Callable[[], None], interval: float
    ) -> None:
        self._roots = roots
        self._handler = handler
        self._lost = _LostEvents(on_lost)
        self._interval = interval
        self.observer: BaseObserver | None = None
        self._error: str | None = None
        # (path as given, recursive) -> (identity and real path of the directory, watch)
        self._watches: dict[tuple[str, bool], tuple[tuple[int, int, str], ObservedWatch]] = {}
        self._aliases: Mapping[str, str] = {}  # real path watched -> path as given, for event paths

    def open(self, observer_type: Callable[[], BaseObserver]) -> None:
        try:
            observer = observer_type()
            observer.start()
        except OSError as exc:  # out of inotify instances, say: still serve, and look on a timer
            self._error = exc.strerror or str(exc)
            return
        self.observer, self._error = observer, None
        for name in _INOTIFY_LOGGERS:
            logging.getLogger(name).addHandler(self._lost)

    def close(self) -> None:
        for name in _INOTIFY_LOGGERS:
            logging.getLogger(name).removeHandler(self._lost)
        if self.observer is not None:
            self.observer.stop()
            self.observer.join()
            self.observer = None
        self._watches.clear()
        self._aliases = {}
        self._error = None

    def as_given(self, path: str) -> str:
        aliases = self._aliases
        real = max((r for r in aliases if is_under(path, r)), key=len, default=None)
        return path if real is None else aliases[real] + path[len(real) :]

    def arm(self, stale: set[str], status: dict[str, list[Finding]]) -> bool:
        """Make the watches match the tree; a root in `stale` is watched afresh. Returns True
        when some watch could not be set up, so the tree must be looked at on a timer instead;
        each failure is added to `status`."""
        observer = self.observer
        if observer is None:
            for root in self._roots if self._error is not None else ():
                status.setdefault(root, []).append(self._failure(root, self._error))
            return self._error is not None
        desired: dict[tuple[str, bool], tuple[int, int, str]] = {}
        for root in self._roots:
            if (identity := dir_identity(root)) is not None:
                desired[(root, True)] = identity
            parent = os.path.dirname(root)
            if parent != root and (identity := dir_identity(parent)) is not None:
                desired.setdefault((parent, False), identity)
        for key, (identity, watch) in list(self._watches.items()):
            if desired.get(key) != identity or (key[1] and key[0] in stale):
                del self._watches[key]
                try:
                    observer.unschedule(watch)
                except (KeyError, OSError):
                    logger.debug("watch on %s was already gone", key[0])
        failed = False
        for key, identity in desired.items():
            if key in self._watches:
                continue
            try:
                # The real path, not following links below it: watchdog would watch a directory
                # twice when a link inside the tree points into it (a ConfigMap's ..data does).
                watch = observer.schedule(self._handler, identity[2], recursive=key[1], event_filter=EVENT_FILTER)
            except OSError as exc:
                failed = True
                hint = " (raise fs.inotify.max_user_watches)" if exc.errno == 28 else ""
                status.setdefault(key[0], []).append(self._failure(key[0], f"{exc.strerror or exc}{hint}"))
                continue
            self._watches[key] = (identity, watch)
        self._aliases = {identity[2]: key[0] for key, (identity, _) in self._watches.items()}
        return failed

    def _failure(self, path: str, reason: str | None) -> Finding:
        interval = self._interval
        return Finding(Severity.ERROR, f"cannot watch for changes: {reason}; looking every {interval:g}s instead", path)
