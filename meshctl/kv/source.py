"""Keep the store in step with a Consul KV prefix: the same files, from another front end.

Teams that already run Consul keep their mesh's YAML there (`meshctl kv push` writes it). Each
key under the prefix is one file, named by the rest of its key (`mesh/bookinfo/traffic.yaml` under
`mesh` is `bookinfo/traffic.yaml`), and goes through the same loader, validation and per-file
last-good rule as a file of a watched directory (`meshctl.config.watcher`):

- one blocking query on the prefix's key names (`GET /v1/kv/PREFIX/?keys`) follows the prefix
  with Consul's rules (`meshctl.registry.consul_watch`: index reset when it goes back, at least 1, a
  rate limit, backoff); on each answer the values are read in one request (`?recurse`,
  `read_all_values`, one KV revision as Consul answers it) when the prefix holds nothing but
  config and folder keys, else the YAML keys one by one (`read_values`), a read that counts only
  when no key changed after the listing's index. Either way each answer is one KV revision and
  becomes at most one store revision: a `kv push`, one Consul transaction, reaches proxies as
  one change;
- only the keys whose ModifyIndex moved are loaded again, and the store is handed what they,
  and the keys that came or went, change (`ConfigStore.update`, through the merge of the keys
  kept from answer to answer, `MergedFiles`, as the directory watcher does for the files that
  events name); the first answer, and the first after an outage or an emptied prefix, are
  applied whole (`replace_all`);
- a key whose value does not load keeps its last good resources, and its error stays in the
  store's file status until it is fixed; a key that never loaded contributes nothing; a deleted
  key's resources are deleted;
- a prefix that suddenly holds no keys at all deletes nothing (as a vanished directory: far more
  often a wrong token or a restore half-way than a mesh meant to be empty); to serve an empty
  mesh on purpose, leave an empty `.yaml` key under the prefix;
- while Consul cannot be read everything is kept, the error is reported in the file status of
  the prefix, and the query carries on from its index until Consul answers again.

Only keys ending in `.yaml` or `.yml` are read, as only such files are in a directory; folder
keys (ending in `/`) and other keys are ignored, and their values are never fetched: a prefix
shared with other data (blobs, locks) costs its key names, not its bytes (but then a request per
YAML key on each change, where a prefix of config alone costs two requests). Each value is bounded
as a file is (`LoadOptions.max_file_bytes`: a key over it is that key's error and keeps its last
good resources), and all of them together by `MAX_TOTAL_BYTES` (over it, the read fails as
when Consul cannot be read: everything is kept).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import quote

from meshctl.config.files import YAML_SUFFIXES
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import FileResult, LoadOptions, load_bytes, merge_files
from meshctl.config.merged import MergedFiles
from meshctl.config.model import Config
from meshctl.config.reload_report import ReloadResult
from meshctl.config.scan import Position
from meshctl.config.store import ConfigChange, ConfigStore, EventKind, FileStatus
from meshctl.errors import RegistryError, UsageError
from meshctl.registry.consul_http import OVERSIZED, ConsulConnection, ConsulOptions, ConsulReply
from meshctl.registry.consul_watch import BlockingQuery

logger = logging.getLogger("meshctl.kv.source")

#: How long `start` waits for Consul's first answer before serving without it.
FIRST_READ_TIMEOUT: Final = 10.0
#: The YAML values of one prefix, all together (Consul itself takes values of 512 KiB at most).
MAX_TOTAL_BYTES: Final = 256 * 1024 * 1024
#: An answer of `?recurse` holding `MAX_TOTAL_BYTES` of values: base64 takes 4 bytes for 3, and
#: each entry's other fields some more.
_ANSWER_LIMIT: Final = MAX_TOTAL_BYTES * 4 // 3 + 64 * 1024 * 1024
#: Reads of a prefix that keeps changing while its values are read, before giving up (`kv pull`).
_READ_ATTEMPTS: Final = 5


def normalize_prefix(prefix: str) -> str:
    """`prefix` as a KV folder: no leading slash, one trailing slash (`mesh` -> `mesh/`), so that
    `mesh` never also matches `mesh-old/...`; the empty prefix (the whole KV store) stays empty."""
    text = prefix.strip().strip("/")
    if any(part in ("", ".", "..") for part in text.split("/")) and text:
        raise UsageError(f"invalid consul KV prefix {prefix!r}: use a path such as meshctl/mesh")
    return f"{text}/" if text else ""


def kv_path(key: str) -> str:
    return f"/v1/kv/{quote(key, safe='/')}"


def is_config_key(name: str) -> bool:
    """Whether a key (relative to the prefix) is read as a file: a YAML name, not hidden, as the
    directory walk has it."""
    parts = name.split("/")
    return bool(name) and name.endswith(YAML_SUFFIXES) and not any(p.startswith(".") or not p for p in parts)


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One key of the prefix: its name relative to the prefix, value and ModifyIndex."""

    name: str
    value: bytes
    modify_index: int
    #: Why the value was not read (over the size limit): the key then keeps its last good config.
    refused: str | None = None


