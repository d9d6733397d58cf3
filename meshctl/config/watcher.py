"""Keep the store in step with config directories on disk.

File events are only a hint. Editors save by writing a temporary file and renaming it over the
original, tools rewrite many files at once, inotify drops events when its queue overflows, and a
watched directory can be deleted and recreated. So any relevant event just schedules a reload of
the whole tree, debounced: the reload runs once things have been quiet for `debounce` seconds, or
`max_delay` seconds after the first event at the latest, so a writer that never stops still gets
its changes applied. A reload re-reads only files whose stat signature changed and hands the
store the complete new set in one `replace_all`, so a burst of edits becomes one change.

What survives a bad reload, and why:

- a file that fails to load keeps its last good resources (a typo must not withdraw routes from
  a running fleet), and its error stays in the store's file status until it is fixed;
- a file that never loaded contributes nothing; a deleted file's resources are deleted;
- a resource defined in two files comes from the first file in path order, the other is an error;
- a watched directory that is missing or unreadable deletes nothing (an unmounted volume is not
  an instruction to empty the mesh); the error is reported and the directory is picked up again
  when it comes back;
- a name that leads to no regular file (a FIFO, a device), a file over the size limit, and links
  that lead back into the tree are refused with a finding and never block a reload (`files`).

A file still being written is not loaded half-way: it keeps, for that round, what the previous
reload had from it (its last result, so its last good resources), and a reload is due when it
has settled even if no event comes. A file counts as being written when
- its stat changed while it was read (size, times), in any reload;
- in a background reload (events, `max_delay`, the timer while watches are down), it changed
  less than `settle` ago (1 s, at least `debounce`) and, as far as file events tell, the writer
  has not closed it yet (without events, polling, every such file counts): a writer that pauses
  between two parts (a script that writes a header, computes, then writes the rest; a copy over
  a slow mount) leaves the file quiet for longer than the debounce, and its first part alone
  may well parse. A file closed after its last write (`cat > f`, an editor's save) or renamed
  into place is complete, and is applied after the debounce alone;
- it does not load and its stat changed after it was read, in any reload: a parse failure of a
  file caught mid-write is no error to report, it is retried once the file has settled;
- in a background reload, it is empty and last gave resources: `cmd > file.yaml` truncates the
  file before `cmd` has written anything, and a running fleet must not lose the file's routes
  meanwhile. Such a file is held for up to `max_delay`, then taken as it is.
While a file is held as being written (the first two cases), a background reload applies no
other file that changed or went away either: they wait for it, so a save of several files (or a
linked tree swapped for another) is one change even when there are no events to debounce
(polling) or the files' times straddle a reload.
No file is held for longer than `max_delay`, so a writer that never stops still gets its changes
applied. A file seen for the first time is held in the same way (it contributes nothing yet).
`reload_now` (start-up, SIGHUP, an explicit reload) is an instruction that the files are ready:
it holds back only a file seen changing while it was read or loaded.

Hidden files and directories (.git, editor swap files) are ignored, except the `..data` symlink
that Kubernetes swaps to update a mounted ConfigMap, whose rename is the only event such an
update produces. A watched path may be a symlink and may be re-pointed; a directory reached
through a symlink inside the tree is read but not watched (re-point the link, or reload).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from watchdog import events as ev
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from meshctl.config.files import FileBytes, Signature, read_config_file, walk_yaml
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import FileResult, LoadOptions, load_bytes, merge_files, unreadable
from meshctl.config.paths import dir_identity, exists, is_relevant, is_under, root_problem, stat_signature, walk_key
from meshctl.config.store import ConfigChange, ConfigStore, EventKind, FileStatus
from meshctl.debounce import Debouncer
from meshctl.errors import ConfigError

logger = logging.getLogger("meshctl.config.watcher")

#: Events that can change what a reload reads. Opens and read-only closes are left out: the
#: reload's own reads would otherwise schedule the next reload.
_EVENT_FILTER: Final[list[type[ev.FileSystemEvent]]] = [
    *(ev.FileCreatedEvent, ev.FileDeletedEvent, ev.FileModifiedEvent, ev.FileMovedEvent, ev.FileClosedEvent),
    *(ev.FileAttribEvent, ev.DirCreatedEvent, ev.DirDeletedEvent, ev.DirMovedEvent, ev.DirAttribEvent),
]

#: A file changed this recently may change again within the file system's timestamp granularity
#: (1-2 s on some file systems) without its signature changing, so it is re-read next time.
_RACY_NS: Final = 2_000_000_000

#: A file held back as still being written is looked at again this soon at the earliest.
_MIN_RETRY: Final = 0.05



@dataclass(frozen=True, slots=True)
class WatchOptions:
    """Timing and loading settings for a `DirectoryWatcher`, passed in, never global."""

    debounce: float = 0.1
    max_delay: float = 10.0
    #: A file changed less than this long ago may still be being written (see the module doc).
    settle: float = 1.0
    #: While a watched path is missing or cannot be watched, look at it again this often.
    retry_interval: float = 1.0
    load: LoadOptions = field(default_factory=LoadOptions)

    def __post_init__(self) -> None:
        if self.debounce < 0 or self.retry_interval <= 0 or self.max_delay < self.debounce or not self.settle >= 0:
            raise ValueError(
                f"invalid watch timing: debounce={self.debounce}s, max_delay={self.max_delay}s,"
                f" retry_interval={self.retry_interval}s, settle={self.settle}s"
                " (need 0 <= debounce <= max_delay, retry > 0, settle >= 0)"
            )


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What one reload did: the change applied (None when nothing changed), every error still
    standing, how many files were parsed or reused unchanged from the previous reload, and the
    files held back as still being written (they keep what the reload before had from them)."""

    change: ConfigChange | None
    errors: tuple[Finding, ...]
    parsed: int = 0
    reused: int = 0
    deferred: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Cached:
    #: (inode, device, size, mtime, ctime); None when the file could not be read.
    signature: Signature | None
    result: FileResult
    #: A digest of the bytes loaded, kept while the file changed too recently for its signature
    #: alone to prove it unchanged (a write in the same clock tick keeps size and times).
    racy_digest: bytes | None = None


