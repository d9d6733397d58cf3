"""EnvoyFilter patches applied to a proxy's generated config: the last stage of generation.

Semantics follow pilot's envoyfilter package. Each resource is patched in the context it was
generated in: a router's are GATEWAY; a sidecar's inbound listeners (traffic direction INBOUND)
and `inbound|` clusters are SIDECAR_INBOUND, the rest SIDECAR_OUTBOUND. Within a listener the
order is Istio's: the listener (MERGE/REMOVE), its listener filters, its filter chains
(MERGE/REMOVE, then ADD), each chain's network filters, then each HTTP connection manager's HTTP
filters (and its inline route configuration, on inbound listeners). Patches of one kind are
applied in the order of their EnvoyFilters (`select_envoy_filters`) and, within one, as written.

ADD of a listener or cluster for ANY context happens once, as Istio's (whose duplicate is
dropped); one whose name the config already has is not added (Envoy would refuse the update).
ADD of an HTTP filter puts it before the router (a filter after it would never run; Envoy refuses
it), after the authentication filters for `filterClass: AUTHN`, after RBAC for `AUTHZ`.

Generated messages are shared between proxies and snapshots: nothing here mutates one; what is
patched is a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types
from meshctl.xds.envoyfilter_match import (
    EF,
    HCM,
    Patch,
    cluster_matches,
    compile_patches,
    context_matches,
    filter_chain_matches,
    filter_match_name,
    has_route_match,
    listener_filter_name,
    listener_matches,
    name_matches,
    route_configuration_matches,
    route_matches,
    sub_filter_name,
    virtual_host_matches,
)
from meshctl.xds.proto_merge import merge

Generated = Mapping[str, tuple[Message, ...]]
Patches = dict[int, list[Patch]]
M = TypeVar("M", bound=Message)

_ROUTER = "envoy.filters.http.router"
_AUTHN = frozenset({"envoy.filters.http.jwt_authn", "istio_authn", "envoy.filters.http.ext_authz_authn"})
_AUTHZ = frozenset({"envoy.filters.http.rbac", "envoy.filters.http.ext_authz"})


def _copy(message: M) -> M:
    out = type(message)()
    out.CopyFrom(message)
    return out


def apply_envoy_filters(config: Generated, proxy: Proxy) -> Generated:
    """`config` with the patches of the proxy's EnvoyFilters applied (the same object when none
    applies)."""
    if not proxy.envoy_filters:
        return config
    patches = compile_patches(proxy.envoy_filters, proxy.node.proxy_version, proxy.node.metadata)
    if not patches:
        return config
    gateway = proxy.type is ProxyType.ROUTER
    out = dict(config)
    for type_url, patched in patch_resources(config, patches, gateway, inbound_hosts(proxy)).items():
        out[type_url] = tuple(m for m in patched if m is not None)
    names = {t: {m.name for m in out[t]} for t in (types.CLUSTER, types.LISTENER)}  # type: ignore[attr-defined]
    for type_url, added in added_resources(patches, gateway, names).items():
        out[type_url] = (*out[type_url], *added)
    return MappingProxyType(out)


#: What patches of each kind rework: a listener's, its filter chains and filters; a route
#: configuration's (and a sidecar's inbound listeners' inline ones).
LISTENER_PATCHES = frozenset({EF.LISTENER, EF.FILTER_CHAIN, EF.NETWORK_FILTER, EF.HTTP_FILTER, EF.LISTENER_FILTER})
ROUTE_PATCHES = frozenset({EF.ROUTE_CONFIGURATION, EF.VIRTUAL_HOST, EF.HTTP_ROUTE})


def patch_resources(
    config: Generated, patches: Patches, gateway: bool, hosts: Mapping[str, frozenset[str]]
) -> dict[str, list[Message | None]]:
    """Every operation but the ADD of a cluster or a listener: each resource of `config` patched
    alone (its context is its own), in a list aligned with `config`'s (None where a patch removes
    it), for the types some patch reworks. A resource no patch changes is the same object (but
    for listeners, always copied). Alone, because nothing of one resource's patching reads
    another's: the server patches a part of a config at a time (`envoyfilter_parts`)."""
    out: dict[str, list[Message | None]] = {}
    if EF.CLUSTER in patches:
        out[types.CLUSTER] = [_cluster(c, patches[EF.CLUSTER], gateway, hosts) for c in config[types.CLUSTER]]
    if patches.keys() & LISTENER_PATCHES or (patches.keys() & ROUTE_PATCHES and not gateway):  # inline routes
        out[types.LISTENER] = [_patched_listener(listener, patches, gateway) for listener in config[types.LISTENER]]
    if patches.keys() & ROUTE_PATCHES:
        context = EF.GATEWAY if gateway else EF.SIDECAR_OUTBOUND
        out[types.ROUTE] = [_route_configuration(_copy(rc), patches, context) for rc in config[types.ROUTE]]
    return out