def parse_entries(data: object, prefix: str) -> dict[str, KvEntry]:
    """Consul's JSON for `GET /v1/kv/PREFIX?recurse` (None for a 404) as entries by name; keys
    that are not config files (`is_config_key`) are left out."""
    if data is None:
        return {}
    if not isinstance(data, list):
        raise RegistryError(f"GET {kv_path(prefix)}: expected a list, got {type(data).__name__}")
    entries: dict[str, KvEntry] = {}
    for item in data:
        if not isinstance(item, Mapping) or not isinstance(item.get("Key"), str):
            raise RegistryError(f"GET {kv_path(prefix)}: an entry without a Key")
        key: str = item["Key"]
        name = key[len(prefix) :] if key.startswith(prefix) else ""
        if not is_config_key(name):
            continue
        raw = item.get("Value")
        try:
            value = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        except (binascii.Error, ValueError) as exc:
            raise RegistryError(f"consul KV {key}: Value is not base64: {exc}") from exc
        index = item.get("ModifyIndex")
        entries[name] = KvEntry(name, value, index if isinstance(index, int) else 0)
    return entries


def config_names(data: object, prefix: str) -> list[str]:
    """Consul's JSON for `GET /v1/kv/PREFIX?keys` (None for a 404) as the names, relative to
    the prefix, of the keys read as files (`is_config_key`), sorted."""
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(k, str) for k in data):
        raise RegistryError(f"GET {kv_path(prefix)}?keys: expected a list of key names")
    return sorted(k[len(prefix) :] for k in data if k.startswith(prefix) and is_config_key(k[len(prefix) :]))


def only_config(data: object, prefix: str) -> bool:
    """Whether a listing (`?keys`) holds nothing under `prefix` but config keys and folder keys,
    so that reading the prefix whole fetches no other data's bytes."""
    if not isinstance(data, list):
        return True
    return all(
        not isinstance(k, str) or not k.startswith(prefix) or k.endswith("/") or is_config_key(k[len(prefix) :])
        for k in data
    )


def read_all_values(
    conn: ConsulConnection, options: ConsulOptions, prefix: str, *, max_value_bytes: int
) -> dict[str, KvEntry]:
    """Every config key under `prefix` with its value and ModifyIndex, in one request
    (`?recurse`), which Consul answers from one revision. A value over `max_value_bytes` is
    that key's refusal; RegistryError for an answer over what `MAX_TOTAL_BYTES` of values
    takes, or a failed read."""
    path = kv_path(prefix)
    params = {"recurse": "true"} | ({"dc": options.datacenter} if options.datacenter else {})
    try:
        reply = conn.get(path, params, options.request_timeout, limit=_ANSWER_LIMIT)
    except (OSError, http.client.HTTPException) as exc:
        raise RegistryError(f"cannot read consul KV at {options.url}: {exc}") from exc
    if reply.status == OVERSIZED:
        raise RegistryError(f"the values under consul KV {prefix or '/'} are over {MAX_TOTAL_BYTES} bytes in all")
    entries = parse_entries(None if reply.status == 404 else reply.json(path), prefix)
    message = f"value is over the {max_value_bytes}-byte limit for a config file"
    for name, entry in entries.items():
        if len(entry.value) > max_value_bytes:
            entries[name] = KvEntry(name, b"", entry.modify_index, refused=message)
    return entries


