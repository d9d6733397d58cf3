"""The fake Consul agent's KV store: its verbs, and each operation applied to its keys.

`KvMixin` gives `FakeConsul` the KV verbs over its state and lock: `kv_put`, `kv_delete`,
`kv_get`, `kv_keys` and `txn` (`PUT /v1/txn`'s KV verbs, all or nothing at one index, at most 64
operations), and the index a KV read reports. `kv_op` applies one operation of a transaction (or
of a plain write made into one) as Consul applies a KV verb, as a pure function over the KV
state (`kv`, tombstones, sessions), and `kv_json` gives an entry as Consul's HTTP API writes it.
`FakeConsul` (`fake_consul.py`) holds the state and its lock, holds blocking reads, and serves
all of it over HTTP.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from typing import Any, Final

from meshctl.testing.fake_consul_sessions import AgentState, ConsulAPIError, SessionTable

_TXN_MAX_OPS: Final = 64  # Consul's limit on operations in one transaction


def field(obj: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Consul decodes JSON field names case-insensitively (py-consul sends `node`, `service`)."""
    for key, value in obj.items():
        if key.lower() == name.lower():
            return value
    return default


class KvOpFailed(Exception):
    """One transaction operation that cannot apply; its message is Consul's `What`."""


def kv_op(
    kv: dict[str, dict[str, Any]],
    tombstones: dict[str, int],
    op: Mapping[str, Any],
    index: int,
    sessions: SessionTable,
) -> tuple[dict[str, Any] | None, bool]:
    """Apply one KV operation to `kv` (a copy); returns its result entry and whether it wrote.
    A plain write keeps the key's lock (Session, LockIndex), as Consul's does."""
    verb, key = field(op, "Verb", ""), field(op, "Key", "")
    if not isinstance(key, str) or (not key and verb != "delete-tree"):
        raise KvOpFailed("Must provide key")
    want = int(field(op, "Index", 0) or 0)
    current = kv.get(key)
    lock: dict[str, Any] = {"LockIndex": current["LockIndex"], **session_of(current)} if current else {"LockIndex": 0}
    if verb in ("lock", "unlock"):
        session = field(op, "Session", "")
        if session not in sessions.sessions:
            raise KvOpFailed(f'invalid session "{session}"')
        holder = current.get("Session") if current else None
        if verb == "lock":
            if sessions.delayed(key, time.monotonic()):
                raise KvOpFailed(f'failed to acquire lock on key "{key}": in its lock-delay')
            if holder not in (None, session):
                raise KvOpFailed(f'failed to acquire lock on key "{key}": held by another session')
            lock = {"LockIndex": lock["LockIndex"] + (holder != session), "Session": session}
        else:
            if holder != session:
                raise KvOpFailed(f'failed to release lock on key "{key}": not held by this session')
            lock = {"LockIndex": lock["LockIndex"]}
    if verb in ("set", "cas", "lock", "unlock"):
        if verb == "cas" and (current["ModifyIndex"] if current else 0) != want:
            raise KvOpFailed(f'failed to set key "{key}", index is stale')
        raw = field(op, "Value")
        try:
            value = base64.b64decode(raw, validate=True) if raw else b""
        except (binascii.Error, ValueError) as exc:
            raise KvOpFailed(f"Failed to decode value of key {key!r}: {exc}") from exc
        kv[key] = {
            "Key": key,
            "Flags": int(field(op, "Flags", 0) or 0),
            "Value": value,
            "CreateIndex": current["CreateIndex"] if current else index,
            "ModifyIndex": index,
            **lock,
        }
        tombstones.pop(key, None)
        return {**kv_json(kv[key]), "Value": None}, True
    if verb == "get":
        if current is None:
            raise KvOpFailed(f'key "{key}" doesn\'t exist')
        return kv_json(current), False
    if verb == "check-index":
        if current is None or current["ModifyIndex"] != want:
            raise KvOpFailed(f"current modify index {current['ModifyIndex'] if current else 0} != {want}")
        return {**kv_json(current), "Value": None}, False
    if verb in ("delete", "delete-cas"):
        if verb == "delete-cas" and (current is None or current["ModifyIndex"] != want):
            raise KvOpFailed(f'failed to delete key "{key}", index is stale')
        if current is None:
            return None, False
        del kv[key]
        tombstones[key] = index
        return None, True
    if verb == "delete-tree":
        gone = [k for k in kv if k.startswith(key)]
        for k in gone:
            del kv[k]
            tombstones[k] = index
        return None, bool(gone)
    raise KvOpFailed(f"unknown KV verb {verb!r}")


