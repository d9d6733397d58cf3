"""Push history: every snapshot version the server builds, what changed in it, where it came
from, and what each proxy did with it, kept in the state directory across restarts.

An operator asking "which change did that?" after an Envoy refused its config needs three
answers this module keeps together, per version:

- where it came from: the input digest (`Snapshot.config_version`: everything but EDS endpoints)
  and, when a config directory is a git checkout, its commit and whether the tree was dirty
  (read with `git` itself; no commit is named when git or the checkout is missing);
- what changed since the version before: each Istio resource added, changed or removed, by kind
  and namespace/name with its `file:line`, and each service of the registry added, changed or
  removed (the endpoints alone changing is an `endpoint_only` version);
- what each proxy did with it: when it was first sent each type, when it ACKed it, when it
  NACKed it and Envoy's message (`DeliveryLog` fills these in from the ADS servicer's events).

Retention is bounded: the newest `DEFAULT_KEEP` versions (`serve --history-size`), per version
at most `MAX_PROXIES` proxies (others are counted, not named), and every proxy's times only for
the newest `DETAILED` versions: older ones keep how many proxies were sent, ACKed and NACKed
them, and the NACKs with Envoy's messages (what is asked of an old version). The file is rewritten whole
(atomically: a temporary file renamed over it) at most once a second while events come in and
once more at stop, so a fleet's ACKs cost the disk one small write a second, not one per ACK.
A history that cannot be read at start (corrupt, another program's) is set aside under
`history.json.bad` and a fresh one started: history is for people, never a reason not to serve.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any, Final

from meshctl.registry.model import diff_models
from meshctl.snapshot.model import Snapshot

logger = logging.getLogger("meshctl.server.history")

#: Versions kept by default (`serve --history-size`).
DEFAULT_KEEP: Final = 100
#: Proxies named per version; a larger fleet's others are counted in `proxies_beyond`.
MAX_PROXIES: Final = 2_000
#: Versions that keep every proxy's times; older ones keep counts and NACKs (`compact`).
DETAILED: Final = 10
#: Changed resources named per version; more are counted in `changes_beyond`.
MAX_CHANGES: Final = 1_000
#: Envoy's NACK message, as much of it as is kept.
MAX_MESSAGE: Final = 2_000
#: The least time between two writes of the file while events come in.
WRITE_INTERVAL: Final = 1.0
FILE_NAME: Final = "history.json"
_FORMAT: Final = 1


@dataclass(frozen=True, slots=True)
class GitState:
    """The commit a config directory is checked out at, and whether its tree differs from it."""

    commit: str
    dirty: bool

    def describe(self) -> str:
        return f"{self.commit[:12]}{' (dirty)' if self.dirty else ''}"


def git_state(directory: Path, timeout: float = 5.0) -> GitState | None:
    """The git commit `directory` is checked out at (and whether the part of the tree under it
    has uncommitted changes), or None when it is not in a checkout or git is not installed. Runs
    `git`; call it off the event loop. The tree is looked at before the commit: a `git commit`
    landing between the two reads then gives the new commit, clean, or the old one, dirty; read
    the other way round it gave the old commit as clean, a commit the config did not come from.

    Both run with optional locks off (`--no-optional-locks`, git 2.15): a plain `git status`
    refreshes a stale index under `.git/index.lock`, and an operator's `git add` or `git commit`
    in the same checkout at that moment failed with "index.lock: File exists"."""
    try:
        status = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(directory), "status", "--porcelain", "--", "."],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        head = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(directory), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return GitState(head.stdout.strip(), status.returncode != 0 or bool(status.stdout.strip()))


def history_dir(state_dir: Path | None, *, given: bool) -> Path | None:
    """The directory the push history is kept in: the state directory, unless it is the default
    one and cannot be written (the history then lives in memory only)."""
    if state_dir is None or given:
        return state_dir
    return state_dir if os.access(state_dir, os.W_OK) else None


def snapshot_changes(before: Snapshot | None, now: Snapshot) -> list[dict[str, str]]:
    """What differs from `before` to `now`: each Istio resource added, changed or removed (by
    kind, namespace/name and `file:line`), then each registry service, by hostname."""
    out: list[dict[str, str]] = []
    if before is None:
        return out
    if before.mesh != now.mesh:
        out.append({"kind": "MeshConfig", "name": "", "change": "changed", "source": ""})
    for kind in sorted(set(before.kind_digests) | set(now.kind_digests)):
        if before.kind_digests.get(kind) == now.kind_digests.get(kind):
            continue
        # The configs a change leaves alone are the very objects in both: only the rest is
        # compared (one WorkloadEntry among ten thousand is a few, not ten thousand).
        # By identity, the passes over every config in C (`map`, `compress`): an endpoint change
        # compares ten thousand WorkloadEntries on every publication, before any stream is pushed.
        before_all, now_all = before.of_kind(kind), now.of_kind(kind)
        before_ids, now_ids = set(map(id, before_all)), set(map(id, now_all))
        gone, came = before_ids - now_ids, now_ids - before_ids
        old = {c.key: c for c in compress(before_all, map(gone.__contains__, map(id, before_all)))} if gone else {}
        new = {c.key: c for c in compress(now_all, map(came.__contains__, map(id, now_all)))} if came else {}
        for key in sorted(old.keys() | new.keys()):
            was, config = old.get(key), new.get(key)
            if was is not None and config is not None and was.content_digest() == config.content_digest():
                continue
            change = "added" if was is None else "removed" if config is None else "changed"
            source = str((config or was).source)  # type: ignore[union-attr]  # one of them is set
            out.append({"kind": kind, "name": f"{key.namespace}/{key.name}", "change": change, "source": source})
    old_services, new_services = before.services.services, now.services.services
    registry = diff_models(before.services, now.services)
    if registry is not None and not registry.endpoint_only:
        for host in sorted(registry.hosts):
            was_service, service = old_services.get(host), new_services.get(host)
            if was_service is service or was_service == service:
                continue
            change = "added" if was_service is None else "removed" if service is None else "changed"
            out.append({"kind": "service", "name": host, "change": change, "source": ""})
    return out


def _git_list(git: Sequence[tuple[str, GitState]]) -> list[dict[str, Any]]:
    return [{"dir": d, "commit": g.commit, "dirty": g.dirty} for d, g in git]


def proxy_counts(entry: dict[str, Any]) -> dict[str, int]:
    """How many proxies were sent the version, ACKed all they were sent of it, NACKed any of it."""
    if "counted" in entry:
        return dict(entry["counted"])
    proxies: dict[str, dict[str, dict[str, Any]]] = entry.get("proxies", {})
    return {
        "sent": sum(1 for p in proxies.values() if any("sent" in t for t in p.values())),
        "acked": sum(1 for p in proxies.values() if p and all("acked" in t for t in p.values() if "sent" in t)),
        "nacked": sum(1 for p in proxies.values() if any("nacked" in t for t in p.values())),
    }


def compact(entry: dict[str, Any]) -> None:
    """Keep of an old version's proxies their counts and their NACKs only."""
    if "counted" in entry:
        return
    entry["counted"] = proxy_counts(entry)
    entry["proxies"] = {
        node: {t: r for t, r in by_type.items() if "nacked" in r}
        for node, by_type in entry.get("proxies", {}).items()
        if any("nacked" in r for r in by_type.values())
    }