def added_resources(patches: Patches, gateway: bool, names: Mapping[str, set[str]]) -> dict[str, list[Message]]:
    """The clusters and listeners ADD patches make whose names `names` (by type, the config's
    after the other operations; updated here) does not hold yet. An ADD for ANY context is made
    once, outbound, as Istio's (whose duplicate is dropped)."""
    out: dict[str, list[Message]] = {}
    for apply_to, type_url in ((EF.CLUSTER, types.CLUSTER), (EF.LISTENER, types.LISTENER)):
        adds = [p for p in patches.get(apply_to, ()) if p.operation == EF.Patch.ADD]
        if not adds:
            continue
        seen = names[type_url]
        made = _added(adds, EF.GATEWAY if gateway else EF.SIDECAR_OUTBOUND, seen)
        if not gateway:
            made.extend(_added([p for p in adds if p.context == EF.SIDECAR_INBOUND], EF.SIDECAR_INBOUND, seen))
        if made:
            out[type_url] = made
    return out


def _added(patches: Iterable[Patch], context: int, names: set[str]) -> list[Any]:
    """The values of ADD patches for `context` whose names are new."""
    out = []
    for p in patches:
        if p.operation == EF.Patch.ADD and context_matches(p, context):
            value = p.new_value()
            if value.name not in names:
                names.add(value.name)
                out.append(value)
    return out


# --- clusters -----------------------------------------------------------------------------


def inbound_hosts(proxy: Proxy) -> dict[str, frozenset[str]]:
    """The services each `inbound|PORT||` cluster of the proxy serves, which a cluster match's
    `service` names (Istio matches an inbound cluster by its services' hostnames)."""
    hosts: dict[str, set[str]] = {}
    for instance in proxy.instances:
        for port in instance.endpoint.ports.values():
            hosts.setdefault(f"inbound|{port}||", set()).add(instance.service.hostname)
    return {name: frozenset(h) for name, h in hosts.items()}


def cluster_context(name: str, gateway: bool) -> int:
    """The patch context of a cluster: its own, by its name."""
    return EF.GATEWAY if gateway else EF.SIDECAR_INBOUND if name.startswith("inbound|") else EF.SIDECAR_OUTBOUND


def _cluster(cluster: Message, patches: list[Patch], gateway: bool, hosts: Mapping[str, frozenset[str]]) -> Any:
    """One cluster with the MERGE and REMOVE patches applied (None: removed; the same object
    when none applies)."""
    name = cluster.name  # type: ignore[attr-defined]
    context = cluster_context(name, gateway)
    patched: Any = cluster
    for p in patches:
        if p.operation not in (EF.Patch.MERGE, EF.Patch.REMOVE) or not context_matches(p, context):
            continue
        if not cluster_matches(patched.name, p, hosts.get(name, frozenset())):
            continue
        if p.operation == EF.Patch.REMOVE:
            return None
        if patched is cluster:
            patched = _copy(cluster)
        _merge_cluster(patched, p.value)
    return patched


