"""A node bound to its workload in a snapshot, and what the binding derives.

A node (`snapshot/node.py`: what it says of itself) is bound to its workload (the WorkloadEntry
named by its id, else the one with its IP, else a registry endpoint with that IP); the
workload's labels select the Sidecar, Gateways and DestinationRules that apply to it, and the
services it is an endpoint of give its inbound listeners. Binding also derives what outbound
generation reads of the proxy (`outbound_proxy`) and, so that the server binds a fleet again
only when it must, what binding reads (`binding_version`, `binding_inputs`, `rebound`).

A node whose identity a client certificate proved (`ProxyNode.attested`, set by the server when it
requires client certificates) is bound more strictly, because everything else in its request is
the client's word (its IP above all):

- only to a workload of its own namespace, and with its workload's labels alone (node metadata
  cannot add a label that would select another workload's Sidecar or a Gateway);
- bound to a WorkloadEntry, its instances are that entry's endpoints alone: a ServiceEntry's
  inline endpoint, another WorkloadEntry or a Consul instance at the IP it claims is not its
  workload, and lends it neither an inbound listener nor a service account;
- its workload runs as exactly one service account (`Proxy.service_account`): the entry's own,
  else its WorkloadGroup template's, else Istio's `default`; bound by IP to registry endpoints,
  the one they all agree on (endpoints at one address running as several name no single
  identity, and prove nothing);
- once the server has proved it (`ProxyNode.workload`, `ProxyNode.service_account`), it binds to
  that workload as that service account or not at all: `bind_proxy` raises `BindingError` when a
  later snapshot would bind it elsewhere (its entry deleted, another workload at its IP) or make
  it run as another account, and the server ends its stream rather than re-bind it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from meshctl.api.networking.v1alpha3 import sidecar_pb2
from meshctl.config.labels import GROUP_ANNOTATION, labels_match, selector_labels
from meshctl.config.model import Config
from meshctl.errors import BindingError
from meshctl.logs import untrusted
from meshctl.registry.model import Endpoint, Service
from meshctl.snapshot.collectors import Collector, resolve_collector
from meshctl.snapshot.envoy_filters import select_envoy_filters
from meshctl.snapshot.interception import InterceptionMode, dns_settings
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.node import ProxyNode, ProxyType
from meshctl.snapshot.proxy import OutboundProxy, Proxy, ServiceInstance
from meshctl.snapshot.telemetry import AccessLogs, access_logs
from meshctl.snapshot.tracing import Tracing, tracing
from meshctl.snapshot.wasm_plugins import select_wasm_plugins


def bind_proxy(node: ProxyNode, snapshot: Snapshot) -> Proxy:
    """Bind `node` to its workload in `snapshot`: labels come from the workload, overlaid by the
    node's own `LABELS` metadata (what the node says about itself wins) unless it is attested,
    when it is bound as the module docstring says. Raises `BindingError` for an attested node
    the server proved that no longer binds to what it proved."""
    labels: dict[str, str] = {}
    workload = ""
    entry = _workload_entry(node, snapshot)
    if entry is not None:
        labels.update(entry.labels)
        labels.update(spec(entry).labels)
        workload = f"{entry.namespace}/{entry.name}"
    instances = []
    for service, ep in snapshot.index.endpoints_at(node.ip):
        if node.attested:
            if ep.namespace != node.namespace:
                continue
            if entry is not None and (ep.namespace, ep.name) != (entry.namespace, entry.name):
                continue  # at the IP it claims, but not its workload's
        elif entry is not None and ep.name and (ep.namespace, ep.name) != (entry.namespace, entry.name):
            continue
        instances.append(ServiceInstance(service, ep))
        if entry is None:
            labels = {**ep.labels, **labels}
            workload = workload or (f"{ep.namespace}/{ep.name}" if ep.name else ep.address)
    if not node.attested:
        labels.update(node.labels)
    account = _service_account(entry, instances, snapshot, strict=node.attested)
    if node.attested and node.workload and (workload, account) != (node.workload, node.service_account):
        now = f"workload {workload or 'none'}" + (f" as service account {account}" if account else "")
        raise BindingError(
            f"node {untrusted(node.id)} was proved as workload {node.workload} (service account "
            f"{node.service_account}) and now binds to {now}"
        )
    address_in_config = node.interception is not InterceptionMode.NONE or _any_sidecar_ingress(snapshot)
    proxy = Proxy(node, MappingProxyType(labels), workload, tuple(instances), address_in_config)
    outbound = outbound_proxy(proxy, snapshot)
    router = node.type is ProxyType.ROUTER
    services = [i.service for i in instances]
    filters = select_envoy_filters(snapshot, node.namespace, proxy.labels, router=router, services=services)
    logs = access_logs(snapshot, node.namespace, proxy.labels)
    traced = tracing(snapshot, node.namespace, proxy.labels, node.name, gateway=router)
    plugins = select_wasm_plugins(snapshot, node.namespace, proxy.labels, router=router, services=services)
    return Proxy(
        node,
        proxy.labels,
        workload,
        proxy.instances,
        address_in_config,
        outbound,
        snapshot.version,
        account,
        filters,
        logs,
        traced,
        plugins,
    )


def entry_service_account(entry: Config, snapshot: Snapshot) -> str:
    """The service account a WorkloadEntry runs as: its own, else its WorkloadGroup template's
    (an auto-registered entry), else Istio's `default`."""
    own = str(spec(entry).service_account)
    if own:
        return own
    group_name = entry.annotations.get(GROUP_ANNOTATION, "")
    group = snapshot.get("WorkloadGroup", entry.namespace, group_name) if group_name else None
    if group is not None and spec(group).template.service_account:
        return str(spec(group).template.service_account)
    return "default"