class PushHistory:
    """The versions built, newest last, kept in `state_dir/history.json` (memory only without a
    directory, or when it cannot be written: said once in the log)."""

    def __init__(self, state_dir: Path | None, keep: int = DEFAULT_KEEP) -> None:
        self.keep = max(1, keep)
        self._path = state_dir / FILE_NAME if state_dir is not None else None
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._dirty = False
        #: each entry's JSON as last written, and the versions changed since (encoded again):
        #: a write while a fleet ACKs encodes the newest version, not every one kept
        self._encoded: dict[str, str] = {}
        self._touched: set[str] = set()
        self._written_at = 0.0
        self._write_failed = False
        if self._path is not None:
            self._load(self._path)

    # -- reading ---------------------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """Every version kept, oldest first (a copy of each entry's top level)."""
        return [dict(e) for e in self._entries.values()]

    def entry(self, version: str) -> dict[str, Any] | None:
        """The entry of `version`, or of the one version it is a unique prefix of."""
        found = self._entries.get(version)
        if found is None and version:
            matches = [v for v in self._entries if v.startswith(version)]
            found = self._entries[matches[0]] if len(matches) == 1 else None
        return found

    def versions(self) -> list[str]:
        return list(self._entries)

    # -- recording -------------------------------------------------------------------------

    def record(
        self,
        snapshot: Snapshot,
        before: Snapshot | None,
        git: Sequence[tuple[str, GitState]] = (),
        *,
        now: float | None = None,
    ) -> dict[str, Any]:
        """A new version built (or built again: a version undone and redone keeps its first entry
        and moves to the end); returns its entry."""
        version = snapshot.version
        existing = self._entries.pop(version, None)
        changes = snapshot_changes(before, snapshot)
        entry: dict[str, Any] = existing or {
            "version": version,
            "time": now if now is not None else time.time(),
            "input_digest": snapshot.config_version,
            "proxies": {},
            "proxies_beyond": 0,
        }
        entry["rebuilt_at"] = (now if now is not None else time.time()) if existing else None
        entry["previous"] = before.version if before is not None else ""
        entry["git"] = _git_list(git)
        entry["endpoint_only"] = before is not None and before.config_version == snapshot.config_version
        entry["changes"] = changes[:MAX_CHANGES]
        entry["changes_beyond"] = max(0, len(changes) - MAX_CHANGES)
        entry.setdefault("rollout", {})
        self._entries[version] = entry
        self._touched.add(version)
        while len(self._entries) > self.keep:
            gone, _ = self._entries.popitem(last=False)
            self._encoded.pop(gone, None)
        if len(self._entries) > DETAILED:
            older = list(self._entries)[-DETAILED - 1]
            compact(self._entries[older])
            self._touched.add(older)
        self._dirty = True
        return entry

    def note_git(self, version: str, git: Sequence[tuple[str, GitState]]) -> None:
        """The git state `version` was built from, once known (looked up off the push path)."""
        entry = self._entries.get(version)
        if entry is not None:
            entry["git"] = _git_list(git)
            self._touched.add(version)
            self._dirty = True

    def note_rollout(self, version: str, what: str, when: float | None = None) -> None:
        """A rollout step of `version` (`canary`, `fleet`, `held`, `pinned`...) and when, the first time."""
        entry = self._entries.get(version)
        if entry is not None and what not in entry["rollout"]:
            entry["rollout"][what] = when if when is not None else time.time()
            self._touched.add(version)
            self._dirty = True

    def note_proxy(
        self, version: str, node_id: str, type_short: str, event: str, message: str = "", *, when: float | None = None
    ) -> None:
        """A proxy's `event` (`sent`, `acked`, `nacked`) for one type at `version`: the first time
        of each is kept, and the latest NACK message."""
        entry = self._entries.get(version)
        if entry is None or ("counted" in entry and event != "nacked"):
            return
        proxies: dict[str, Any] = entry["proxies"]
        record = proxies.get(node_id)
        if record is None:
            if len(proxies) >= MAX_PROXIES:
                entry["proxies_beyond"] += 1
                self._touched.add(version)
                return
            record = proxies[node_id] = {}
        types: dict[str, Any] = record.setdefault(type_short, {})
        if event == "nacked":
            types["nacked"] = when if when is not None else time.time()
            types["error"] = message[:MAX_MESSAGE]
        elif event not in types:
            types[event] = when if when is not None else time.time()
        else:
            return
        self._touched.add(version)
        self._dirty = True

    # -- the file --------------------------------------------------------------------------

    def flush(self, *, force: bool = False) -> None:
        """Write the file if anything changed, at most once per `WRITE_INTERVAL` unless `force`."""
        if self._path is None or not self._dirty:
            return
        if not force and time.monotonic() - self._written_at < WRITE_INTERVAL:
            return
        self._dirty = False
        self._written_at = time.monotonic()
        tmp = self._path.with_name(f".{FILE_NAME}.tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(self._json())
            os.replace(tmp, self._path)
        except OSError as exc:
            if not self._write_failed:
                logger.warning("push history is kept in memory only: cannot write %s: %s", self._path, exc)
            self._write_failed = True
            with contextlib.suppress(OSError):
                tmp.unlink()
        else:
            self._write_failed = False

    def _json(self) -> str:
        """The file's text: `{"format": 1, "entries": [...]}` as `json.dumps` writes it compact,
        with only the entries changed since the last write encoded again."""
        encoded = self._encoded
        for version, entry in self._entries.items():
            if version in self._touched or version not in encoded:
                encoded[version] = json.dumps(entry, separators=(",", ":"))
        self._touched.clear()
        entries = ",".join(encoded[v] for v in self._entries)
        return f'{{"format":{_FORMAT},"entries":[{entries}]}}'

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("cannot read the push history %s (%s): starting a new one", path, exc)
            return
        try:
            data = json.loads(text)
            entries = data["entries"]
            if data.get("format") != _FORMAT or not isinstance(entries, list):
                raise ValueError("not a meshctl push history")
            for entry in entries[-self.keep :]:
                if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
                    raise ValueError("an entry without a version")
                entry.setdefault("proxies", {})
                entry.setdefault("rollout", {})
                entry.setdefault("proxies_beyond", 0)
                self._entries[entry["version"]] = entry
        except (ValueError, KeyError, TypeError) as exc:
            self._entries.clear()
            aside = path.with_name(f"{FILE_NAME}.bad")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            logger.warning(
                "the push history %s cannot be read (%s): set aside as %s, starting a new one", path, exc, aside
            )