def session_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"Session": entry["Session"]} if entry.get("Session") else {}


def kv_json(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as Consul's JSON has it: Value base64, or null when empty."""
    value = entry["Value"]
    return {**entry, "Value": base64.b64encode(value).decode() if value else None}


class KvMixin(AgentState):
    """The fake agent's KV verbs, over its state and lock (`FakeConsul` is one)."""

    def kv_put(self, key: str, value: bytes, *, cas: int | None = None, flags: int = 0) -> bool:
        """`PUT /v1/kv/KEY` without HTTP; False when `cas` does not match (0: only a new key)."""
        return self.txn([{"KV": {"Verb": "set" if cas is None else "cas", "Key": key, "Flags": flags,
                                 "Value": base64.b64encode(value).decode(), "Index": cas or 0}}],
                        raise_on_failure=False) is not None  # fmt: skip

    def kv_delete(self, key: str, *, recurse: bool = False, cas: int | None = None) -> bool:
        """`DELETE /v1/kv/KEY` without HTTP; False when `cas` does not match."""
        verb = "delete-tree" if recurse else "delete" if cas is None else "delete-cas"
        return self.txn([{"KV": {"Verb": verb, "Key": key, "Index": cas or 0}}], raise_on_failure=False) is not None

    def kv_get(self, key: str) -> bytes | None:
        with self._cond:
            entry = self._kv.get(key)
            return None if entry is None else bytes(entry["Value"])

    def kv_keys(self, prefix: str = "") -> list[str]:
        with self._cond:
            return sorted(k for k in self._kv if k.startswith(prefix))

    def txn(self, ops: list[Any], *, raise_on_failure: bool = True) -> list[dict[str, Any]] | None:
        """`PUT /v1/txn`'s KV verbs, all or nothing at one index: the results, or (when an
        operation fails) a ConsulAPIError of 409 with Consul's body, or None without raising."""
        if not isinstance(ops, list):
            raise ConsulAPIError(400, "Failed to parse body: expected a list of operations")
        if len(ops) > _TXN_MAX_OPS:
            raise ConsulAPIError(413, f"Transaction contains too many operations ({len(ops)} > {_TXN_MAX_OPS})")
        with self._cond:
            kv, tombstones = dict(self._kv), dict(self._kv_tombstones)
            index = self._index + 1
            results: list[dict[str, Any]] = []
            errors: list[dict[str, Any]] = []
            wrote = False
            for number, op in enumerate(ops):
                body = field(op, "KV") if isinstance(op, Mapping) else None
                if not isinstance(body, Mapping):
                    raise ConsulAPIError(400, f"operation {number}: only KV operations are supported here")
                try:
                    result, changed = kv_op(kv, tombstones, body, index, self.sessions)
                except KvOpFailed as exc:
                    errors.append({"OpIndex": number, "What": str(exc)})
                    continue
                wrote = wrote or changed
                if result is not None:
                    results.append({"KV": result})
            if errors:
                if raise_on_failure:
                    raise ConsulAPIError(409, json.dumps({"Results": None, "Errors": errors}))
                return None
            if wrote:
                self._kv, self._kv_tombstones = kv, tombstones
                self._index = self._kv_index = index
                self._cond.notify_all()
            return results

    def kv_index_of(self, key: str, recurse: bool) -> int:
        """A KV read's index: the highest ModifyIndex under it, deletions included; the KV
        table's index when nothing was ever there."""
        if recurse:
            found = [e["ModifyIndex"] for k, e in self._kv.items() if k.startswith(key)]
            found += [i for k, i in self._kv_tombstones.items() if k.startswith(key)]
        else:
            found = [self._kv[key]["ModifyIndex"]] if key in self._kv else []
            found += [self._kv_tombstones[key]] if key in self._kv_tombstones else []
        return max(found, default=0) or self._kv_index
