"""All of a proxy's Envoy config from one snapshot: the one entry point to the generators.

Each xDS type has its own module of pure functions over a `ProxyScope` (itself a pure function
of the snapshot and the proxy). The server, `meshctl dump` and `meshctl diff` all come through
here, so what a command prints is what the server sends.

A proxy's config has two parts with their own inputs: outbound (the services it calls, most of
the config, the same for a whole namespace of VMs as a rule: `OutboundProxy`) and inbound
(its own workload: `InboundView`, its only input). The server generates and shares each part on its
own key; `generate_config` joins them, so every caller sees the same whole.

Endpoints are the exception to per-proxy generation: a ClusterLoadAssignment depends only on the
snapshot and the cluster's name, so the server builds each once (`load_assignment`) and shares it
across every proxy, and rebuilds only those whose service's endpoints changed. Where a locality
rule or a failoverPriority is in force, a proxy gets a variant (`eds_locality`), shared by the
proxies that rule reads alike (the same locality, the same values of the labels it names).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf.message import Message

from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import types
from meshctl.xds.access_log import with_access_log
from meshctl.xds.cluster_common import merge_clusters
from meshctl.xds.clusters import ClusterMemo, build_outbound_clusters
from meshctl.xds.clusters_inbound import build_inbound_clusters
from meshctl.xds.eds_locality import build_variant, eds_localities
from meshctl.xds.endpoints import assignment_view, build_load_assignment
from meshctl.xds.envoyfilter import apply_envoy_filters
from meshctl.xds.inbound_view import InboundView, inbound_view
from meshctl.xds.listener_memo import ListenerMemo
from meshctl.xds.listeners import build_inbound_listeners, build_outbound_listeners, sort_listeners
from meshctl.xds.memo import GenerationMemo
from meshctl.xds.names import eds_cluster_names
from meshctl.xds.resources import Serialized
from meshctl.xds.route_memo import RouteMemo
from meshctl.xds.routes import build_route_resources, build_routes
from meshctl.xds.tracing import with_tracing
from meshctl.xds.wasm import apply_wasm_plugins

Generated = Mapping[str, tuple[Message, ...]]
#: Generated config where some resources are already their bytes (`Serialized`): what the
#: server serializes, and nothing decodes.
Assembled = Mapping[str, tuple[Message | Serialized, ...]]

#: The config kinds outbound cluster generation reads, besides the registry's services (and so
#: ServiceEntries and WorkloadEntries) and the mesh settings: which DestinationRule applies and
#: what it says, which services a Sidecar imports, the namespaces' mutual TLS mode (auto mTLS),
#: and a gateway's RequestAuthentication keys (JWKS clusters). Not VirtualServices, Gateways or
#: AuthorizationPolicies: the server keeps outbound clusters across changes of those
#: (`Snapshot.version_of(CLUSTER_KINDS)` is their config version). Declared here, next to the
#: generators, and checked by a test that takes away every other kind and finds no cluster changed.
CLUSTER_KINDS: frozenset[str] = frozenset({"DestinationRule", "Sidecar", "PeerAuthentication", "RequestAuthentication"})
#: The config kinds inbound generation reads (`InboundView`), besides the proxy (its generation
#: key), the registry's services and the mesh settings: the Sidecar that applies, the
#: DestinationRules of its own services, and the policies that select it. Not VirtualServices,
#: Gateways or EnvoyFilters: the server keeps each key's inbound view and part across changes of
#: those (`Snapshot.version_of(INBOUND_KINDS)`). Checked like `CLUSTER_KINDS`.
INBOUND_KINDS: frozenset[str] = frozenset(
    {"Sidecar", "DestinationRule", "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication"}
)
#: What assignments read beyond the registry (`AssignmentView`): the subsets' labels.
ASSIGNMENT_KINDS: frozenset[str] = frozenset({"DestinationRule"})
#: Kinds outbound parts read only through a traced lookup, so they are not in a part's version:
#: DestinationRules, asked for by host through `ProxyScope.destination_rule` alone. A part notes
#: each rule it asked for (`rule_trace`) and is kept across a rule change when every rule it
#: asked for is the same: a rule for a host only one namespace imports regenerates that
#: namespace's part alone (Istio's per-proxy dependency check, for this kind).
TRACED_KINDS: frozenset[str] = frozenset({"DestinationRule"})
#: Kinds no part reads: EnvoyFilters patch a proxy's parts after they are generated, a part at a
#: time (`envoyfilter_parts.py`), keyed by the patches that apply to the proxy (`Proxy.patch_key`).
PATCH_KINDS: frozenset[str] = frozenset({"EnvoyFilter"})
#: Kinds no part reads from the snapshot: Telemetry is resolved when a proxy is bound, into its
#: keys (`OutboundProxy.client_logs`/`client_tracing`/`collectors`, `Proxy.access_logs`/`tracing`),
#: so a Telemetry change regenerates only the parts of the proxies whose logs or tracing it changes.
#: WasmPlugins too: resolved into `Proxy.wasm_plugins` and added with the patches (`finish_config`).
BOUND_KINDS: frozenset[str] = frozenset({"Telemetry", "WasmPlugin"})
#: The kinds of proxy whose outbound parts read the registry only as far as their scope sees it,
#: so a part is kept across a service change outside it: the services the scope sees
#: (`ProxyScope.services`, and through them the DNS table, loopback addresses, dynamic forward
#: proxy, passthrough and sniffing), for those hosts their endpoints where CDS or a listener
#: carries them and their workloads' identities; a host beyond that only as a collector
#: (`OutboundProxy.collectors`), a DestinationRule asked for (`rule_trace`) or a short name
#: resolved, by a VirtualService's or rule's host (`SnapshotIndex.short_hosts`) or through
#: `ProxyScope.resolve` (`name_trace`: route destinations). `TracedPart` checks each of these;
#: a new way of reading the services must be one of them. Not routers: a Gateway's servers
#: route to any host, so their parts stay keyed on every service.
SCOPED_SERVICES: frozenset[ProxyType] = frozenset({ProxyType.SIDECAR})


def generate_config(snapshot: Snapshot, proxy: Proxy) -> Generated:
    """Clusters, listeners and routes for `proxy` (everything but endpoints), by type URL."""
    scope = ProxyScope(snapshot, proxy)
    return finish_config(merge_config(_outbound(scope), generate_inbound(inbound_view(scope))), proxy)


def unpatched_config(snapshot: Snapshot, proxy: Proxy) -> Generated:
    """`generate_config` before its last stage (`finish_config`): what EnvoyFilters patch."""
    scope = ProxyScope(snapshot, proxy)
    return merge_config(_outbound(scope), generate_inbound(inbound_view(scope)))


def finish_config(config: Generated, proxy: Proxy) -> Generated:
    """The last stage of generation, on a proxy's joined config: its WasmPlugins' filters, then
    its EnvoyFilters' patches (which see the plugins, as in Istio). Keyed by `Proxy.patch_key`."""
    return apply_envoy_filters(apply_wasm_plugins(config, proxy), proxy)


