"""The fake Consul's KV store operations: one transaction or KV write applied to its keys.

Pure functions over the agent's KV state (`kv`, tombstones, sessions), as Consul applies a KV
verb: `kv_op` applies one operation of `PUT /v1/txn` (or of a plain write made into one), and
`kv_json` gives an entry as Consul's HTTP API writes it. `FakeConsul` (`fake_consul.py`) holds the
state and its lock, and serves them over HTTP.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from typing import Any

from meshctl.testing.fake_consul_sessions import SessionTable


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