def _service_account(
    entry: Config | None, instances: list[ServiceInstance], snapshot: Snapshot, *, strict: bool
) -> str:
    """The service account of the workload bound: its entry's, else that of its registry
    endpoints. `strict` (an attested node, which must be one identity): an endpoint naming none
    runs as `default`, and endpoints that disagree give "". Otherwise the first named, else
    `default`."""
    if entry is not None:
        return entry_service_account(entry, snapshot)
    if not instances:
        return ""
    if strict:
        accounts = {i.endpoint.service_account or "default" for i in instances}
        return accounts.pop() if len(accounts) == 1 else ""
    return min((i.endpoint.service_account for i in instances if i.endpoint.service_account), default="default")


def outbound_of(proxy: Proxy, snapshot: Snapshot) -> OutboundProxy:
    """`proxy.outbound` when the proxy was bound in `snapshot` (the server binds every proxy
    per snapshot), else derived for `snapshot` now."""
    if proxy.outbound is not None and proxy.snapshot_version == snapshot.version:
        return proxy.outbound
    return outbound_proxy(proxy, snapshot)


def outbound_proxy(proxy: Proxy, snapshot: Snapshot) -> OutboundProxy:
    """`proxy` as its outbound config sees it in `snapshot` (see `OutboundProxy`)."""
    index = snapshot.index
    tested = index.label_selectors()
    if proxy.type is ProxyType.ROUTER:
        tested = (*tested, *index.policy_selectors())
    labels = proxy.labels
    kept = {pair for selector in tested if all(labels.get(k) == v for k, v in selector) for pair in selector}
    redirected = proxy.interception is not InterceptionMode.NONE
    sidecar = select_sidecar(snapshot, proxy.type, proxy.namespace, labels)
    dns_port, dns_forward = dns_settings(proxy.node.metadata) if proxy.type is ProxyType.SIDECAR else (0, True)
    logs = access_logs(snapshot, proxy.namespace, labels)
    gateway = proxy.type is ProxyType.ROUTER
    traced = tracing(snapshot, proxy.namespace, labels, proxy.node.name, gateway=gateway)
    return OutboundProxy(
        type=proxy.type,
        namespace=proxy.namespace,
        domain=proxy.node.domain,
        label_pairs=tuple(sorted(kept)),
        interception=proxy.interception,
        ip=proxy.ip if redirected else "",
        family=proxy.family,
        locality=proxy.locality if index.has_dns_services else "",
        app_ports=app_ports(proxy, sidecar),
        mesh_certificates=proxy.node.mesh_certificates,
        dns_port=dns_port,
        dns_forward=dns_forward,
        credentials=proxy.node.credentials,
        client_logs=logs.client,
        client_tracing=traced.client,
        collectors=_collectors(logs, traced),
    )