class GenerationMemos:
    """What the server keeps between generations: the parts made from views (`memo`), shared by
    every proxy and every snapshot whose view of them is the same. Call `advance` on each new
    config version, so the parts no current proxy uses go."""

    def __init__(self) -> None:
        self.clusters: ClusterMemo = GenerationMemo()
        self.routes = RouteMemo()
        self.listeners = ListenerMemo()

    def advance(self) -> None:
        self.clusters.advance()
        self.routes.advance()
        self.listeners.advance()


def generate_outbound(snapshot: Snapshot, proxy: OutboundProxy, memos: GenerationMemos | None = None) -> Generated:
    """The part of `generate_config` for the services the proxy calls (a router: its Gateways),
    from its `OutboundProxy` alone: the server shares it between proxies with equal ones, and
    with `memos` each service port's clusters between them and between snapshots."""
    return _outbound(ProxyScope(snapshot, proxy), memos)


def generate_outbound_clusters(
    snapshot: Snapshot,
    proxy: OutboundProxy,
    memos: GenerationMemos | None = None,
    rule_trace: dict[str, object] | None = None,
    name_trace: set[tuple[str, str]] | None = None,
    *,
    only: Collection[str] | None = None,
    host_trace: dict[str, tuple[str, ...]] | None = None,
) -> tuple[Message, ...]:
    """The clusters of `generate_outbound` alone: they read only `CLUSTER_KINDS` of the configs,
    so the server keeps them while other kinds change. With `rule_trace`, every
    DestinationRule asked for is noted there (see `TRACED_KINDS`), with `name_trace` every short
    name resolved (see `SCOPED_SERVICES`), with `host_trace` each service's cluster names by
    host; with `only`, the clusters of those hosts' services and the catch-alls alone (what a
    part kept across a change of those services needs made again)."""
    scope = ProxyScope(snapshot, proxy)
    scope.rule_trace = rule_trace
    scope.name_trace = name_trace
    memo = memos.clusters if memos is not None else None
    return tuple(build_outbound_clusters(scope, memo, only=only, host_trace=host_trace))