def read_values(
    conn: ConsulConnection,
    options: ConsulOptions,
    prefix: str,
    names: Sequence[str],
    index: int,
    *,
    max_value_bytes: int,
) -> dict[str, KvEntry] | None:
    """The values of the keys `names` (relative to `prefix`) as of the listing at `index`, read
    one by one; None when the prefix moved on meanwhile (a key changed or went away after
    `index`), since the values would then mix two revisions. A value over `max_value_bytes` is
    not read: its entry says so (`refused`). RegistryError for values over `MAX_TOTAL_BYTES` in
    all, or a failed read."""
    params = {"dc": options.datacenter} if options.datacenter else {}
    # base64 takes 4 bytes for 3, and the entry's other fields some more.
    limit = max_value_bytes * 4 // 3 + 4096
    entries: dict[str, KvEntry] = {}
    total = 0
    for name in names:
        path = kv_path(prefix + name)
        try:
            reply = conn.get(path, params, options.request_timeout, limit=limit)
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"cannot read consul KV at {options.url}: {exc}") from exc
        if reply.status == OVERSIZED:
            message = f"value is over the {max_value_bytes}-byte limit for a config file"
            entries[name] = KvEntry(name, b"", 0, refused=message)
            continue
        if reply.status == 404:
            return None  # deleted after the listing
        found = parse_entries(reply.json(path), prefix).get(name)
        if found is None or found.modify_index > index:
            return None
        total += len(found.value)
        if total > MAX_TOTAL_BYTES:
            raise RegistryError(
                f"the YAML values under consul KV {prefix or '/'} are over {MAX_TOTAL_BYTES} bytes in all"
            )
        entries[name] = found
    return entries


def read_prefix(
    conn: ConsulConnection, options: ConsulOptions, prefix: str, max_value_bytes: int
) -> dict[str, KvEntry]:
    """The config keys under `prefix` now, one revision of them, for the CLI (`kv pull`, `kv push`)."""
    path = kv_path(prefix)
    params = {"keys": "true"} | ({"dc": options.datacenter} if options.datacenter else {})
    for _ in range(_READ_ATTEMPTS):
        try:
            reply = conn.get(path, params, options.request_timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"cannot read consul KV at {options.url}: {exc}") from exc
        names = config_names(None if reply.status == 404 else reply.json(path), prefix)
        entries = read_values(conn, options, prefix, names, reply.index, max_value_bytes=max_value_bytes)
        if entries is None:
            continue
        for entry in entries.values():
            if entry.refused is not None:
                raise RegistryError(f"consul KV {prefix}{entry.name}: {entry.refused}")
        return entries
    raise RegistryError(f"consul KV {prefix or '/'} kept changing while it was read; try again")


@dataclass(frozen=True, slots=True)
class KvLocation:
    """Where the config lives: a Consul and a KV prefix in it."""

    consul: ConsulOptions
    prefix: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))

    @property
    def display(self) -> str:
        """The prefix as findings and logs name it."""
        return f"consul-kv:{self.prefix or '/'}"


@dataclass(slots=True)
class _State:
    """What the last applied answer left: each key's last load (by ModifyIndex) and last good
    load, and the merge of the good ones (None: the next answer is applied whole)."""

    loaded: dict[str, tuple[int, FileResult]] = field(default_factory=dict)
    good: dict[str, FileResult] = field(default_factory=dict)
    errors: tuple[Finding, ...] = ()
    merged: MergedFiles | None = None


def _position(name: str) -> Position:
    """Where a key sorts in the merge: by name, as `merge_files` is given them."""
    return (0, ((0, name),))


