"""What a reload of config did: the value it returns (`ReloadResult`, the same from every config
source) and what the directory watcher says about it in the log (`ReloadLog`).

The log says each problem once, when it appears, and when a path's errors are gone, so a reload
that finds the same broken file again stays quiet, and a long-broken file is one line, not one
per reload. It is apart from the watcher (`meshctl.config.watcher`) because it reads no file and
decides no reload: it only keeps what was said. It logs under the watcher's name, whose lines
these are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshctl.config.findings import Finding, Severity
from meshctl.config.store import ConfigChange, ConfigStore, EventKind, FileStatus

logger = logging.getLogger("meshctl.config.watcher")


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
    #: A full pass over the tree, or a reload of the paths file events named (and `looked_at`:
    #: how many files it looked at).
    full: bool = True
    looked_at: int = 0


class ReloadLog:
    """What the reloads of `roots` into `store` have said in the log, and the paths failing now."""

    def __init__(self, roots: Sequence[str], store: ConfigStore) -> None:
        self._roots, self._store = tuple(roots), store
        self._reported: dict[str, frozenset[str]] = {}
        self._failing: set[str] = set()

    def outcome(
        self, change: ConfigChange | None, files: Mapping[str, FileStatus | None], *, full: bool
    ) -> tuple[Finding, ...]:
        """Log each problem once, when it appears, and say when a path's errors are gone; a
        reload that finds the same broken file again stays quiet. `files` are the statuses the
        reload set (None: dropped); after a full pass, every path not in it is dropped too.
        Returns every error still standing."""
        changed: dict[str, FileStatus | None] = dict(files)
        if full:
            changed.update((path, None) for path in self._reported.keys() - files.keys())
        for path, status in changed.items():
            findings = status.findings if status is not None else ()
            said = self._reported.get(path, frozenset())
            for finding in findings:
                if str(finding) not in said:
                    logger.log(logging.ERROR if finding.severity is Severity.ERROR else logging.WARNING, "%s", finding)
            if findings:
                self._reported[path] = frozenset(str(f) for f in findings)
            else:
                self._reported.pop(path, None)
        now_ok = sorted(p for p, s in changed.items() if p in self._failing and (s is None or s.ok))
        for path in now_ok:
            logger.info("%s: no errors any more", path)
        self._failing.difference_update(now_ok)
        self._failing.update(p for p, s in changed.items() if s is not None and not s.ok)
        if change is not None:
            counts = [sum(e.kind is kind for e in change.events) for kind in EventKind]
            message = "config revision %d from %s: %d created, %d updated, %d deleted"
            logger.info(message, change.revision, ", ".join(self._roots), *counts)
        if full:
            return tuple(f for s in files.values() if s is not None for f in s.findings if f.severity is Severity.ERROR)
        standing = self._store.file_status()
        return tuple(f for p in sorted(self._failing) if p in standing for f in standing[p].errors)
