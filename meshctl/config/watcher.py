"""Keep the store in step with config directories on disk.

File events name the paths to read again, and nothing more is trusted of them. Editors save by
writing a temporary file and renaming it over the original, tools rewrite many files at once,
inotify drops events when its queue overflows, and a watched directory can be deleted and
recreated. So events are debounced: the reload runs once things have been quiet for `debounce`
seconds, or `max_delay` seconds after the first event at the latest, so a writer that never stops
still gets its changes applied (when to reload, and what, is decided in `reload_schedule`). A
reload after file events reads only the files they named (plus the files held back as still
being written, and the files that are links, since what a link leads to can change with no event
about its name), and updates the store with what those files change (`ConfigStore.update`), so
an edit costs the same in a tree of ten files or of twenty thousand. A burst of edits is one
change.

A full pass walks the whole tree and re-reads every file whose stat signature changed, and
hands the store the complete new set (`replace_all`). It runs at start, on `reload_now`
(SIGHUP), when events cannot say what changed (a directory created, deleted or renamed, a root
itself or a ConfigMap's `..data` link swapped, a path in a directory the last walk did not list
or where `.meshctlignore` rules hold, a root about to be left with no file), when watches are
lost or cannot be set up (then on a timer, every `retry_interval`), when the inotify layer warns
(its queue overflowed: events were lost), and every `resync_period` seconds (0: never), so a
missed event costs a delay, never a wrong mesh: a file changed through a path no watch sees (a
link to a file outside the tree, a bind mount) is picked up by the next full pass.

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
through a symlink inside the tree is read but not watched (re-point the link, reload, or wait for
the periodic full pass).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TypeVar

from watchdog import events as ev
from watchdog.observers import Observer

from meshctl.config.files import FileBytes, read_config_file, walk_yaml
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import FileResult, LoadOptions, load_bytes, merge_files, unreadable
from meshctl.config.merged import MergedFiles
from meshctl.config.model import Config
from meshctl.config.parse_cache import JOIN_TIMEOUT, ParseCache
from meshctl.config.paths import (
    exists,
    is_relevant,
    is_under,
    root_problem,
    stat_signature,
    walk_key,
)
from meshctl.config.reload_report import ReloadLog, ReloadResult
from meshctl.config.reload_schedule import ReloadSchedule
from meshctl.config.scan import Cached, Position, Scan
from meshctl.config.store import ConfigStore, FileStatus
from meshctl.config.watches import Watches
from meshctl.errors import ConfigError

logger = logging.getLogger("meshctl.config.watcher")

_T = TypeVar("_T")

#: A file changed this recently may change again within the file system's timestamp granularity
#: (1-2 s on some file systems) without its signature changing, so it is re-read next time.
_RACY_NS: Final = 2_000_000_000


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """Timing and loading settings for a `DirectoryWatcher`, passed in, never global."""

    debounce: float = 0.1
    max_delay: float = 10.0
    #: A file changed less than this long ago may still be being written (see the module doc).
    settle: float = 1.0
    #: While a watched path is missing or cannot be watched, look at it again this often.
    retry_interval: float = 1.0
    #: A full pass over the tree runs this often even when events say nothing changed (0: never).
    resync_period: float = 300.0
    load: LoadOptions = field(default_factory=LoadOptions)

    def __post_init__(self) -> None:
        if (
            self.debounce < 0
            or self.retry_interval <= 0
            or self.max_delay < self.debounce
            or not self.settle >= 0
            or not self.resync_period >= 0
        ):
            raise ValueError(
                f"invalid watch timing: debounce={self.debounce}s, max_delay={self.max_delay}s,"
                f" retry_interval={self.retry_interval}s, settle={self.settle}s, resync_period={self.resync_period}s"
                " (need 0 <= debounce <= max_delay, retry > 0, settle >= 0, resync_period >= 0)"
            )


class _EventSink(ev.FileSystemEventHandler):
    """Forwards watchdog's events; runs on watchdog's thread, so the watcher only sets flags."""

    def __init__(self, watcher: DirectoryWatcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: ev.FileSystemEvent) -> None:
        self._watcher._on_event(event)


def _lay_over(kept: dict[str, _T], new: Mapping[str, _T], path: str) -> None:
    """`kept[path]` as a reload of some paths left it: what it found, or nothing."""
    if path in new:
        kept[path] = new[path]
    else:
        kept.pop(path, None)


class DirectoryWatcher:
    """Loads config directories (or files) into a store and keeps reloading them as they change."""

    def __init__(
        self,
        paths: Sequence[Path],
        store: ConfigStore,
        options: WatchOptions | None = None,
        parse_cache: ParseCache | None = None,
    ) -> None:
        if not paths:
            raise ValueError("nothing to watch: give at least one directory")
        # Absolute but not resolved: a root that is a symlink may be re-pointed, and is watched as named.
        self._roots = tuple(dict.fromkeys(os.path.abspath(p) for p in paths))
        self._store = store
        self._options = options or WatchOptions()
        #: The parses of an earlier run, by text (`meshctl.config.parse_cache`); rewritten after full passes.
        self._parse_cache = parse_cache
        o = self._options
        self._schedule = ReloadSchedule(
            self._roots,
            debounce=o.debounce,
            max_delay=o.max_delay,
            retry_interval=o.retry_interval,
            resync_period=o.resync_period,
        )
        self._reload_lock = threading.Lock()  # one reload at a time; guards everything below
        self._cache: dict[str, Cached] = {}
        self._good: dict[str, FileResult] = {}
        self._deferred: Mapping[str, float] = {}
        #: What the last full pass saw, kept up to date by the reloads of named paths: each
        #: file's place, each path's own findings (duplicates apart), the walk (`Scan.dirs`),
        #: and the merge (None until a full pass has reached the store).
        self._order: dict[str, Position] = {}
        self._own: dict[str, list[Finding]] = {}
        self._dirs: dict[str, int] = {}
        self._links: set[str] = set()
        self._counts: list[int] = []
        self._merged: MergedFiles | None = None
        self._log = ReloadLog(self._roots, store)
        self._watches = Watches(self._roots, _EventSink(self), self._schedule.note_lost_events, o.retry_interval)
        self._thread: threading.Thread | None = None

    @property
    def roots(self) -> tuple[Path, ...]:
        return tuple(Path(r) for r in self._roots)

    def start(self) -> ReloadResult:
        """Watch, load everything once (so the store is full before anything serves from it),
        then keep reloading in the background. Returns the first load's result."""
        if self._thread is not None:
            raise RuntimeError("watcher already started")
        self._schedule.start()
        self._watches.open(Observer)
        result = self.reload_now()  # arms the watches before reading, so no edit falls in between
        self._thread = threading.Thread(target=self._run, name="meshctl-config-watcher", daemon=True)
        self._thread.start()
        return result

    def stop(self) -> None:
        """Stop watching; the store keeps what it has. Safe to call twice."""
        self._schedule.stop()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._watches.close()
        if self._parse_cache is not None:
            self._parse_cache.join(JOIN_TIMEOUT)

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
            self._schedule.failed()
            return ReloadResult(None, tuple(f for s in failed for f in s.findings))

    # -- events --

    def _on_event(self, event: ev.FileSystemEvent) -> None:
        paths = [self._watches.as_given(os.fsdecode(event.src_path))]
        if event.dest_path:
            paths.append(self._watches.as_given(os.fsdecode(event.dest_path)))
        relevant = [p for p in paths if is_relevant(p, self._roots, is_directory=event.is_directory)]
        if not relevant:
            return
        self._schedule.note_event(event, paths, relevant)

    def _run(self) -> None:
        while self._schedule.wait():
            try:
                self._reload_reporting(background=True)
            except Exception:  # _reload_reporting reports its own failures; this thread must outlive anything
                logger.exception("config watcher: unexpected error, still watching")

    # -- reloading --

    def _reload(self, background: bool) -> ReloadResult:
        with self._reload_lock:
            unknown = self._watches.observer is None or self._merged is None
            reload = self._schedule.begin(background=background, full=unknown)
            if not reload.full:
                result = self._reload_paths(reload.dirty)
                if result is not None:
                    return result
            self._schedule.full_pass_started(reload.now)
            return self._reload_all(background, reload.stale)

    def _reload_all(self, background: bool, stale: set[str]) -> ReloadResult:
        """A full pass: walk every root, re-read what changed, hand the store everything."""
        scan = Scan(self._cache, self._good, self._deferred, background)
        degraded = self._watches.arm(stale, scan.status)
        # With every watch in place, file events say whether a fresh file is still open.
        scan.evented = self._watches.observer is not None and not degraded
        scan.counts = [0] * len(self._roots)
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
        merge = MergedFiles(merged, duplicates)
        files = {
            path: FileStatus(path, (*scan.status.get(path, ()), *merge.duplicates.get(path, ())))
            for path in (*scan.status, *merge.duplicates)
        }
        change = self._store.replace_all(dict(merged), files=files.values())
        # Only a reload that reached the store replaces what later reloads fall back on.
        self._cache, self._good, self._deferred = scan.cache, scan.good, scan.deferred
        self._order, self._own, self._merged = scan.order, scan.status, merge
        self._dirs, self._links, self._counts = scan.dirs, scan.links, scan.counts
        if self._parse_cache is not None:
            self._parse_cache.settle(scan.order)
        self._schedule.reloaded(scan.retry_at, degraded=degraded)
        errors = self._log.outcome(change, files, full=True)
        return ReloadResult(change, errors, scan.parsed, scan.reused, tuple(scan.deferred), True, len(scan.order))

    def _reload_paths(self, dirty: set[str]) -> ReloadResult | None:
        """A reload of the paths events named, the files held back as being written and the
        linked files, laid over what the last reloads kept; None when only a full pass can tell
        what changed (a path in a directory the last walk did not list, a link to a directory,
        a root about to be left without files)."""
        merged = self._merged
        if merged is None:
            return None
        scan = Scan(self._cache, self._good, self._deferred, True)
        scan.evented = True
        looked = sorted(dirty | self._deferred.keys() | self._links)
        for path in looked:
            index = self._dirs.get(os.path.dirname(path))
            if index is None:
                return None
            try:
                mode: int | None = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                if path in self._order:
                    scan.gone[path] = self._order[path]
                continue
            except OSError:
                mode = None  # there but not to be looked at: loading it says why
            if mode is not None and (stat.S_ISDIR(mode) or (stat.S_ISLNK(mode) and os.path.isdir(path))):
                return None
            if mode is not None and stat.S_ISLNK(mode):
                scan.links.add(path)
            scan.order[path] = (index, walk_key(self._roots[index], path))
            self._read(path, scan)
        if scan.writing:
            scan.hold_fresh(self._options.max_delay)
        counts = list(self._counts)
        for path in looked:
            if (path in scan.order) != (path in self._order):
                counts = self._count(counts, path, 1 if path in scan.order else -1)
        if any(after == 0 < before for before, after in zip(self._counts, counts, strict=True)):
            return None
        before = {p: self._good[p].configs for p in looked if p in self._good and scan.good.get(p) is not self._good[p]}
        after = {p: scan.good[p].configs for p in looked if p in scan.good and scan.good[p] is not self._good.get(p)}
        order = self._order
        plan = merged.plan(before, after, self._configs_of, lambda p: scan.order[p] if p in scan.order else order[p])
        files: dict[str, FileStatus | None] = {}
        for path in {*looked, *plan.duplicates}:
            own = scan.status.get(path) if path in looked else self._own.get(path)
            dups = plan.duplicates[path] if path in plan.duplicates else merged.duplicates.get(path, [])
            files[path] = FileStatus(path, (*(own or ()), *dups)) if own is not None or dups else None
        change = self._store.update(plan.configs, files=files)
        merged.adopt(plan)
        for path in looked:
            _lay_over(self._cache, scan.cache, path)
            _lay_over(self._good, scan.good, path)
            _lay_over(self._order, scan.order, path)
            _lay_over(self._own, scan.status, path)
            if path in scan.links:
                self._links.add(path)
            else:
                self._links.discard(path)
        self._deferred, self._counts = scan.deferred, counts
        self._schedule.reloaded(scan.retry_at)
        errors = self._log.outcome(change, files, full=False)
        return ReloadResult(change, errors, scan.parsed, scan.reused, tuple(scan.deferred), False, len(looked))

    def _configs_of(self, path: str) -> Sequence[Config]:
        good = self._good.get(path)
        return good.configs if good is not None else ()

    def _count(self, counts: list[int], path: str, delta: int) -> list[int]:
        """How many files each root holds once `path` comes (1) or goes (-1)."""
        return [n + delta if is_under(path, root) else n for n, root in zip(counts, self._roots, strict=True)]

    def _scan_root(self, index: int, root: str, scan: Scan) -> bool:
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
        scan.counts[index] = len(paths)
        scan.links.update(walk.links)
        for directory in walk.directories:
            scan.dirs.setdefault(directory, index)
        for path in paths:
            if path in scan.order:
                continue  # already read under an earlier root that contains this one
            scan.order[path] = (index, walk_key(root, path))
            self._read(path, scan)
        for path in scan.previous_cache:
            if is_under(path, root) and path not in scan.order:
                scan.gone[path] = (index, walk_key(root, path))
        return True

    def _read(self, path: str, scan: Scan) -> None:
        """Load `path` (placed in `scan.order` already) into `scan`, or keep what it had."""
        result = self._load(path, scan)
        if result is None:  # still being written: as the previous reload had it
            scan.keep_file(path)
            return
        scan.status[path] = list(result.findings)
        good = result if result.ok else scan.previous_good.get(path)
        if good is not None:
            scan.good[path] = good

    def _load(self, path: str, scan: Scan) -> FileResult | None:
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
            return scan.parse(path, Cached(now_signature, unreadable(path, exc)))
        except OSError as exc:  # may pass (a permission fixed): tried again on every reload
            return scan.parse(path, Cached(None, unreadable(path, exc)))
        digest = hashlib.blake2b(read.data, digest_size=16).digest()
        racy = max(read.after[3], read.after[4]) >= now - _RACY_NS
        if cached is not None and cached.signature == read.after and cached.racy_digest == digest:
            return scan.reuse(path, replace(cached, racy_digest=digest if racy else None))
        if self._hold(path, read, scan, now):
            return None
        # The last load of this file, so that its unchanged documents are not loaded again.
        before = cached.result if cached is not None else FileResult(path)
        result = load_bytes(read.data, path, self._options.load, previous=before, parse_cache=self._parse_cache)
        # A failure of a file that changed again meanwhile is likely a half-written one's.
        if not result.ok and stat_signature(path) != read.after and self._hold(path, read, scan, now, moved=True):
            return None
        return scan.parse(path, Cached(read.after, result, digest if racy else None))

    def _hold(self, path: str, read: FileBytes, scan: Scan, now_ns: int, *, moved: bool = False) -> bool:
        """`Scan.hold` with this watcher's timing and what its file events say of writers."""
        settle = max(self._options.debounce, self._options.settle)
        max_delay, writing = self._options.max_delay, self._schedule.open_for_writing
        return scan.hold(path, read, now_ns, settle=settle, max_delay=max_delay, open_for_writing=writing, moved=moved)
