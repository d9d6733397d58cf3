"""The config store: every loaded resource by (kind, namespace, name), and what changed.

Writers hand the store a whole new set of resources (`replace_all`); the store works out the
creates, updates and deletes itself and tells listeners in one `ConfigChange`. Doing the diff
here, rather than trusting callers to describe their edits, is what lets the watcher reload a
whole tree after a burst of file events and still produce a precise, minimal change.

Readers never wait: the state is an immutable `StoreView` swapped in one reference assignment, so
the asyncio server can read while the watcher thread writes, and a view read once stays
consistent (its revision matches its configs). Listeners are called with no lock held that
readers need, in revision order, one change at a time; a listener may read the store, and may
even write to it (its change is delivered after the current one has reached every listener).
"""

from __future__ import annotations

import builtins
import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from meshctl.config.findings import Finding, Severity, has_errors, sort_findings
from meshctl.config.model import Config, ConfigKey

logger = logging.getLogger("meshctl.config.store")


class EventKind(enum.Enum):
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class ConfigEvent:
    """One resource that changed: `old` is None for a create, `new` is None for a delete."""

    kind: EventKind
    key: ConfigKey
    old: Config | None
    new: Config | None


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """Everything one write changed, as one unit: a burst of file edits is one change, so
    consumers never push a half-applied multi-document file to proxies."""

    revision: int
    events: tuple[ConfigEvent, ...]

    @property
    def keys(self) -> frozenset[ConfigKey]:
        return frozenset(e.key for e in self.events)

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds touched, so a consumer can tell an endpoint-only change from a routing one."""
        return frozenset(e.key.kind for e in self.events)


@dataclass(frozen=True, slots=True)
class FileStatus:
    """What the last load said about one input path (a file, or a watched directory itself).

    A file whose status has errors is not what the store holds for it: the store keeps the file's
    last good resources, and the status keeps saying why until the file is fixed."""

    path: str
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)


def _frozen_configs(configs: Mapping[ConfigKey, Config]) -> Mapping[ConfigKey, Config]:
    return MappingProxyType(dict(configs))


@dataclass(frozen=True, slots=True)
class StoreView:
    """The store at one revision: read it as a whole and it never changes under you."""

    revision: int = 0
    configs: Mapping[ConfigKey, Config] = field(default_factory=lambda: _frozen_configs({}))
    files: Mapping[str, FileStatus] = field(default_factory=lambda: MappingProxyType({}))


Listener = Callable[[ConfigChange], None]

#: How many revisions `changed_since` can look back over (a consumer building slower than the
#: files change falls back to a full build).
_LOG_REVISIONS = 256


class ConfigStore:
    """In-memory resources with a revision that goes up by one for every change that has events."""

    def __init__(self) -> None:
        self._view = StoreView()
        self._lock = threading.Lock()  # guards writes to _view, _outbox and _listeners
        self._delivery = threading.Lock()  # one change reaches listeners at a time, in order
        self._local = threading.local()
        self._outbox: deque[ConfigChange] = deque()
        self._listeners: tuple[Listener, ...] = ()
        #: The keys each recent revision changed, oldest first (see `changed_since`).
        self._log: deque[tuple[int, frozenset[ConfigKey]]] = deque(maxlen=_LOG_REVISIONS)

    # -- reading (lock-free: a view is immutable and swapped in one assignment) --

    def view(self) -> StoreView:
        """The store at the current revision; take revision and configs from one view so they agree."""
        return self._view

    def after_delivery(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the change being handed to the listeners on this thread reached
        them all (at once when none is being handed out here). A follower's own change made in
        reply (the file registry's model, patched for a ServiceEntry) is part of the store's
        change: a consumer of both waits for the end of the delivery to see them as one."""
        if not getattr(self._local, "delivering", False):
            callback()
            return
        self._local.after.append(callback)

    @property
    def revision(self) -> int:
        return self._view.revision

    @property
    def configs(self) -> Mapping[ConfigKey, Config]:
        """A read-only mapping of every resource at the current revision."""
        return self._view.configs

    def get(self, key: ConfigKey) -> Config | None:
        return self._view.configs.get(key)

    def changed_since(self, revision: int) -> tuple[StoreView, frozenset[ConfigKey] | None]:
        """The current view, and the keys changed (created, updated or deleted) after `revision`
        up to that view's; None when the store no longer remembers that far back (a consumer
        then takes everything as changed). Lets a consumer update what it built from the view at
        `revision` instead of redoing it: a change then costs what it touched."""
        with self._lock:
            view = self._view
            if revision == view.revision:
                return view, frozenset()
            if revision > view.revision or not self._log or self._log[0][0] > revision + 1:
                return view, None
            keys: set[ConfigKey] = set()
            for logged, changed in self._log:
                if logged > revision:
                    keys.update(changed)
            return view, frozenset(keys)

    def list(self, kind: str | None = None, namespace: str | None = None) -> list[Config]:
        """Resources of a kind and/or namespace, in key order (stable output for dumps and tests)."""
        matching = [
            c
            for k, c in self._view.configs.items()
            if (kind is None or k.kind == kind) and (namespace is None or k.namespace == namespace)
        ]
        return sorted(matching, key=lambda c: c.key)

    def file_status(self) -> Mapping[str, FileStatus]:
        """What the last load said about each input path, including the ones that loaded cleanly."""
        return self._view.files

    def errors(self) -> builtins.list[Finding]:
        """Every error the last load reported, sorted; empty when every input loaded cleanly."""
        return sort_findings(f for status in self._view.files.values() for f in status.errors)

    # -- listening --

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every future change; returns a function that unsubscribes it."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            with self._lock:
                remaining = list(self._listeners)
                if listener in remaining:
                    remaining.remove(listener)
                self._listeners = tuple(remaining)

        return unsubscribe

    # -- writing --

    def replace_all(
        self, configs: Iterable[Config] | Mapping[ConfigKey, Config], *, files: Iterable[FileStatus] | None = None
    ) -> ConfigChange | None:
        """Make `configs` the whole content of the store and notify listeners of the difference.

        A resource whose content is unchanged (`Config.same_content`) is not an update: the object
        the store held is kept when it is also where it was (same file and position), so whatever
        was computed from it downstream (a registry's conversion, a digest) is reused by identity;
        otherwise the new object is kept so its source position stays current. `files`, when
        given, replaces the per-file status; None leaves it as it is. Returns the change, or None
        when nothing changed (then no listener is called and the revision stays).

        `configs` may be a mapping by key (the watcher's merge), which the store then owns."""
        new_configs: dict[ConfigKey, Config]
        if isinstance(configs, dict):
            new_configs = configs
        else:
            new_configs = {}
            for config in configs.values() if isinstance(configs, Mapping) else configs:
                if config.key in new_configs:
                    raise ValueError(
                        f"{config.key} given twice (at {new_configs[config.key].source} and {config.source})"
                    )
                new_configs[config.key] = config
        with self._lock:
            current = self._view
            events, kept = _diff(current.configs, new_configs)
            new_configs.update(kept)
            revision = current.revision + 1 if events else current.revision
            status = current.files if files is None else MappingProxyType({s.path: s for s in files})
            self._view = StoreView(revision, MappingProxyType(new_configs), status)
            change = ConfigChange(revision, events) if events else None
            if change is not None:
                self._outbox.append(change)
                self._log.append((revision, change.keys))
        if change is None:
            return None
        logger.debug(
            "config revision %d: %d created, %d updated, %d deleted",
            revision,
            *(sum(e.kind is k for e in events) for k in EventKind),
        )
        self._deliver()
        return change

    def update(
        self, configs: Mapping[ConfigKey, Config | None], *, files: Mapping[str, FileStatus | None]
    ) -> ConfigChange | None:
        """Change only the resources named in `configs` (None deletes one) and the file statuses
        named in `files` (None drops one); everything else stays as it is. The same rules as
        `replace_all`, at the cost of what is named: a writer that knows which keys it may have
        changed (the watcher, after a file event) does not pay for the whole store."""
        with self._lock:
            current = self._view
            events, kept = _diff_keys(current.configs, configs)
            new_configs = current.configs
            # A resource that moved within its file is no event, but its new place is kept.
            if any(kept.get(k, c) is not current.configs.get(k) for k, c in configs.items()):
                merged = _copy(current.configs)
                for key, config in configs.items():
                    if config is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = kept.get(key, config)
                new_configs = MappingProxyType(merged)
            status = current.files
            if any(status.get(path) != file_status for path, file_status in files.items()):
                by_path = _copy(status)
                for path, file_status in files.items():
                    if file_status is None:
                        by_path.pop(path, None)
                    else:
                        by_path[path] = file_status
                status = MappingProxyType(by_path)
            revision = current.revision + 1 if events else current.revision
            self._view = StoreView(revision, new_configs, status)
            change = ConfigChange(revision, events) if events else None
            if change is not None:
                self._outbox.append(change)
                self._log.append((revision, change.keys))
        if change is not None:
            self._deliver()
        return change

    def set_file_status(self, files: Iterable[FileStatus]) -> None:
        """Replace the per-file status without touching the resources (a failed reload, say)."""
        with self._lock:
            current = self._view
            self._view = StoreView(current.revision, current.configs, MappingProxyType({s.path: s for s in files}))

    def _deliver(self) -> None:
        if getattr(self._local, "delivering", False):
            return  # written from inside a listener: the delivery loop below picks it up next
        after: list[Callable[[], None]] = []
        with self._delivery:
            self._local.delivering = True
            self._local.after = after
            try:
                while True:
                    with self._lock:
                        if not self._outbox:
                            return
                        change = self._outbox.popleft()
                        listeners = self._listeners
                    for listener in listeners:
                        try:
                            listener(change)
                        except Exception:
                            # One broken consumer must not stop the others from seeing the change.
                            logger.exception("config listener %r failed on revision %d", listener, change.revision)
            finally:
                self._local.delivering = False
                self._local.after = []
                for callback in after:
                    try:
                        callback()
                    except Exception:
                        logger.exception("config delivery callback %r failed", callback)