def _collectors(logs: AccessLogs, traced: Tracing) -> tuple[Collector, ...]:
    """The collectors a proxy's tracing and access logs send to, once each, by cluster name."""
    found = {c.cluster: c for c in traced.collectors}
    for entry in (*logs.client, *logs.server):
        if entry.collector is not None and not entry.disabled:
            found.setdefault(entry.collector.cluster, entry.collector)
    return tuple(found[name] for name in sorted(found))


def select_sidecar(
    snapshot: Snapshot, proxy_type: ProxyType, namespace: str, labels: Mapping[str, str]
) -> Config | None:
    """The Sidecar that applies to a sidecar proxy: a selector match in its namespace, else that
    namespace's default (no selector), else the root namespace's default."""
    if proxy_type is not ProxyType.SIDECAR:
        return None
    candidates = _sidecars_of(snapshot, namespace)
    for c in candidates:
        selector = selector_labels(spec(c))
        if selector and labels_match(selector, labels):
            return c
    for c in candidates:
        if not selector_labels(spec(c)):
            return c
    for c in _sidecars_of(snapshot, snapshot.mesh.root_namespace):
        if not selector_labels(spec(c)):
            return c
    return None


def _sidecars_of(snapshot: Snapshot, namespace: str) -> tuple[Config, ...]:
    """A namespace's Sidecars, found once per snapshot (every proxy's binding asks)."""
    return snapshot.index.scoped(
        "sidecars", namespace, lambda: tuple(c for c in snapshot.of_kind("Sidecar") if c.namespace == namespace)
    )


def binds_to_port(capture_mode: int, interception: InterceptionMode) -> bool:
    """Istio's `getBindToPort`: DEFAULT follows the proxy, NONE binds, IPTABLES relies on redirection."""
    if capture_mode == sidecar_pb2.DEFAULT:
        return interception is InterceptionMode.NONE
    return bool(capture_mode == sidecar_pb2.NONE)


_LOCAL_BINDS = ("127.0.0.1", "::1", "0.0.0.0", "::")


def app_ports(proxy: Proxy, sidecar: Config | None) -> frozenset[int]:
    """Ports the workload's app itself listens on: the targets of its service endpoints, and
    the ports of the Sidecar's ingress `defaultEndpoint`s. A proxy without iptables must not
    bind outbound listeners on them. An endpoint port a Sidecar ingress listener binds is the
    proxy's (on the VM's address; the app is behind it on its defaultEndpoint), not the app's:
    Istio's own pattern of ingress 9080 to 127.0.0.1:8080 keeps outbound 127.0.0.1:9080."""
    ports = set(proxy.instance_ports)
    if sidecar is not None:
        taken = {
            ing.port.number
            for ing in spec(sidecar).ingress
            if binds_to_port(ing.capture_mode, proxy.interception) and (ing.bind or proxy.ip) not in _LOCAL_BINDS
        }
        ports -= taken
        for ing in spec(sidecar).ingress:
            host, sep, port = ing.default_endpoint.rpartition(":")
            if sep and port.isdigit() and not host.startswith("unix"):
                ports.add(int(port))
    return frozenset(ports)