def _merge_cluster(cluster: Any, value: Any) -> None:
    """A cluster's MERGE as Istio's: a transport socket in the patch merges into the cluster's
    transport socket matches of the same socket name when it has matches (and is added nowhere
    else), into its transport socket of the same name, or replaces one of another name."""
    if not value.HasField("transport_socket"):
        merge(cluster, value)
        return
    socket = value.transport_socket
    rest = _copy(value)
    rest.ClearField("transport_socket")
    if cluster.transport_socket_matches:
        for tsm in cluster.transport_socket_matches:
            if tsm.transport_socket.name == socket.name:
                merge(tsm.transport_socket, socket)
    elif cluster.HasField("transport_socket") and cluster.transport_socket.name == socket.name:
        merge(cluster.transport_socket, socket)
    else:
        cluster.transport_socket.CopyFrom(socket)
    merge(cluster, rest)


# --- listeners ----------------------------------------------------------------------------


def listener_context(listener: Any, gateway: bool) -> int:
    """The patch context of a listener: its own, by its traffic direction."""
    if gateway:
        return EF.GATEWAY
    inbound = listener.traffic_direction == base_pb2.TrafficDirection.INBOUND
    return EF.SIDECAR_INBOUND if inbound else EF.SIDECAR_OUTBOUND


def _patched_listener(original: Message, patches: Patches, gateway: bool) -> Any:
    """A patched copy of one listener, None when a patch removes it."""
    listener: Any = _copy(original)
    return listener if _listener(listener, patches, listener_context(listener, gateway)) else None


def _applicable(patches: Patches, apply_to: int, context: int, test: Callable[[Patch], bool]) -> list[Patch]:
    return [p for p in patches.get(apply_to, ()) if context_matches(p, context) and test(p)]


def _listener(listener: Any, patches: Patches, context: int) -> bool:
    """Patch one listener in place; False when a patch removes it."""
    for p in _applicable(patches, EF.LISTENER, context, lambda p: listener_matches(listener, p)):
        if p.operation == EF.Patch.REMOVE:
            return False
        if p.operation == EF.Patch.MERGE:
            merge(listener, p.value)  # type: ignore[arg-type]
    lf = _applicable(patches, EF.LISTENER_FILTER, context, lambda p: listener_matches(listener, p))
    if lf:
        kept = _list_operation(list(listener.listener_filters), lf, _by_name(listener_filter_name), _merge_filter)
        del listener.listener_filters[:]
        listener.listener_filters.extend(kept)
    chain_patches = _applicable(patches, EF.FILTER_CHAIN, context, lambda p: listener_matches(listener, p))
    kept_chains = [c for c in listener.filter_chains if _chain(listener, c, chain_patches, patches, context)]
    kept_chains.extend(p.new_value() for p in chain_patches if p.operation == EF.Patch.ADD)
    del listener.filter_chains[:]
    listener.filter_chains.extend(kept_chains)
    if listener.HasField("default_filter_chain") and not _chain(
        listener, listener.default_filter_chain, chain_patches, patches, context
    ):
        listener.ClearField("default_filter_chain")
    return True


