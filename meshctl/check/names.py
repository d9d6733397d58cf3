"""Names and addresses two services claim in one proxy's view (MC0006), for `meshctl validate`.

Every sidecar answers the mesh's names itself (`xds/dns_table.py`), and without iptables a TCP
service is reached at the address its name resolves to. Two services can therefore collide where
no single resource is wrong: `db.shop.svc.cluster.local` answers `db.shop` for every proxy, and so
does a ServiceEntry whose host is `db.shop`; two TCP services on one port share 127.0.0.1 when the
loopback range is full or turned off. Which proxies see a clash depends on what they import
(Sidecar egress, exportTo), so the check runs the DNS table's own conflict rule
(`table_conflicts`, which `meshctl hosts` prints) on every view a proxy of the tree has.

The proxies are the tree's workloads: every WorkloadEntry and every ServiceEntry inline endpoint
that no Gateway selects, each a sidecar without iptables (the VM default, as for the other MC
codes) answering on the bootstrap's DNS port. A view is the proxy's `OutboundProxy`, the key the
server shares outbound config on, without the app's own ports (they hide listeners, not names):
a namespace without Sidecars is one view however many VMs it holds, so the cost is a table per
view, not per workload. A clash several views see is one finding listing them.

This reads generated tables, so it sits above `xds/`; `config/check.py`, below it, takes it as a
callable (`cli/validate.py` hands it over) and places its findings like the rest of analysis.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Final

from meshctl.config.analysis import AnalysisIssue
from meshctl.config.findings import Severity
from meshctl.config.labels import labels_match
from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.binding import outbound_proxy
from meshctl.snapshot.interception import DEFAULT_DNS_PORT
from meshctl.snapshot.model import MeshSettings, Snapshot, build_snapshot, spec
from meshctl.snapshot.node import parse_node_id
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.dns_table import TableConflict, table_conflicts

CODE: Final = "MC0006"
#: Views named in one finding before the rest are counted.
_VIEWS_NAMED: Final = 3
_METADATA: Final = {"INTERCEPTION_MODE": "NONE", "DNS_PORT": str(DEFAULT_DNS_PORT)}


def name_clashes(configs: Sequence[Config], mesh: MeshSettings | None = None) -> list[AnalysisIssue]:
    """MC0006 for `configs`: one warning per host that loses a name, or shares an address and
    port, to another host in some proxy's view, on the losing host's `spec.hosts` entry."""
    snapshot = build_snapshot(configs, build_file_model(configs), mesh)
    entries = _host_entries(snapshot)
    seen: dict[TableConflict, list[str]] = {}
    for view in proxy_views(snapshot):
        scope = ProxyScope(snapshot, view)
        for conflict in table_conflicts(scope):
            seen.setdefault(conflict, []).append(_describe_view(view, scope.sidecar))
    issues = []
    for conflict, views in seen.items():
        first = entries.get(conflict.hosts[0])
        for host in conflict.hosts[1:]:
            if first is None or host not in entries:
                continue  # a host no file defines: nothing to point at
            config, index = entries[host]
            message = _message(conflict, host, first[0], views)
            issues.append(AnalysisIssue(config.key, ("spec", "hosts", index), message, Severity.WARNING, CODE))
    return issues


def proxy_views(snapshot: Snapshot) -> Iterator[OutboundProxy]:
    """Each distinct view of the tree's sidecars, once, in the order their workloads come."""
    gateways = [selector for gw in snapshot.of_kind("Gateway") if (selector := spec(gw).selector)]
    done: set[OutboundProxy] = set()
    for namespace, name, address, labels in _workloads(snapshot):
        if any(labels_match(selector, labels) for selector in gateways):
            continue  # a gateway's VM runs a router, which has no DNS listener
        node_id = f"sidecar~{_ip(address)}~{name}.{namespace}~{namespace}.svc.cluster.local"
        node = parse_node_id(node_id, {**_METADATA, "NAMESPACE": namespace})  # names may hold dots
        view = replace(outbound_proxy(Proxy(node, labels), snapshot), app_ports=frozenset())
        if view not in done:
            done.add(view)
            yield view


def _workloads(snapshot: Snapshot) -> Iterator[tuple[str, str, str, Mapping[str, str]]]:
    """(namespace, name, address, labels) of every WorkloadEntry and ServiceEntry inline endpoint."""
    for entry in snapshot.of_kind("WorkloadEntry"):
        yield entry.namespace, entry.name, str(spec(entry).address), {**entry.labels, **spec(entry).labels}
    for se in snapshot.of_kind("ServiceEntry"):
        for endpoint in spec(se).endpoints:
            yield se.namespace, se.name, str(endpoint.address), dict(endpoint.labels)


def _ip(address: str) -> str:
    """The address when it is an IP (its family decides the DNS answers' family), else an IPv4
    placeholder: a hostname or Unix socket endpoint still stands for a proxy of its namespace."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return "0.0.0.0"


def _host_entries(snapshot: Snapshot) -> dict[str, tuple[Config, int]]:
    """host -> the ServiceEntry defining it first and the host's index in its `spec.hosts`."""
    out: dict[str, tuple[Config, int]] = {}
    for se in snapshot.of_kind("ServiceEntry"):
        for index, host in enumerate(spec(se).hosts):
            out.setdefault(str(host), (se, index))
    return out


def _describe_view(view: OutboundProxy, sidecar: Config | None) -> str:
    which = f"Sidecar {sidecar.namespace}/{sidecar.name}" if sidecar is not None else "no Sidecar"
    return f"namespace {view.namespace} ({which})"


def _message(conflict: TableConflict, host: str, first: Config, views: Iterable[str]) -> str:
    distinct = list(dict.fromkeys(views))
    named = "; ".join(distinct[:_VIEWS_NAMED])
    if len(distinct) > _VIEWS_NAMED:
        named += f"; and {len(distinct) - _VIEWS_NAMED} more"
    where = f"{first.source.file}:{first.source.line}"
    other = f"{conflict.hosts[0]} of ServiceEntry {first.namespace}/{first.name} ({where})"
    if conflict.name:
        return (
            f"name {conflict.name} is claimed by {host} and by {other} for the sidecars of {named}: "
            f"their DNS answers {conflict.address} for it, {conflict.hosts[0]}'s, so {host} is not "
            "reached by that name; rename one host, or scope one away with exportTo or Sidecar egress"
        )
    return (
        f"{host} and {other} both resolve to {conflict.address} on TCP port {conflict.port} for the sidecars "
        f"of {named}: nothing in a TCP connection tells them apart, so it reaches {conflict.hosts[0]}; "
        "give the loopback range room (MeshConfig loopbackRange) or the services different ports"
    )