def _any_sidecar_ingress(snapshot: Snapshot) -> bool:
    return any(spec(c).ingress for c in snapshot.of_kind("Sidecar"))


#: The config kinds `bind_proxy` (and the `outbound_proxy` it makes) reads of a snapshot: the
#: Sidecar that applies (and whether any binds an ingress address), the EnvoyFilters, WasmPlugins
#: and Telemetry that select it, Gateways (filters' and plugins' `targetRefs`). The label
#: selectors it keeps labels for (`SnapshotIndex.label_selectors`, `policy_selectors`) come from
#: other kinds too (VirtualService `sourceLabels`, DestinationRule and policy selectors), and are
#: compared themselves (`binding_version`), so an edit of those kinds that leaves every selector
#: as it was binds no proxy again.
BINDING_KINDS: frozenset[str] = frozenset({"Sidecar", "Gateway", "EnvoyFilter", "WasmPlugin", "Telemetry"})


def binding_version(snapshot: Snapshot, proxy_type: ProxyType) -> str:
    """A hash of everything `bind_proxy` reads of `snapshot` for a node of `proxy_type` but what
    is particular to the node (`binding_inputs`): the configs of `BINDING_KINDS`, the mesh
    settings, the label selectors (a router's include the policies'), and of the registry only
    what binding reads of it beyond its own address: whether any service resolves by DNS, the
    services the mesh's collectors resolve to, and the WorkloadGroups (an entry's service
    account). Two snapshots with equal versions bind a node with equal inputs to the same
    proxy, so a VirtualService edit, or a ServiceEntry elsewhere, need not bind the fleet again."""
    index = snapshot.index
    policies = index.policy_selectors() if proxy_type is ProxyType.ROUTER else ()
    collectors = tuple(resolve_collector(snapshot, p) for p in snapshot.mesh.providers.collectors)
    h = hashlib.blake2b(digest_size=12)
    h.update(snapshot.version_of(BINDING_KINDS, services=False).encode())
    h.update(snapshot.kind_digests.get("WorkloadGroup", b""))
    h.update(repr((index.label_selectors(), policies, index.has_dns_services, collectors)).encode())
    return h.hexdigest()


def binding_inputs(node: ProxyNode, snapshot: Snapshot) -> tuple[object, list[tuple[Service, Endpoint]]]:
    """What `bind_proxy` reads of `snapshot` beyond its `binding_version` (which leaves out
    WorkloadEntries and endpoints): the node's WorkloadEntry and the endpoints at its address.
    At one binding version, a node whose inputs are equal (the entry the very same object) binds
    to the same proxy, so an endpoint change need not bind the fleet again."""
    return _workload_entry(node, snapshot), snapshot.index.endpoints_at(node.ip)


def rebound(proxy: Proxy, snapshot: Snapshot) -> Proxy:
    """`proxy` as bound in `snapshot`, for a node whose binding version and inputs there are
    those it was bound with: binding it again would give the same proxy, so only the snapshot
    its `outbound` belongs to moves (`outbound_of` then takes it as it is)."""
    if proxy.snapshot_version == snapshot.version or proxy.outbound is None:
        return proxy
    # Every field by position: `dataclasses.replace` costs several times this, once per proxy
    # of the fleet on each change (a field added to Proxy must be added here:
    # tests/test_resolve_binding.py compares every field).
    p = proxy
    return Proxy(
        p.node,
        p.labels,
        p.workload,
        p.instances,
        p.address_in_config,
        p.outbound,
        snapshot.version,
        p.service_account,
        p.envoy_filters,
        p.access_logs,
        p.tracing,
        p.wasm_plugins,
    )


def _workload_entry(node: ProxyNode, snapshot: Snapshot) -> Any:
    named = snapshot.get("WorkloadEntry", node.namespace, node.name)
    return named if named is not None else snapshot.index.workload_entry_at(node.namespace, node.ip)
