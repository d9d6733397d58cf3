"""A proxy: a node bound to its workload in one snapshot, and what its generation is keyed on.

`Proxy` is what the generators read of the proxy they generate for; `OutboundProxy` is the far
smaller part outbound generation may read, shared by the proxies it is equal for. Both are made by
binding a node (`snapshot/binding.py`, whose docstring says how a node is bound); this module
holds the values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshctl.config.model import Config
from meshctl.registry.model import Endpoint, Service
from meshctl.snapshot.collectors import Collector
from meshctl.snapshot.envoy_filters import filters_key
from meshctl.snapshot.interception import InterceptionMode, dns_settings
from meshctl.snapshot.node import ProxyNode, ProxyType
from meshctl.snapshot.telemetry import NO_ACCESS_LOGS, AccessLogs, LogPlan
from meshctl.snapshot.tracing import NO_TRACING, TraceSide, Tracing
from meshctl.snapshot.wasm_plugins import plugins_key


@dataclass(frozen=True, slots=True)
class ServiceInstance:
    """This proxy's workload as an endpoint of a service: the source of an inbound listener."""

    service: Service
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class OutboundProxy:
    """All that outbound generation (the clusters, listeners and routes for the services a proxy
    calls; a router's Gateways) can read of a proxy: `ProxyScope` knows the proxy only through
    this, and the server shares the outbound part of the config between proxies whose
    OutboundProxy is equal (`ResourceCache`). The view is the key: an input a
    generator reads is in here, so it is keyed, by construction. It is far less than the
    proxy, so a whole namespace of VMs serving different services usually shares one:

    - labels only as far as the snapshot's selectors test them: the pairs that appear in some
      selector generation tests (`SnapshotIndex.label_selectors`, for a router also the policy
      selectors). A selector of that set matches these pairs exactly when it matches the full
      labels (every pair it needs is kept when it matches; none it lacks can be);
    - its own address only when traffic is redirected (Istio's listeners per endpoint skip it);
      otherwise only its family, which DNS lookups follow;
    - its workload's locality only where the mesh has DNS clusters (their inline endpoints get
      locality priorities);
    - the ports its app listens on (`app_ports`), where it binds no outbound listener;
    - its DNS listener's port (0: none) and whether it forwards names outside the mesh;
    - the access logs and tracing Telemetry gives its outbound listeners, resolved, and the
      collectors its logs and tracing send to. Tracing carries Istio's per-workload tags (the
      canonical service), so with tracing on, proxies of different services part ways.
    """

    type: ProxyType
    namespace: str
    domain: str
    label_pairs: tuple[tuple[str, str], ...]
    interception: InterceptionMode
    #: its own address when traffic is redirected to it, else ""
    ip: str
    #: "v4" or "v6"
    family: str
    locality: str
    app_ports: frozenset[int]
    mesh_certificates: bool
    dns_port: int = 0
    dns_forward: bool = True
    credentials: bool = True
    #: The access logs Telemetry gives its outbound listeners (`snapshot/telemetry.py`).
    client_logs: LogPlan = ()
    #: The tracing Telemetry gives its outbound listeners (`snapshot/tracing.py`).
    client_tracing: TraceSide | None = None
    #: The collectors its tracing and access logs (either side) send to: their clusters are
    #: sent whatever its Sidecar imports (`snapshot/collectors.py`).
    collectors: tuple[Collector, ...] = ()

    @property
    def labels(self) -> Mapping[str, str]:
        return dict(self.label_pairs)

    def describe(self) -> str:
        """Who shares this outbound config, for log lines (not one proxy: many may)."""
        return f"{self.type.value} proxies of namespace {self.namespace}"


