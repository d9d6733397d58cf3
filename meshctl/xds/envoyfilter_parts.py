"""EnvoyFilter patches and WasmPlugins on serialized resources, one part of a config at a time.

The server holds a sidecar's config as two parts of serialized resources joined per proxy: the
outbound part, shared by every proxy with the same `OutboundProxy`, and the proxy's own inbound
part (`server/cache.py`). Patching the joined config would decode and serialize again every
resource of every proxy a filter selects. Instead:

- Every operation but the ADD of a cluster or a listener reads and writes one resource alone, in
  the resource's own context (`patch_resources`), and so does placing a WasmPlugin's filter (one
  listener at a time): each part is finished on its own, once per part and `PatchPlan.key`, so
  the proxies that share an outbound part share its patching.
- A resource no patch can touch keeps its bytes (and its interned `Resource`): clusters and route
  configurations are tested by name before anything is decoded (the patches of a kind run in
  order, and the first to change a resource matches it as it was, by its name), listeners are
  decoded when a patch or a plugin reworks any.
- ADDs run once, on the joined names (`added_resources`), as `apply_envoy_filters` runs them.
- A split would differ where a name changes (a MERGE whose value names a cluster, listener or
  route configuration may meet a name of the other part) or where the parts share a name (the
  join keeps the outbound one): there the joined config is finished as one part
  (`PatchPlan.splits`; the caller checks the names).

The result is, byte for byte, what `finish_config` makes of the joined messages.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.message import Message

from meshctl.config.model import Config
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.wasm_plugins import plugins_key
from meshctl.xds import types
from meshctl.xds.envoyfilter import (
    LISTENER_PATCHES,
    ROUTE_PATCHES,
    Patches,
    added_resources,
    cluster_context,
    inbound_hosts,
    patch_resources,
)
from meshctl.xds.envoyfilter_match import (
    EF,
    applies,
    cluster_matches,
    compiled,
    context_matches,
    route_configuration_matches,
)
from meshctl.xds.names import eds_cluster_names
from meshctl.xds.resources import Resource, decode_resource, to_resource
from meshctl.xds.wasm import apply_wasm_plugins

TYPES = (types.CLUSTER, types.LISTENER, types.ROUTE)
#: A filter's identity and content, as the report and the keys name it.
FilterId = tuple[object, str]
_RENAMING = (EF.CLUSTER, EF.LISTENER, EF.ROUTE_CONFIGURATION)


@dataclass(frozen=True, slots=True, eq=False)
class PatchPlan:
    """What finishing a proxy's config reads of the proxy: the patches whose proxy match takes it
    in (all, and each filter's own, for the report), its kind, its WasmPlugins and the services
    of its inbound clusters. `key` names all of it but the services (`part_key` adds those a
    part's clusters need)."""

    proxy: Proxy
    patches: Patches
    filters: tuple[tuple[Config, Patches], ...]
    gateway: bool
    hosts: Mapping[str, frozenset[str]]
    key: tuple[object, ...]
    #: whether the parts may be finished apart: no patch renames a resource
    splits: bool
    #: whether a patch ADDs a cluster or listener (`added`, on the joined names)
    adds: bool


def patch_plan(proxy: Proxy) -> PatchPlan | None:
    """The proxy's plan; None when nothing applies (no patch takes it in, no plugin)."""
    version, metadata = proxy.node.proxy_version, proxy.node.metadata
    patches: Patches = {}
    filters = []
    chosen_key = []
    for config in proxy.envoy_filters:
        compiled_patches = compiled(config)
        chosen = tuple(i for i, p in enumerate(compiled_patches) if applies(p, version, metadata))
        if not chosen:
            continue
        own: Patches = {}
        for i in chosen:
            patch = compiled_patches[i]
            own.setdefault(patch.apply_to, []).append(patch)
            patches.setdefault(patch.apply_to, []).append(patch)
        filters.append((config, own))
        chosen_key.append((config.key, config.content_digest(), chosen))
    if not filters and not proxy.wasm_plugins:
        return None
    gateway = proxy.type is ProxyType.ROUTER
    renames = any(
        p.operation == EF.Patch.MERGE and p.value is not None and getattr(p.value, "name", "")
        for apply_to in _RENAMING
        for p in patches.get(apply_to, ())
    )
    adds = any(p.operation == EF.Patch.ADD for kind in (EF.CLUSTER, EF.LISTENER) for p in patches.get(kind, ()))
    return PatchPlan(
        proxy,
        patches,
        tuple(filters),
        gateway,
        inbound_hosts(proxy),
        (gateway, tuple(chosen_key), plugins_key(proxy.wasm_plugins)),
        not renames,
        adds,
    )


def part_key(plan: PatchPlan, clusters: Container[str]) -> tuple[object, ...]:
    """What finishing a part with `clusters` reads of the proxy: the plan, and the services of
    those of its inbound clusters the part has (none, for an outbound part)."""
    return (plan.key, tuple(sorted((n, h) for n, h in plan.hosts.items() if n in clusters)))


@dataclass(frozen=True, slots=True, eq=False)
class FinishedPart:
    """A part finished: the resources of each type it reworked (the others are as they were),
    the names of its EDS clusters, and the filters that, applied alone, change something in it."""

    by_type: Mapping[str, list[Resource]]
    eds_names: tuple[str, ...]
    changed_by: frozenset[FilterId]
    #: how many resources were decoded to be patched (the rest kept their bytes)
    decoded: int


def finish_part(resources: Mapping[str, Sequence[Resource]], eds_names: Iterable[str], plan: PatchPlan) -> FinishedPart:
    """`resources` (by type) with the plan's plugins and every patch but the ADDs of clusters and
    listeners applied; `eds_names`, its EDS clusters as they were."""
    chosen = {t: _touchable(t, resources[t], plan) for t in TYPES}
    chosen = {t: positions for t, positions in chosen.items() if positions}
    decoded = {t: tuple(decode_resource(resources[t][i], t) for i in positions) for t, positions in chosen.items()}
    base: Mapping[str, tuple[Message, ...]] = MappingProxyType({t: decoded.get(t, ()) for t in TYPES})
    if plan.proxy.wasm_plugins:
        base = apply_wasm_plugins(base, plan.proxy)
    reworked = patch_resources(base, plan.patches, plan.gateway, plan.hosts)
    final = {t: reworked[t] if t in reworked else list(base[t]) for t in decoded}
    by_type: dict[str, list[Resource]] = {}
    eds = set(eds_names)
    for t, positions in chosen.items():
        made = dict(zip(positions, zip(decoded[t], final[t], strict=True), strict=True))
        out = []
        for i, resource in enumerate(resources[t]):
            if i not in made:
                out.append(resource)
                continue
            original, message = made[i]
            if message is not None:
                out.append(resource if message is original else to_resource(message, t))
        by_type[t] = out
        if t == types.CLUSTER:
            eds -= {m.name for m in decoded[t]}  # type: ignore[attr-defined]
            eds.update(eds_cluster_names(m for m in final[t] if m is not None))
    decoded_count = sum(len(messages) for messages in decoded.values())
    return FinishedPart(MappingProxyType(by_type), tuple(sorted(eds)), _changed_by(plan, base, final), decoded_count)


def _touchable(type_url: str, resources: Sequence[Resource], plan: PatchPlan) -> list[int]:
    """The positions of the resources a patch or plugin may rework (the rest are left as bytes)."""
    patches = plan.patches
    if type_url == types.LISTENER:
        reworked = patches.keys() & LISTENER_PATCHES or (patches.keys() & ROUTE_PATCHES and not plan.gateway)
        return list(range(len(resources))) if reworked or plan.proxy.wasm_plugins else []
    if type_url == types.CLUSTER:
        merges = [p for p in patches.get(EF.CLUSTER, ()) if p.operation in (EF.Patch.MERGE, EF.Patch.REMOVE)]
        if not merges:
            return []
        hosts, gateway = plan.hosts, plan.gateway
        return [
            i
            for i, r in enumerate(resources)
            if any(
                context_matches(p, cluster_context(r.name, gateway))
                and cluster_matches(r.name, p, hosts.get(r.name, frozenset()))
                for p in merges
            )
        ]
    context = EF.GATEWAY if plan.gateway else EF.SIDECAR_OUTBOUND
    routes = [p for kind in ROUTE_PATCHES for p in patches.get(kind, ()) if context_matches(p, context)]
    return [i for i, r in enumerate(resources) if any(route_configuration_matches(r.name, p, context) for p in routes)]


def _changes(base: Mapping[str, tuple[Message, ...]], patched: Mapping[str, Sequence[Message | None]]) -> bool:
    return any(
        a is None or (a is not b and a != b) for t, done in patched.items() for a, b in zip(done, base[t], strict=True)
    )


def _changed_by(
    plan: PatchPlan, base: Mapping[str, tuple[Message, ...]], final: Mapping[str, Sequence[Message | None]]
) -> frozenset[FilterId]:
    """The filters that, applied alone, change something of the part (for the report: a filter
    whose patches match nothing anywhere is said so)."""
    ids = [((config.key, config.content_digest()), own) for config, own in plan.filters]
    if len(ids) == 1:
        return frozenset({ids[0][0]}) if _changes(base, final) else frozenset()
    return frozenset(
        ident for ident, own in ids if _changes(base, patch_resources(base, own, plan.gateway, plan.hosts))
    )


def added(plan: PatchPlan, names: Mapping[str, Iterable[str]]) -> dict[str, list[Message]]:
    """The clusters and listeners the plan's ADDs make, given the names (by type) of the joined,
    finished config: once per proxy, as `apply_envoy_filters` makes them."""
    if not plan.adds:
        return {}
    return added_resources(plan.patches, plan.gateway, {t: set(names[t]) for t in (types.CLUSTER, types.LISTENER)})


def unmatched_filters(
    plan: PatchPlan, changed: Container[FilterId], names: Mapping[str, Iterable[str]], skip: Container[FilterId]
) -> list[Config]:
    """The plan's filters that change nothing in the proxy's config, each applied alone: none of
    its parts (`changed`, the union of theirs), and no ADD makes a resource its unpatched
    config (`names`, by type) lacks. (A filter that changes no part removes nothing, so the
    names it would add to are those.) `skip`: filters not to tell about."""
    out = []
    for config, own in plan.filters:
        ident = (config.key, config.content_digest())
        if ident in changed or ident in skip:
            continue
        adds = any(p.operation == EF.Patch.ADD for kind in (EF.CLUSTER, EF.LISTENER) for p in own.get(kind, ()))
        if adds and added_resources(own, plan.gateway, {t: set(names.get(t, ())) for t in TYPES}):
            continue
        out.append(config)
    return out
