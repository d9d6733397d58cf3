"""One reload's working state, and what the watcher keeps of a file between reloads.

A reload reads files into a `Scan`, which the watcher adopts only once the store has the result,
so a reload that fails half-way cannot make the next one forget a file's last good contents. A
reload of the whole tree fills it for every file; a reload of the paths file events named fills
it for those paths only, and the watcher lays it over what it kept (`meshctl.config.watcher`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from meshctl.config.files import FileBytes, Signature
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import FileResult
from meshctl.config.paths import is_under, walk_key

logger = logging.getLogger("meshctl.config.watcher")

#: A file held back as still being written is looked at again this soon at the earliest.
_MIN_RETRY: Final = 0.05

#: Where a file sorts: the index of its root, then its place in a walk of that root (`walk_key`).
Position = tuple[int, tuple[tuple[int, str], ...]]


@dataclass(frozen=True, slots=True)
class Cached:
    #: (inode, device, size, mtime, ctime); None when the file could not be read.
    signature: Signature | None
    result: FileResult
    #: A digest of the bytes loaded, kept while the file changed too recently for its signature
    #: alone to prove it unchanged (a write in the same clock tick keeps size and times).
    racy_digest: bytes | None = None


class Scan:
    """One reload's working state; the watcher adopts it only once the store has the result, so
    a reload that fails half-way cannot make the next one forget a file's last good contents."""

    def __init__(
        self,
        cache: Mapping[str, Cached],
        good: Mapping[str, FileResult],
        deferred: Mapping[str, float],
        background: bool,
    ) -> None:
        self.previous_cache, self.previous_good, self.previous_deferred = cache, good, deferred
        self.background = background
        self.started = time.monotonic()
        self.cache: dict[str, Cached] = {}
        self.good: dict[str, FileResult] = {}
        self.status: dict[str, list[Finding]] = {}
        self.order: dict[str, Position] = {}
        self.parsed = self.reused = 0
        #: Files held back as still being written -> when they were first held (monotonic).
        self.deferred: dict[str, float] = {}
        self.retry_at: float | None = None
        #: Files loaded afresh this round, and whether some file was held as being written now.
        self.fresh: list[str] = []
        self.writing = False
        self.evented = False
        #: Files the previous reload had that this one did not find -> where they sorted.
        self.gone: dict[str, Position] = {}
        #: What a walk of the whole tree saw (`files.Walk`): the directories it listed (-> the
        #: index of the root that listed them first), the files that are links, and how many
        #: files each root holds. A reload of named paths only keeps the last walk's.
        self.dirs: dict[str, int] = {}
        self.links: set[str] = set()
        self.counts: list[int] = []

    def reuse(self, path: str, cached: Cached) -> FileResult:
        self.cache[path] = cached
        self.reused += 1
        return cached.result

    def parse(self, path: str, cached: Cached) -> FileResult:
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

    def hold(
        self,
        path: str,
        read: FileBytes,
        now_ns: int,
        *,
        settle: float,
        max_delay: float,
        open_for_writing: Callable[[str], bool],
        moved: bool = False,
    ) -> bool:
        """Whether `path` is still being written, so that it keeps this round what the previous
        reload had from it, and a reload is due later even if no event comes (the rule is in the
        module doc). Never for longer than `max_delay`: a writer that never stops still counts.
        `moved`: the file did not load and has changed since it was read; `settle`: how long a
        file must have been quiet to count as written (at least the debounce); `open_for_writing`:
        whether file events say a writer still has `path` open."""
        scan = self
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
        elif fresh and scan.background and (not scan.evented or open_for_writing(path)):
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
        self.defer(path, since, retry_at)
        return True

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
