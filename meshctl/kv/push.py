"""Write a config tree to a Consul KV prefix as one transaction (`meshctl kv push`).

The prefix is what `meshctl serve --config-consul-kv` follows (`meshctl.kv.source`), and
each Consul transaction is one revision there, so a push written as one `PUT /v1/txn` reaches
proxies as one change, never half-applied. Every write is a check-and-set against the
ModifyIndex read just before (`cas` with index 0 for a new key, `cas` with the key's index for a
changed one, `delete-cas` for a key no longer in the tree): when someone else pushed in between,
Consul refuses the whole transaction and nothing is written. Unchanged keys are not written.

Consul takes at most 64 operations in one transaction. A push with more changes is refused
unless `split` is given; then it is written as several transactions of at most 64 (new and changed
keys first, deletions last), each atomic and each a revision a server may serve for a moment, and
a failure part-way leaves the earlier ones written (the error says how many).
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from meshctl.config.yamlsource import DEFAULT_MAX_FILE_BYTES
from meshctl.errors import RegistryError, UsageError
from meshctl.kv.source import read_prefix
from meshctl.registry.consul_http import ConsulConnection, ConsulOptions

#: Consul's limit on the operations of one transaction.
TXN_MAX_OPS: Final = 64


@dataclass(frozen=True, slots=True)
class Current:
    """A key as read before the push: its value and the ModifyIndex a write checks against."""

    value: bytes
    modify_index: int


@dataclass(frozen=True, slots=True)
class PushPlan:
    """What a push changes, by name relative to the prefix, and the transaction operations."""

    prefix: str
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    unchanged: int = 0
    operations: tuple[dict[str, object], ...] = field(default=(), repr=False)

    @property
    def empty(self) -> bool:
        return not self.operations

    def describe(self) -> list[str]:
        """One line per key, `+` added, `~` changed, `-` deleted."""
        return [
            *(f"+ {self.prefix}{n}" for n in self.added),
            *(f"~ {self.prefix}{n}" for n in self.changed),
            *(f"- {self.prefix}{n}" for n in self.deleted),
        ]

    def summary(self) -> str:
        return (
            f"{len(self.added)} added, {len(self.changed)} changed, {len(self.deleted)} deleted,"
            f" {self.unchanged} unchanged"
        )


def plan_push(prefix: str, tree: Mapping[str, bytes], current: Mapping[str, Current]) -> PushPlan:
    """The operations that make the config keys under `prefix` hold exactly `tree` (file name ->
    bytes), each checked against what `current` read."""
    added: list[str] = []
    changed: list[str] = []
    deleted: list[str] = []
    unchanged = 0
    sets: list[dict[str, object]] = []
    deletes: list[dict[str, object]] = []
    for name in sorted(tree):
        before = current.get(name)
        if before is not None and before.value == tree[name]:
            unchanged += 1
            continue
        (changed if before is not None else added).append(name)
        value = base64.b64encode(tree[name]).decode("ascii")
        index = before.modify_index if before is not None else 0
        sets.append({"KV": {"Verb": "cas", "Key": prefix + name, "Value": value, "Index": index}})
    for name in sorted(set(current) - set(tree)):
        deleted.append(name)
        deletes.append({"KV": {"Verb": "delete-cas", "Key": prefix + name, "Index": current[name].modify_index}})
    return PushPlan(prefix, tuple(added), tuple(changed), tuple(deleted), unchanged, (*sets, *deletes))


def read_current(
    conn: ConsulConnection, options: ConsulOptions, prefix: str, max_value_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> dict[str, Current]:
    """The config keys under `prefix` now, with their ModifyIndex (other keys' values are not read)."""
    return {
        e.name: Current(e.value, e.modify_index) for e in read_prefix(conn, options, prefix, max_value_bytes).values()
    }


def apply_push(conn: ConsulConnection, options: ConsulOptions, plan: PushPlan, *, split: bool = False) -> int:
    """Write `plan` as one transaction (several with `split`, see the module); returns how many
    transactions were written. A refused check-and-set is a RegistryError saying so."""
    ops = list(plan.operations)
    if len(ops) > TXN_MAX_OPS and not split:
        raise UsageError(
            f"the push makes {len(ops)} changes and Consul takes at most {TXN_MAX_OPS} operations in one "
            "transaction: push the tree in parts, or give --split to write it as several transactions "
            "(each atomic, the whole not: servers may serve a mix for a moment)"
        )
    chunks = [ops[i : i + TXN_MAX_OPS] for i in range(0, len(ops), TXN_MAX_OPS)]
    for number, chunk in enumerate(chunks):
        try:
            _transaction(conn, options, plan.prefix, chunk)
        except RegistryError as exc:
            if number:
                raise RegistryError(f"{exc} ({number} of {len(chunks)} transactions were written before)") from exc
            raise
    return len(chunks)


def _transaction(conn: ConsulConnection, options: ConsulOptions, prefix: str, ops: list[dict[str, object]]) -> None:
    params = {"dc": options.datacenter} if options.datacenter else {}
    body = json.dumps(ops).encode()
    try:
        reply = conn.request("PUT", "/v1/txn", params, options.request_timeout, body)
    except (OSError, http.client.HTTPException) as exc:
        raise RegistryError(f"cannot write consul KV at {options.url}: {exc}") from exc
    if reply.status == 200:
        return
    text = reply.body.decode("utf-8", "replace").strip()
    if reply.status == 409:
        try:
            errors = json.loads(text).get("Errors") or []
            what = "; ".join(str(e.get("What", e)) for e in errors)
        except (ValueError, AttributeError):
            what = text[:200]
        raise RegistryError(
            f"consul KV under {prefix or '/'} changed since it was read (another push?): nothing was"
            f" written ({what}); push again"
        )
    if reply.status == 403:
        raise RegistryError(f"PUT /v1/txn: permission denied (HTTP 403, the token needs key:write): {text[:200]}")
    raise RegistryError(f"PUT /v1/txn: HTTP {reply.status}: {text[:200]}")