class KvWatcher:
    """Loads a Consul KV prefix into a store and follows it (the rules are in the module doc)."""

    def __init__(self, location: KvLocation, store: ConfigStore, load: LoadOptions | None = None) -> None:
        self._location = location
        self._store = store
        self._load = load or LoadOptions()
        self._lock = threading.Lock()  # one answer applied at a time; guards _state
        self._state = _State()
        self._outage: str | None = None
        self._outage_seen = False
        self._reported: set[str] = set()
        self._first = threading.Event()  # answered or failed once
        self._synced = threading.Event()  # answered once
        self._query = BlockingQuery(
            location.consul,
            kv_path(location.prefix),
            self._on_data,
            self._on_error,
            params={"keys": "true"},
            missing_is_none=True,
        )
        #: Reads the values, on the query's thread, between two of its answers.
        self._values = ConsulConnection(location.consul)

    @property
    def location(self) -> KvLocation:
        return self._location

    def start(self, timeout: float = FIRST_READ_TIMEOUT) -> ReloadResult:
        """Start following; wait (up to `timeout`) for Consul's first answer or first failure, and
        return the errors standing then, as the directory watcher's first reload does."""
        self._query.start()
        self._first.wait(timeout)
        return self.reload_now()

    def stop(self, timeout: float = 5.0) -> bool:
        self._query.stop()
        self._values.abort()
        stopped = self._query.join(timeout)
        self._values.close()
        return stopped

    def synced(self) -> bool:
        """Whether Consul has answered once (the store holds the prefix, not an empty start)."""
        return self._synced.is_set()

    def reload_now(self) -> ReloadResult:
        """Nothing to re-read (the blocking query already follows every change): the errors
        standing now, for SIGHUP's log."""
        with self._lock:
            return ReloadResult(None, self._errors_now())

    def _errors_now(self) -> tuple[Finding, ...]:
        return self._state.errors + ((self._outage_finding(),) if self._outage else ())

    def _outage_finding(self) -> Finding:
        count = len({c.key for r in self._state.good.values() for c in r.configs})
        message = f"cannot read consul KV: {self._outage}; keeping the resources last read from it ({count})"
        return Finding(Severity.ERROR, message, self._location.display)

    def _on_error(self, message: str) -> None:
        with self._lock:
            first = self._outage is None
            self._outage = message
            self._outage_seen = True  # its status is the prefix's: the next answer applies whole
            self._store.set_file_status(self._statuses(self._state.errors, extra=(self._outage_finding(),)))
        if first:
            logger.warning("consul KV %s is failing (%s): keeping its last config", self._location.display, message)
        self._first.set()

    def _on_data(self, data: object, reply: ConsulReply) -> None:
        location = self._location
        names = config_names(data, location.prefix)
        conn, options, prefix, limit = self._values, location.consul, location.prefix, self._load.max_file_bytes
        entries: Mapping[str, KvEntry] | None
        if names and only_config(data, prefix):
            entries = read_all_values(conn, options, prefix, max_value_bytes=limit)
        else:
            entries = read_values(conn, options, prefix, names, reply.index, max_value_bytes=limit)
        if entries is None:  # the prefix moved on while it was read: the next answer comes at once
            return
        with self._lock:
            if self._outage is not None:
                logger.info("consul KV %s answers again", self._location.display)
            self._outage = None
            change = self._apply(entries, reply.index)
        self._synced.set()
        self._first.set()
        if change is not None:
            counts = [sum(e.kind is kind for e in change.events) for kind in EventKind]
            message = "config revision %d from %s (index %d): %d created, %d updated, %d deleted"
            logger.info(message, change.revision, self._location.display, reply.index, *counts)

    def _apply(self, entries: Mapping[str, KvEntry], index: int) -> ConfigChange | None:
        previous = self._state
        if not entries and any(r.configs for r in previous.good.values()):
            count = len({c.key for r in previous.good.values() for c in r.configs})
            message = (
                f"{self._location.display} holds no keys any more; keeping the resources last read from it "
                f"({count}) until it does; to serve an empty mesh on purpose, leave an empty .yaml key in it"
            )
            finding = Finding(Severity.ERROR, message, self._location.display)
            self._state = _State(previous.loaded, previous.good, (finding,))  # the next answer applies whole
            self._store.set_file_status(self._statuses((finding,)))
            self._log_findings((finding,))
            return None
        state = _State()
        for name in sorted(entries):
            entry = entries[name]
            last = previous.loaded.get(name)
            if last is not None and last[0] == entry.modify_index and entry.modify_index:
                state.loaded[name] = last
                if name in previous.good:
                    state.good[name] = previous.good[name]
                continue
            if entry.refused is not None:
                result = FileResult(name, findings=(Finding(Severity.ERROR, entry.refused, name),))
            else:
                before = last[1] if last is not None else None
                result = load_bytes(entry.value, name, self._load, previous=before)
            state.loaded[name] = (entry.modify_index, result)
            good = result if result.ok else previous.good.get(name)
            if good is not None:
                state.good[name] = good
        if previous.merged is None or self._outage_seen:
            change, findings = self._apply_whole(state)
        else:
            change, findings = self._apply_changed(previous, state, previous.merged)
        self._outage_seen = False
        state.errors = tuple(f for f in findings if f.severity is Severity.ERROR)
        self._state = state
        self._log_findings(findings)
        return change

    def _apply_whole(self, state: _State) -> tuple[ConfigChange | None, list[Finding]]:
        """Hand the store every key's resources and status (the first answer, or after an outage
        or an emptied prefix, whose statuses it replaces)."""
        merged, duplicates = merge_files(state.good[n] for n in sorted(state.good))
        state.merged = MergedFiles(dict(merged), duplicates)
        findings = [f for _, r in state.loaded.values() for f in r.findings] + duplicates
        by_file: dict[str, list[Finding]] = {name: [] for name in state.loaded}
        for finding in findings:
            by_file.setdefault(finding.file or self._location.display, []).append(finding)
        files = [FileStatus(path, tuple(found)) for path, found in by_file.items()]
        return self._store.replace_all(merged, files=files), findings

    def _apply_changed(
        self, previous: _State, state: _State, merged: MergedFiles
    ) -> tuple[ConfigChange | None, list[Finding]]:
        """Hand the store what the keys that changed, came or went change, at the cost of those
        keys (`MergedFiles`), as the directory watcher does for the files events name."""
        changed = {n for n in state.loaded if state.loaded[n] is not previous.loaded.get(n)}
        changed.update(n for n in previous.loaded if n not in state.loaded)
        before = {n: previous.good[n].configs for n in changed if n in previous.good}
        after = {n: state.good[n].configs for n in changed if n in state.good}

        def configs_of(name: str) -> tuple[Config, ...]:
            good = state.good.get(name)
            return good.configs if good is not None else ()

        plan = merged.plan(before, after, configs_of, _position)
        files: dict[str, FileStatus | None] = {}
        for name in changed | plan.duplicates.keys():
            loaded = state.loaded.get(name)
            own = loaded[1].findings if loaded is not None else ()
            dups = plan.duplicates[name] if name in plan.duplicates else merged.duplicates.get(name, [])
            files[name] = FileStatus(name, (*own, *dups)) if loaded is not None or dups else None
        change = self._store.update(plan.configs, files=files)
        merged.adopt(plan)
        state.merged = merged
        findings = [f for _, r in state.loaded.values() for f in r.findings]
        findings += [f for found in merged.duplicates.values() for f in found]
        return change, findings

    def _statuses(self, findings: Sequence[Finding], extra: Sequence[Finding] = ()) -> list[FileStatus]:
        """The file status: every key as last loaded, plus `findings` and `extra` by file."""
        by_file: dict[str, list[Finding]] = {n: list(r.findings) for n, (_, r) in self._state.loaded.items()}
        for finding in (*findings, *extra):
            found = by_file.setdefault(finding.file or self._location.display, [])
            if finding not in found:
                found.append(finding)
        return [FileStatus(path, tuple(found)) for path, found in by_file.items()]

    def _log_findings(self, findings: Sequence[Finding]) -> None:
        """Log each problem once, when it appears (an answer that finds the same broken key again
        stays quiet)."""
        for finding in findings:
            if str(finding) not in self._reported:
                logger.log(logging.ERROR if finding.severity is Severity.ERROR else logging.WARNING, "%s", finding)
        self._reported = {str(f) for f in findings}