def _diff(
    old: Mapping[ConfigKey, Config], new: Mapping[ConfigKey, Config]
) -> tuple[tuple[ConfigEvent, ...], dict[ConfigKey, Config]]:
    """The events from `old` to `new`, and the old objects to keep in place of new ones that
    are the same resource in the same place.

    Configs compare by identity (`eq=False`): a tree of a hundred thousand resources where one
    file changed costs an identity check per resource (a lookup and an `is`: half the time of a
    set difference of the items, which hashes every pair), and a content comparison for that
    file's resources only. Deletions are looked for only when the counts say there are some."""
    events: list[ConfigEvent] = []
    kept: dict[ConfigKey, Config] = {}
    created = 0
    find = old.get
    for key, after in new.items():
        before = find(key)
        if before is after:
            continue
        if before is None:
            created += 1
            events.append(ConfigEvent(EventKind.CREATED, key, None, after))
        elif not after.same_content(before):
            events.append(ConfigEvent(EventKind.UPDATED, key, before, after))
        elif before.source == after.source and before.api_version == after.api_version:
            kept[key] = before
    if len(old) != len(new) - created:
        events.extend(ConfigEvent(EventKind.DELETED, key, old[key], None) for key in old.keys() - new.keys())
    events.sort(key=lambda e: e.key)
    return tuple(events), kept


_K = TypeVar("_K")
_V = TypeVar("_V")


def _copy(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    """A dict of `mapping`; a view's underlying dict is copied whole (a fast copy in C, where
    `dict(view)` would look every key up through the view)."""
    return mapping.copy() if isinstance(mapping, MappingProxyType) else dict(mapping)


def _diff_keys(
    old: Mapping[ConfigKey, Config], new: Mapping[ConfigKey, Config | None]
) -> tuple[tuple[ConfigEvent, ...], dict[ConfigKey, Config]]:
    """`_diff` over the keys of `new` only, where None means the key goes."""
    events: list[ConfigEvent] = []
    kept: dict[ConfigKey, Config] = {}
    for key, after in new.items():
        before = old.get(key)
        if before is after:
            continue
        if after is None:
            events.append(ConfigEvent(EventKind.DELETED, key, before, None))
        elif before is None:
            events.append(ConfigEvent(EventKind.CREATED, key, None, after))
        elif not after.same_content(before):
            events.append(ConfigEvent(EventKind.UPDATED, key, before, after))
        elif before.source == after.source and before.api_version == after.api_version:
            kept[key] = before
    events.sort(key=lambda e: e.key)
    return tuple(events), kept