def generate_outbound_listeners_and_routes(
    snapshot: Snapshot,
    proxy: OutboundProxy,
    memos: GenerationMemos | None = None,
    rule_trace: dict[str, object] | None = None,
    name_trace: set[tuple[str, str]] | None = None,
) -> Assembled:
    """The listeners and routes of `generate_outbound` (no clusters), for the server, which
    serializes them: with `memos`, route translations are reused across proxies and snapshots
    where they read the same, and a sidecar's route configurations come as their bytes,
    assembled from virtual hosts serialized once (`build_route_resources`); with
    `rule_trace`, every DestinationRule asked for is noted there, with `name_trace` every short
    name resolved."""
    scope = ProxyScope(snapshot, proxy)
    scope.rule_trace = rule_trace
    scope.name_trace = name_trace
    parts: dict[str, tuple[Message | Serialized, ...]] = {
        types.CLUSTER: (),
        **_outbound_listeners_and_routes(scope, memos, routes=memos is None),
    }
    if memos is not None:
        parts[types.ROUTE] = tuple(build_route_resources(scope, memos.routes))
    return MappingProxyType(parts)


def generate_inbound(view: InboundView) -> Generated:
    """The part of `generate_config` for the proxy's own workload: inbound clusters and
    listeners, from its `InboundView` alone (which the server shares it by)."""
    return MappingProxyType(
        {
            types.CLUSTER: tuple(build_inbound_clusters(view)),
            types.LISTENER: tuple(
                with_tracing(
                    with_access_log(build_inbound_listeners(view), view.mesh, view.server_logs), view.server_tracing
                )
            ),
            types.ROUTE: (),
        }
    )


def merge_config(outbound: Generated, inbound: Generated) -> Generated:
    """One proxy's config from its two parts, each type sorted by name as the parts are."""
    return MappingProxyType(
        {
            types.CLUSTER: tuple(merge_clusters(outbound[types.CLUSTER], inbound[types.CLUSTER])),
            types.LISTENER: tuple(sort_listeners([*outbound[types.LISTENER], *inbound[types.LISTENER]])),
            types.ROUTE: outbound[types.ROUTE] + inbound[types.ROUTE],
        }
    )


def _outbound(scope: ProxyScope, memos: GenerationMemos | None = None) -> Generated:
    return MappingProxyType(
        {types.CLUSTER: _outbound_clusters(scope, memos), **_outbound_listeners_and_routes(scope, memos)}
    )


def _outbound_clusters(scope: ProxyScope, memos: GenerationMemos | None) -> tuple[Message, ...]:
    return tuple(build_outbound_clusters(scope, memos.clusters if memos is not None else None))


def _outbound_listeners_and_routes(
    scope: ProxyScope, memos: GenerationMemos | None, *, routes: bool = True
) -> dict[str, tuple[Message, ...]]:
    memo = memos.listeners if memos is not None else None
    listeners = with_tracing(
        with_access_log(build_outbound_listeners(scope, memo), scope.snapshot.mesh, scope.proxy.client_logs),
        scope.proxy.client_tracing,
    )
    out: dict[str, tuple[Message, ...]] = {types.LISTENER: tuple(listeners)}
    if routes:
        out[types.ROUTE] = tuple(build_routes(scope, memos.routes if memos is not None else None))
    return out


def load_assignment(snapshot: Snapshot, cluster_name: str) -> endpoint_pb2.ClusterLoadAssignment:
    """The endpoints of one EDS cluster; the same for every proxy that has the cluster."""
    return build_load_assignment(snapshot, cluster_name)


def generate(snapshot: Snapshot, proxy: Proxy) -> Generated:
    """Every resource of every type for `proxy`, keyed by type URL, each sorted by name."""
    config = generate_config(snapshot, proxy)
    names = sorted(eds_cluster_names(config[types.CLUSTER]))
    views = eds_localities(snapshot, proxy, names)
    endpoints = tuple(
        build_variant(assignment_view(snapshot, n), views[n]) if n in views else load_assignment(snapshot, n)
        for n in names
    )
    out: dict[str, tuple[Message, ...]] = {
        types.CLUSTER: config[types.CLUSTER],
        types.ENDPOINT: endpoints,
        types.LISTENER: config[types.LISTENER],
        types.ROUTE: config[types.ROUTE],
    }
    return MappingProxyType(out)