def _chain(listener: Any, chain: Any, chain_patches: list[Patch], patches: Patches, context: int) -> bool:
    """Patch one filter chain in place; False when a patch removes it."""
    for p in chain_patches:
        if p.operation in (EF.Patch.MERGE, EF.Patch.REMOVE) and filter_chain_matches(listener, chain, p):
            if p.operation == EF.Patch.REMOVE:
                return False
            merge(chain, p.value)  # type: ignore[arg-type]

    def here(p: Patch) -> bool:
        return listener_matches(listener, p) and filter_chain_matches(listener, chain, p)

    network = _applicable(patches, EF.NETWORK_FILTER, context, here)
    filters = list(chain.filters)
    if network:
        filters = _list_operation(filters, network, _by_name(filter_match_name), _merge_filter)
    http = _applicable(patches, EF.HTTP_FILTER, context, here)
    routes = context == EF.SIDECAR_INBOUND and any(
        k in patches for k in (EF.ROUTE_CONFIGURATION, EF.VIRTUAL_HOST, EF.HTTP_ROUTE)
    )
    for f in filters:
        is_hcm = name_matches(HCM, f.name) and f.typed_config.type_url.endswith(".HttpConnectionManager")
        if is_hcm and (http or routes):
            hcm = hcm_pb2.HttpConnectionManager.FromString(f.typed_config.value)
            wanted = [p for p in http if not filter_match_name(p) or name_matches(filter_match_name(p), f.name)]
            if wanted:
                by = _by_name(sub_filter_name)
                kept = _list_operation(list(hcm.http_filters), wanted, by, _merge_filter, _add_http)
                del hcm.http_filters[:]
                hcm.http_filters.extend(kept)
            if routes and hcm.HasField("route_config"):
                _route_configuration(hcm.route_config, patches, context)
            f.typed_config.Pack(hcm, deterministic=True)
    del chain.filters[:]
    chain.filters.extend(filters)
    return True


def _by_name(wanted_of: Callable[[Patch], str]) -> tuple[Callable[[Any, Patch], bool], Callable[[Patch], bool]]:
    """(does an item match the patch, does the patch name an item at all) for named items."""

    def matches(item: Any, p: Patch) -> bool:
        wanted = wanted_of(p)
        return not wanted or name_matches(wanted, item.name)

    return matches, lambda p: bool(wanted_of(p))


def _merge_filter(item: Any, p: Patch) -> None:
    """A filter's MERGE as Istio's: the patch's name, if any, renames it; its typed config is
    merged with the patch's, read as the filter's own type (a v2 `@type` still merges). A filter
    without a typed config is left alone."""
    value: Any = p.value
    if not item.HasField("typed_config"):
        return
    if value.name:
        item.name = value.name
    if value.HasField("typed_config"):
        patch = any_pb2.Any(type_url=item.typed_config.type_url, value=value.typed_config.value)
        merge(item.typed_config, patch)


def _add_http(items: list[Any], p: Patch) -> None:
    """ADD of an HTTP filter, placed by its filter class (see the module docstring)."""
    value = p.new_value()
    if p.filter_class in (EF.Patch.AUTHN, EF.Patch.AUTHZ):
        group = _AUTHN if p.filter_class == EF.Patch.AUTHN else _AUTHZ
        last = max((i for i, f in enumerate(items) if f.name in group), default=-1)
        if last >= 0:
            items.insert(last + 1, value)
            return
    router = next((i for i, f in enumerate(items) if name_matches(_ROUTER, f.name)), len(items))
    items.insert(router, value)


def _list_operation(
    items: list[Any],
    patches: list[Patch],
    by: tuple[Callable[[Any, Patch], bool], Callable[[Patch], bool]],
    merge_item: Callable[[Any, Patch], None],
    add: Callable[[list[Any], Patch], None] | None = None,
) -> list[Any]:
    """Istio's operations on an ordered list of named filters, in two passes: first ADD (appends,
    or `add` places), INSERT_FIRST (always first), INSERT_BEFORE/AFTER (around the first match;
    first or last when the patch names no filter), REPLACE (the first match) and REMOVE (every
    match), patch by patch; then MERGE, into every filter the patch names."""
    matches, names_one = by
    for p in patches:
        op = p.operation
        if op == EF.Patch.ADD:
            if add is not None:
                add(items, p)
            else:
                items.append(p.new_value())
        elif op == EF.Patch.INSERT_FIRST:
            items.insert(0, p.new_value())
        elif op in (EF.Patch.INSERT_BEFORE, EF.Patch.INSERT_AFTER):
            before = op == EF.Patch.INSERT_BEFORE
            if not names_one(p):
                items.insert(0 if before else len(items), p.new_value())
                continue
            first = next((n for n, i in enumerate(items) if matches(i, p)), -1)
            if first >= 0:
                items.insert(first if before else first + 1, p.new_value())
        elif op == EF.Patch.REPLACE and names_one(p):
            first = next((n for n, i in enumerate(items) if matches(i, p)), -1)
            if first >= 0:
                items[first] = p.new_value()
        elif op == EF.Patch.REMOVE and names_one(p):
            items = [i for i in items if not matches(i, p)]
    for item in items:
        for p in patches:
            if p.operation == EF.Patch.MERGE and names_one(p) and matches(item, p):
                merge_item(item, p)
    return items