class _Scan:
    """One reload's working state; the watcher adopts it only once the store has the result, so
    a reload that fails half-way cannot make the next one forget a file's last good contents."""

    def __init__(
        self,
        cache: Mapping[str, _Cached],
        good: Mapping[str, FileResult],
        deferred: Mapping[str, float],
        background: bool,
    ) -> None:
        self.previous_cache, self.previous_good, self.previous_deferred = cache, good, deferred
        self.background = background
        self.started = time.monotonic()
        self.cache: dict[str, _Cached] = {}
        self.good: dict[str, FileResult] = {}
        self.status: dict[str, list[Finding]] = {}
        self.order: dict[str, tuple[int, tuple[tuple[int, str], ...]]] = {}
        self.parsed = self.reused = 0
        #: Files held back as still being written -> when they were first held (monotonic).
        self.deferred: dict[str, float] = {}
        self.retry_at: float | None = None
        #: Files loaded afresh this round, and whether some file was held as being written now.
        self.fresh: list[str] = []
        self.writing = False
        self.evented = False
        #: Files the previous reload had that this one did not find -> where they sorted.
        self.gone: dict[str, tuple[int, tuple[tuple[int, str], ...]]] = {}

    def reuse(self, path: str, cached: _Cached) -> FileResult:
        self.cache[path] = cached
        self.reused += 1
        return cached.result

    def parse(self, path: str, cached: _Cached) -> FileResult:
        self.cache[path] = cached
        self.parsed += 1
        self.fresh.append(path)
        return cached.result

    def hold_fresh(self, max_delay: float) -> None:
        """While a file is being written, the files loaded afresh this round, and those gone
        since the last, wait for it too (as the previous reload had them), so that a save of
        several files (or a swap of a linked tree) is applied as one."""
        retry_at = self.retry_at
        if retry_at is None:
            return
        for path, position in self.gone.items():
            since = self.previous_deferred.get(path, self.started)
            if self.started - since < max_delay:
                self.order[path] = position
                self.keep_file(path)
                self.defer(path, since, retry_at)
        for path in self.fresh:
            since = self.previous_deferred.get(path, self.started)
            if path in self.deferred or self.started - since >= max_delay:
                continue
            self.cache.pop(path, None)
            self.status.pop(path, None)
            self.good.pop(path, None)
            self.keep_file(path)
            self.defer(path, since, retry_at)

    def defer(self, path: str, since: float, retry_at: float) -> None:
        """Hold `path` back this round; the watcher looks again at `retry_at` even if no event comes."""
        self.deferred[path] = since
        self.retry_at = retry_at if self.retry_at is None else min(self.retry_at, retry_at)

    def keep_file(self, path: str) -> None:
        """`path` as the previous reload had it: its cached result, status and last good contents."""
        cached = self.previous_cache.get(path)
        if cached is not None:
            self.cache[path] = cached
            self.status[path] = list(cached.result.findings)  # its own; duplicates are found again
        if path in self.previous_good:
            self.good[path] = self.previous_good[path]

    def keep_root(self, index: int, root: str, problem: str) -> None:
        """A root that cannot be read: everything last loaded from under it stays, as it was."""
        kept = [p for p in self.previous_cache if is_under(p, root) and p not in self.order]
        count = len({c.key for p in kept if p in self.previous_good for c in self.previous_good[p].configs})
        message = f"{problem}; keeping the resources last loaded from it ({count}) until it can be read again"
        self.status.setdefault(root, []).append(Finding(Severity.ERROR, message, root))
        for path in kept:
            self.order[path] = (index, walk_key(root, path))
            self.keep_file(path)

    def in_path_order(self) -> list[str]:
        return sorted(self.order, key=self.order.__getitem__)