@dataclass(frozen=True, slots=True, eq=False)
class Proxy:
    """A node bound to its workload in one snapshot."""

    node: ProxyNode
    labels: Mapping[str, str]
    #: The WorkloadEntry (`namespace/name`) or registry instance the proxy was bound to, if any.
    workload: str = ""
    instances: tuple[ServiceInstance, ...] = ()
    #: Whether the proxy's own address can appear in its config (see `generation_key`).
    address_in_config: bool = True
    #: What its outbound config is made of in the snapshot it was bound in (`outbound_proxy`);
    #: None for a proxy made by hand.
    outbound: OutboundProxy | None = None
    #: The version of the snapshot it was bound in, which `outbound` belongs to.
    snapshot_version: str = ""
    #: The service account its workload runs as (`snapshot/binding.py`); "" when it is bound
    #: to none, or (attested) to endpoints that disagree on one.
    service_account: str = ""
    #: The EnvoyFilters that apply to it, in patch order (`select_envoy_filters`).
    envoy_filters: tuple[Config, ...] = ()
    #: The access logs the Telemetries that select it add up to (`snapshot/telemetry.py`).
    access_logs: AccessLogs = NO_ACCESS_LOGS
    #: Its tracing, from the same Telemetries (`snapshot/tracing.py`).
    tracing: Tracing = NO_TRACING
    #: The WasmPlugins that apply to it, in run order (`select_wasm_plugins`).
    wasm_plugins: tuple[Config, ...] = ()

    @property
    def id(self) -> str:
        return self.node.id

    @property
    def type(self) -> ProxyType:
        return self.node.type

    @property
    def ip(self) -> str:
        return self.node.ip

    @property
    def namespace(self) -> str:
        return self.node.namespace

    @property
    def interception(self) -> InterceptionMode:
        return self.node.interception

    @property
    def locality(self) -> str:
        """Its workload's locality, as the registry knows it ("" when none)."""
        return _locality(self.instances)

    @property
    def instance_ports(self) -> frozenset[int]:
        """The ports its workload's app listens on as an endpoint of its services."""
        return frozenset(p for i in self.instances for p in i.endpoint.ports.values())

    def generation_key(self) -> tuple[object, ...]:
        """Everything about the proxy that generation reads: proxies with equal keys get the
        same config from the same snapshot. It is the key of the proxy's inbound config and of
        its whole view; the outbound part, most of the config, has the coarser `OutboundProxy`.

        The replicas of one service (same labels, same ports) share a key, as long as their own
        address appears nowhere in their config: it does with iptables (Istio's listeners per
        endpoint) and where a Sidecar ingress listener binds it; otherwise only its family
        (IPv4 or IPv6, for DNS lookups) counts.
        """
        inbound = tuple(
            sorted(
                (i.service.hostname, tuple(sorted(i.endpoint.ports.items())), i.endpoint.locality, i.endpoint.network)
                for i in self.instances
            )
        )
        return (
            self.node.type,
            self.node.namespace,
            self.node.domain,
            tuple(sorted(self.labels.items())),
            self.node.interception,
            self.node.ip if self.address_in_config else _family(self.node.ip),
            inbound,
            self.node.mesh_certificates,
            self.node.credentials,
            dns_settings(self.node.metadata) if self.node.type is ProxyType.SIDECAR else (0, True),
            *self.patch_key(),
            self.node.proxyless,
            self.access_logs,
            self.tracing,
        )

    def patch_key(self) -> tuple[object, ...]:
        """Everything EnvoyFilter patching reads of the proxy, besides its generated config: the
        filters that select it, what their proxy matches test (its version, its metadata), its
        type (the patch context) and the services of its inbound clusters (cluster matches).
        The WasmPlugins that select it are added at the same stage, before the patches. The
        server patches each part of a config under a narrower key (`envoyfilter_parts.part_key`:
        the patches the version and metadata let in, not the values), so proxies that differ here
        still share the patching of a part they share."""
        if not self.envoy_filters and not self.wasm_plugins:
            return ()
        metadata = tuple(sorted(map(str, self.node.metadata.items())))
        served = tuple(sorted({(i.service.hostname, p) for i in self.instances for p in i.endpoint.ports.values()}))
        patches = (filters_key(self.envoy_filters), self.node.proxy_version, metadata, self.node.type, served)
        return (*patches, plugins_key(self.wasm_plugins)) if self.wasm_plugins else patches

    @property
    def family(self) -> str:
        return _family(self.node.ip)


def _locality(instances: tuple[ServiceInstance, ...]) -> str:
    return next((i.endpoint.locality for i in instances if i.endpoint.locality), "")


def _family(ip: str) -> str:
    return "v6" if ":" in ip else "v4"