def _route_list(routes: list[Any], patches: list[Patch]) -> list[Any]:
    """Istio's route operations: REMOVE and MERGE on every route each matches (all, when the
    patch names none), then ADD (appends), INSERT_BEFORE/AFTER (around the first match; first
    or last without a route match) and INSERT_FIRST (first, when a route matches or none is
    named)."""
    kept = []
    for route in routes:
        for p in patches:
            if p.operation in (EF.Patch.MERGE, EF.Patch.REMOVE) and route_matches(route, p):
                if p.operation == EF.Patch.REMOVE:
                    break
                merge(route, p.value)  # type: ignore[arg-type]
        else:
            kept.append(route)
    for p in patches:
        op = p.operation
        if op == EF.Patch.ADD:
            kept.append(p.new_value())
        elif op in (EF.Patch.INSERT_BEFORE, EF.Patch.INSERT_AFTER, EF.Patch.INSERT_FIRST):
            if not has_route_match(p):
                kept.insert(len(kept) if op == EF.Patch.INSERT_AFTER else 0, p.new_value())
                continue
            first = next((n for n, r in enumerate(kept) if route_matches(r, p)), -1)
            if first >= 0:
                where = first + 1 if op == EF.Patch.INSERT_AFTER else first if op == EF.Patch.INSERT_BEFORE else 0
                kept.insert(where, p.new_value())
    return kept


# --- routes -------------------------------------------------------------------------------


def _route_configuration(rc: Any, patches: Patches, context: int) -> Any:
    """Patch one route configuration in place (a copy, or an inbound listener's inline one)."""

    def here(p: Patch) -> bool:
        return route_configuration_matches(rc.name, p, context)

    for p in _applicable(patches, EF.ROUTE_CONFIGURATION, context, here):
        if p.operation == EF.Patch.MERGE:
            merge(rc, p.value)  # type: ignore[arg-type]
    vhost_patches = _applicable(patches, EF.VIRTUAL_HOST, context, here)
    route_patches = _applicable(patches, EF.HTTP_ROUTE, context, here)
    if not (vhost_patches or route_patches):
        return rc
    vhosts = []
    for original in rc.virtual_hosts:
        vhost = original
        removed = False
        for p in vhost_patches:
            if p.operation in (EF.Patch.MERGE, EF.Patch.REMOVE, EF.Patch.REPLACE) and virtual_host_matches(vhost, p):
                if p.operation == EF.Patch.REMOVE:
                    removed = True
                    break
                if p.operation == EF.Patch.REPLACE:
                    vhost = p.new_value()
                else:
                    merge(vhost, p.value)  # type: ignore[arg-type]
        if removed:
            continue
        wanted = [p for p in route_patches if virtual_host_matches(vhost, p)]
        if wanted:
            kept = _route_list(list(vhost.routes), wanted)
            del vhost.routes[:]
            vhost.routes.extend(kept)
        vhosts.append(vhost)
    vhosts.extend(_added(vhost_patches, context, {v.name for v in vhosts}))
    del rc.virtual_hosts[:]
    rc.virtual_hosts.extend(vhosts)
    return rc