class _EventSink(ev.FileSystemEventHandler):
    """Forwards watchdog's events; runs on watchdog's thread, so the watcher only sets flags."""

    def __init__(self, watcher: DirectoryWatcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: ev.FileSystemEvent) -> None:
        self._watcher._on_event(event)


class DirectoryWatcher:
    """Loads config directories (or files) into a store and keeps reloading them as they change."""

    def __init__(self, paths: Sequence[Path], store: ConfigStore, options: WatchOptions | None = None) -> None:
        if not paths:
            raise ValueError("nothing to watch: give at least one directory")
        # Absolute but not resolved: a root that is a symlink may be re-pointed, and is watched as named.
        self._roots = tuple(dict.fromkeys(os.path.abspath(p) for p in paths))
        self._store = store
        self._options = options or WatchOptions()
        self._cond = threading.Condition()  # guards the scheduling state up to _stale_roots
        #: The burst of file events not yet reloaded (`meshctl.debounce`).
        self._burst = Debouncer(self._options.debounce, self._options.max_delay)
        self._last_reload = 0.0
        self._degraded = self._stopping = False
        self._retry_at: float | None = None  # when to look again at files held back as being written
        self._stale_roots: set[str] = set()
        #: Files written to since they were last closed, as file events tell (see `_note_writer`).
        self._open_writes: set[str] = set()
        self._reload_lock = threading.Lock()  # one reload at a time; guards everything below
        self._cache: Mapping[str, _Cached] = {}
        self._good: Mapping[str, FileResult] = {}
        self._deferred: Mapping[str, float] = {}
        self._reported: set[str] = set()
        self._failing: set[str] = set()
        self._observer: BaseObserver | None = None
        self._watch_error: str | None = None
        # (path as given, recursive) -> (identity and real path of the directory, watch)
        self._watches: dict[tuple[str, bool], tuple[tuple[int, int, str], ObservedWatch]] = {}
        self._aliases: Mapping[str, str] = {}  # real path watched -> path as given, for event paths
        self._sink = _EventSink(self)
        self._thread: threading.Thread | None = None

    @property
    def roots(self) -> tuple[Path, ...]:
        return tuple(Path(r) for r in self._roots)

    def start(self) -> ReloadResult:
        """Watch, load everything once (so the store is full before anything serves from it),
        then keep reloading in the background. Returns the first load's result."""
        if self._thread is not None:
            raise RuntimeError("watcher already started")
        self._stopping = False
        try:
            observer = Observer()
            observer.start()
        except OSError as exc:  # out of inotify instances, say: still serve, and look on a timer
            self._watch_error = exc.strerror or str(exc)
        else:
            self._observer, self._watch_error = observer, None
        result = self.reload_now()  # arms the watches before reading, so no edit falls in between
        self._thread = threading.Thread(target=self._run, name="meshctl-config-watcher", daemon=True)
        self._thread.start()
        return result

    def stop(self) -> None:
        """Stop watching; the store keeps what it has. Safe to call twice."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
        self._watches.clear()
        self._aliases = {}
        self._watch_error = None

    def __enter__(self) -> DirectoryWatcher:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.stop()

    def reload_now(self) -> ReloadResult:
        """Reload synchronously (SIGHUP, start-up); never raises for bad input or a failed reload.

        It is an instruction that the files are ready: a file changed a moment ago is loaded as
        it is, and only one seen changing while it was read is held back (see the module doc)."""
        return self._reload_reporting(background=False)

    def _reload_reporting(self, *, background: bool) -> ReloadResult:
        try:
            return self._reload(background)
        except Exception as exc:
            # Whatever went wrong, the store keeps what it has and the watcher keeps running.
            logger.exception("reloading config from %s failed", ", ".join(self._roots))
            message = f"reload failed, keeping the config loaded before: {exc!r}"
            failed = [FileStatus(r, (Finding(Severity.ERROR, message, r),)) for r in self._roots]
            kept = [s for s in self._store.file_status().values() if s.path not in self._roots]
            self._store.set_file_status([*kept, *failed])
            with self._cond:
                self._degraded = True  # try again after retry_interval even if no event comes
            return ReloadResult(None, tuple(f for s in failed for f in s.findings))

    # -- events and scheduling --

    def _on_event(self, event: ev.FileSystemEvent) -> None:
        paths = [self._as_given(os.fsdecode(event.src_path))]
        if event.dest_path:
            paths.append(self._as_given(os.fsdecode(event.dest_path)))
        if not any(is_relevant(p, self._roots, is_directory=event.is_directory) for p in paths):
            return
        now = time.monotonic()
        with self._cond:
            self._stale_roots.update(p for p in paths if p in self._roots)
            self._note_writer(event, paths)
            self._burst.note(now)
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

    def _open_for_writing(self, path: str) -> bool:
        with self._cond:
            return path in self._open_writes

    def _as_given(self, path: str) -> str:
        aliases = self._aliases
        real = max((r for r in aliases if is_under(path, r)), key=len, default=None)
        return path if real is None else aliases[real] + path[len(real) :]

    def _next_due(self) -> float | None:
        burst = self._burst.due()
        due: list[float] = [burst] if burst is not None else []
        if self._degraded:
            due.append(self._last_reload + self._options.retry_interval)
        if self._retry_at is not None:
            due.append(self._retry_at)
        return min(due, default=None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    due, now = self._next_due(), time.monotonic()
                    if due is not None and now >= due:
                        break
                    self._cond.wait(None if due is None else due - now)
                if self._stopping:
                    return
            try:
                self._reload_reporting(background=True)
            except Exception:  # _reload_reporting reports its own failures; this thread must outlive anything
                logger.exception("config watcher: unexpected error, still watching")

    # -- reloading --

    def _reload(self, background: bool) -> ReloadResult:
        with self._reload_lock:
            with self._cond:
                # Events from here on are not covered by this reload's reads: they schedule the next.
                self._burst.take()
                self._retry_at = None
                self._last_reload = time.monotonic()
                stale, self._stale_roots = self._stale_roots, set()
            scan = _Scan(self._cache, self._good, self._deferred, background)
            degraded = self._arm(stale, scan.status)
            # With every watch in place, file events say whether a fresh file is still open.
            scan.evented = self._observer is not None and not degraded
            for index, root in enumerate(self._roots):
                problem = root_problem(root)
                if problem is None:
                    degraded = not self._scan_root(index, root, scan) or degraded
                else:
                    degraded = True
                    scan.keep_root(index, root, problem)
            if background and scan.writing:
                scan.hold_fresh(self._options.max_delay)
            merged, duplicates = merge_files(scan.good[p] for p in scan.in_path_order() if p in scan.good)
            for finding in duplicates:
                scan.status.setdefault(finding.file or "", []).append(finding)
            files = [FileStatus(path, tuple(findings)) for path, findings in scan.status.items()]
            change = self._store.replace_all(merged, files=files)
            # Only a reload that reached the store replaces what later reloads fall back on.
            self._cache, self._good, self._deferred = scan.cache, scan.good, scan.deferred
            with self._cond:
                self._degraded, self._retry_at = degraded, scan.retry_at
                self._cond.notify_all()  # the watcher thread may be waiting for a later time
            errors = self._log_outcome(change, files)
            return ReloadResult(change, errors, scan.parsed, scan.reused, tuple(scan.deferred))

    def _scan_root(self, index: int, root: str, scan: _Scan) -> bool:
        """Read every file under `root` into `scan`; False when the root was kept as it was."""
        walk = walk_yaml([root])
        paths = list(walk.paths)
        if not paths and any(is_under(p, root) and r.configs for p, r in scan.previous_good.items()):
            # A directory that suddenly holds no YAML at all is far more often an unmounted volume
            # or a checkout half-way than a mesh meant to be empty: keep serving what it held.
            scan.keep_root(
                index,
                root,
                f"{root} holds no YAML files any more (an unmounted volume?); to serve an empty "
                "mesh on purpose, leave an empty .yaml file in it",
            )
            return False
        for finding in walk.findings:
            scan.status.setdefault(finding.file or root, []).append(finding)
        found, skipped = set(paths), walk.skipped
        # A file the walk did not list but that still exists sits in a directory that could not
        # be listed: read it directly rather than deleting what it defines. Not so in a directory
        # the walk skipped as one it had read by another path: its files were read there.
        paths += [
            p
            for p in scan.previous_good
            if is_under(p, root) and p not in found and not any(is_under(p, s) for s in skipped) and exists(p)
        ]
        for path in paths:
            if path in scan.order:
                continue  # already read under an earlier root that contains this one
            scan.order[path] = (index, walk_key(root, path))
            result = self._load(path, scan)
            if result is None:  # still being written: as the previous reload had it
                scan.keep_file(path)
                continue
            scan.status[path] = list(result.findings)
            good = result if result.ok else scan.previous_good.get(path)
            if good is not None:
                scan.good[path] = good
        for path in scan.previous_cache:
            if is_under(path, root) and path not in scan.order:
                scan.gone[path] = (index, walk_key(root, path))
        return True

    def _load(self, path: str, scan: _Scan) -> FileResult | None:
        """The file's result, or None when it is still being written (see `_hold`).

        Reuse the previous result when the file's stat signature is unchanged; re-parsing a
        tree of a few hundred files on every event would make each save cost a full load.

        A signature read within `_RACY_NS` of the file's last change proves nothing (a second
        write in the same clock tick keeps it), so such a file's bytes are compared to a digest
        of what was loaded instead: still cheap next to parsing, and it means a tree written just
        before the server started is not parsed again on the first change after it."""
        now = time.time_ns()
        cached = scan.previous_cache.get(path)
        now_signature = stat_signature(path)
        same = now_signature is not None and cached is not None and cached.signature == now_signature
        if same and cached is not None and cached.racy_digest is None:
            return scan.reuse(path, cached)
        try:
            read = read_config_file(path, self._options.load.max_file_bytes)
        except ConfigError as exc:  # not a regular file, or too big: the same until it changes
            return scan.parse(path, _Cached(now_signature, unreadable(path, exc)))
        except OSError as exc:  # may pass (a permission fixed): tried again on every reload
            return scan.parse(path, _Cached(None, unreadable(path, exc)))
        digest = hashlib.blake2b(read.data, digest_size=16).digest()
        racy = max(read.after[3], read.after[4]) >= now - _RACY_NS
        if cached is not None and cached.signature == read.after and cached.racy_digest == digest:
            return scan.reuse(path, replace(cached, racy_digest=digest if racy else None))
        if self._hold(path, read, scan, now):
            return None
        # The last load of this file, so that its unchanged documents are not loaded again.
        before = cached.result if cached is not None else FileResult(path)
        result = load_bytes(read.data, path, self._options.load, previous=before)
        # A failure of a file that changed again meanwhile is likely a half-written one's.
        if not result.ok and stat_signature(path) != read.after and self._hold(path, read, scan, now, moved=True):
            return None
        return scan.parse(path, _Cached(read.after, result, digest if racy else None))

    def _hold(self, path: str, read: FileBytes, scan: _Scan, now_ns: int, *, moved: bool = False) -> bool:
        """Whether `path` is still being written, so that it keeps this round what the previous
        reload had from it, and a reload is due later even if no event comes (the rule is in the
        module doc). Never for longer than `max_delay`: a writer that never stops still counts.
        `moved`: the file did not load and has changed since it was read."""
        debounce, max_delay = self._options.debounce, self._options.max_delay
        settle = max(debounce, self._options.settle)
        since = scan.previous_deferred.get(path, scan.started)
        if scan.started - since >= max_delay:
            return False
        changed_ns = max(read.after[3], read.after[4])
        age = (now_ns - changed_ns) / 1e9
        # Looked at again once it has been quiet for `settle` (its times only move forward).
        retry_at = scan.started + max(settle - max(age, 0.0), _MIN_RETRY)
        fresh, writing = abs(age) < settle, True
        if read.changing or moved:
            reason = "it changed while it was read" if read.changing else "it does not load and changed meanwhile"
        elif fresh and scan.background and (not scan.evented or self._open_for_writing(path)):
            reason = f"it changed less than {settle:g}s ago and is still open for writing"
        elif scan.background and not read.data and (last := scan.previous_good.get(path)) and last.configs:
            # Not a save in progress that other files wait for: it may stay empty on purpose.
            reason, retry_at, writing = "it is empty (truncated by a writer not done yet?)", since + max_delay, False
        else:
            return False
        scan.writing = scan.writing or writing
        if path not in scan.previous_deferred:
            wait = retry_at - scan.started
            # Waiting for a file to settle is what every save goes through: said at debug only.
            level = logging.DEBUG if reason.startswith("it changed less") else logging.INFO
            logger.log(level, "%s: %s; keeping what it gave before, looking again in %.2gs", path, reason, wait)
        scan.defer(path, since, retry_at)
        return True

    def _arm(self, stale: set[str], status: dict[str, list[Finding]]) -> bool:
        """Make the watches match the tree: each directory root recursively, and each root's
        parent (to see the root itself deleted, recreated or re-pointed). Returns True when some
        watch could not be set up, so the tree must be looked at on a timer instead."""
        observer = self._observer
        if observer is None:
            for root in self._roots if self._watch_error is not None else ():
                status.setdefault(root, []).append(self._watch_failure(root, self._watch_error))
            return self._watch_error is not None
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
                watch = observer.schedule(self._sink, identity[2], recursive=key[1], event_filter=_EVENT_FILTER)
            except OSError as exc:
                failed = True
                hint = " (raise fs.inotify.max_user_watches)" if exc.errno == 28 else ""
                status.setdefault(key[0], []).append(self._watch_failure(key[0], f"{exc.strerror or exc}{hint}"))
                continue
            self._watches[key] = (identity, watch)
        self._aliases = {identity[2]: key[0] for key, (identity, _) in self._watches.items()}
        return failed

    def _watch_failure(self, path: str, reason: str | None) -> Finding:
        interval = self._options.retry_interval
        return Finding(Severity.ERROR, f"cannot watch for changes: {reason}; looking every {interval:g}s instead", path)

    def _log_outcome(self, change: ConfigChange | None, files: Sequence[FileStatus]) -> tuple[Finding, ...]:
        """Log each problem once, when it appears, and say when a path's errors are gone; a
        reload that finds the same broken file again stays quiet."""
        findings = [f for s in files for f in s.findings]
        for finding in findings:
            if str(finding) not in self._reported:
                logger.log(logging.ERROR if finding.severity is Severity.ERROR else logging.WARNING, "%s", finding)
        failing = {s.path for s in files if not s.ok}
        for path in sorted(self._failing - failing):
            logger.info("%s: no errors any more", path)
        self._reported, self._failing = {str(f) for f in findings}, failing
        if change is not None:
            counts = [sum(e.kind is kind for e in change.events) for kind in EventKind]
            message = "config revision %d from %s: %d created, %d updated, %d deleted"
            logger.info(message, change.revision, ", ".join(self._roots), *counts)
        return tuple(f for f in findings if f.severity is Severity.ERROR)

