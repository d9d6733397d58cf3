"""The fake Consul agent's catalog: nodes, services and checks, as Consul keeps them.

`PUT /v1/catalog/register` and `deregister` (with Consul's bodies, field names in any case) and
check updates write it; the catalog and health answers of the blocking queries read it. Each
service has its own index (that of the last write touching its instances or their checks) and the
service list has another, so a blocked query on one service is answered on its own changes only,
as Consul's are. It is apart from `FakeConsul` (`fake_consul.py`), which holds the state, the lock
and the raft-like index, and serves them over HTTP; the KV store and sessions are beside it
(`fake_consul_kv.py`, `fake_consul_sessions.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from meshctl.testing.fake_consul_kv import field
from meshctl.testing.fake_consul_sessions import ConsulAPIError


class CatalogMixin:
    """The fake agent's catalog verbs and reads, over its state and lock (`FakeConsul` is one).
    Reads are called with the lock held."""

    datacenter: str
    _cond: threading.Condition
    _index: int
    _catalog_index: int
    _service_index: dict[str, int]
    _nodes: dict[str, dict[str, Any]]
    _services: dict[tuple[str, str], dict[str, Any]]
    _checks: dict[tuple[str, str], dict[str, Any]]

    def register(self, body: Mapping[str, Any]) -> None:
        """`PUT /v1/catalog/register` without HTTP."""
        node = field(body, "Node", "")
        if not node:
            raise ConsulAPIError(400, "Must provide node")
        dc = field(body, "Datacenter") or self.datacenter
        if dc != self.datacenter:
            raise ConsulAPIError(500, f"No path to datacenter {dc}")
        with self._cond:
            touched: set[str] = set()
            catalog = changed = False
            if not field(body, "SkipNodeUpdate", False):
                address = field(body, "Address", "")
                if not address:
                    raise ConsulAPIError(400, "Must provide address if SkipNodeUpdate is not set")
                new_node = {
                    "ID": field(body, "ID", ""),
                    "Node": node,
                    "Address": address,
                    "Datacenter": dc,
                    "TaggedAddresses": dict(field(body, "TaggedAddresses") or {}),
                    "Meta": dict(field(body, "NodeMeta") or {}),
                }
                old_node = self._nodes.get(node)
                if old_node is None or _strip(old_node) != new_node:
                    self._nodes[node] = self._indexed(new_node, old_node)
                    touched |= self._names_on(node)
                    changed = True
            elif node not in self._nodes:
                raise ConsulAPIError(400, f"node {node!r} does not exist")
            svc = field(body, "Service")
            if svc:
                new = _service(svc)
                key = (node, new["ID"])
                old = self._services.get(key)
                if old is None or _strip(old) != new:
                    self._services[key] = self._indexed(new, old)
                    touched |= {new["Service"]} | ({old["Service"]} if old else set())
                    catalog = True
            checks = [field(body, "Check"), *(field(body, "Checks") or [])]
            for chk in (c for c in checks if c):
                scope = self._put_check(node, chk)
                touched |= scope or set()
                changed = changed or scope is not None
            if touched or catalog or changed:
                self._write(touched, catalog)

    def deregister(self, body: Mapping[str, Any]) -> None:
        """`PUT /v1/catalog/deregister` without HTTP: a service, a check, or a whole node."""
        node = field(body, "Node", "")
        service_id, check_id = field(body, "ServiceID", ""), field(body, "CheckID", "")
        with self._cond:
            if node not in self._nodes:
                return
            touched: set[str] = set()
            catalog = False
            if service_id or not check_id:
                gone = [k for k in self._services if k[0] == node and (not service_id or k[1] == service_id)]
                for key in gone:
                    touched.add(self._services.pop(key)["Service"])
                    catalog = True
                    for ck in [c for c, v in self._checks.items() if c[0] == node and v["ServiceID"] == key[1]]:
                        del self._checks[ck]
            if check_id and (node, check_id) in self._checks:
                chk = self._checks.pop((node, check_id))
                touched |= self._check_scope(node, chk["ServiceID"])
            if not service_id and not check_id:
                touched |= self._names_on(node)
                del self._nodes[node]
                for ck in [c for c in self._checks if c[0] == node]:
                    del self._checks[ck]
            if touched or catalog:
                self._write(touched, catalog)

    def set_check(self, node: str, check_id: str, status: str) -> None:
        """Change one check's status (`passing`, `warning`, `critical`)."""
        with self._cond:
            chk = self._checks[(node, check_id)]
            if chk["Status"] != status:
                self._checks[(node, check_id)] = {**chk, "Status": status}
                self._write(self._check_scope(node, chk["ServiceID"]), catalog=False)

    def _put_check(self, node: str, chk: Mapping[str, Any]) -> set[str] | None:
        """The services the check bears on, or None when it was already there as is."""
        service_id = field(chk, "ServiceID", "")
        svc = self._services.get((node, service_id))
        new = {
            "Node": node,
            "CheckID": field(chk, "CheckID") or field(chk, "Name", ""),
            "Name": field(chk, "Name", ""),
            "Status": field(chk, "Status") or "critical",  # Consul's default for a new check
            "Notes": field(chk, "Notes", ""),
            "Output": field(chk, "Output", ""),
            "ServiceID": service_id,
            "ServiceName": svc["Service"] if svc else "",
            "ServiceTags": list(svc["Tags"]) if svc else [],
            "Type": "",
        }
        old = self._checks.get((node, new["CheckID"]))
        if old is not None and _strip(old) == new:
            return None
        self._checks[(node, new["CheckID"])] = self._indexed(new, old)
        return self._check_scope(node, service_id)

    def _check_scope(self, node: str, service_id: str) -> set[str]:
        if not service_id:
            return self._names_on(node)
        svc = self._services.get((node, service_id))
        return {svc["Service"]} if svc else set()

    def _names_on(self, node: str) -> set[str]:
        return {s["Service"] for (n, _), s in self._services.items() if n == node}

    def _indexed(self, new: dict[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
        create = old["CreateIndex"] if old else self._index + 1
        return {**new, "CreateIndex": create, "ModifyIndex": self._index + 1}

    def _write(self, services: Iterable[str], catalog: bool) -> None:
        self._index += 1
        for name in services:
            self._service_index[name] = self._index
        if catalog:
            self._catalog_index = self._index
        self._cond.notify_all()

    def catalog_services(self) -> object:
        """`GET /v1/catalog/services`: every service name with the union of its tags."""
        tags: dict[str, set[str]] = {}
        for svc in self._services.values():
            tags.setdefault(svc["Service"], set()).update(svc["Tags"])
        return {name: sorted(t) for name, t in sorted(tags.items())}

    def health_entries(self, name: str, passing: bool) -> object:
        """`GET /v1/health/service/NAME`: each instance with its node and checks (only those
        whose every check passes, with `passing`)."""
        entries = []
        for (node, sid), svc in sorted(self._services.items()):
            if svc["Service"] != name:
                continue
            checks = [c for (n, _), c in sorted(self._checks.items()) if n == node and c["ServiceID"] in ("", sid)]
            if passing and any(c["Status"] != "passing" for c in checks):
                continue
            entries.append({"Node": self._nodes[node], "Service": svc, "Checks": checks})
        return entries

    def index_of(self, name: str) -> int:
        """The index of a service's health (of the catalog when `name` is empty)."""
        return self._service_index.get(name, self._catalog_index) if name else self._catalog_index


def _service(svc: Mapping[str, Any]) -> dict[str, Any]:
    name = field(svc, "Service") or field(svc, "Name", "")
    if not name:
        raise ConsulAPIError(400, "Must provide service name")
    weights = field(svc, "Weights") or {}
    return {
        "ID": field(svc, "ID") or name,
        "Service": name,
        "Tags": list(field(svc, "Tags") or []),
        "Address": field(svc, "Address", ""),
        "TaggedAddresses": dict(field(svc, "TaggedAddresses") or {}),
        "Meta": dict(field(svc, "Meta") or {}),
        "Port": int(field(svc, "Port", 0)),
        "Weights": {"Passing": field(weights, "Passing", 1), "Warning": field(weights, "Warning", 1)},
        "EnableTagOverride": bool(field(svc, "EnableTagOverride", False)),
        "Kind": field(svc, "Kind", ""),
    }


def _strip(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("CreateIndex", "ModifyIndex")}
