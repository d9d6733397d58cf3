"""Generated resources as shared bytes: each resource is serialized once and reused by every stream.

Three levels of sharing, from the most to the least expensive to redo:

- clusters, listeners and routes are generated in two parts: the outbound part (the services a
  proxy calls, nearly all of its config, `cache_outbound.py`) once per `OutboundProxy` (which a namespace of VMs
  serving different services usually shares) and version of the kinds it reads: its clusters
  per `CLUSTER_KINDS`, its listeners and routes per every other kind; DestinationRules are
  not in those versions but traced (each part notes the rules it asked for, and is kept while
  they are the same, so a rule of one namespace's service regenerates that namespace alone),
  and neither, for a sidecar, is the registry: a part notes what it read of it (`ServicesRead`:
  the services its scope sees, short names resolved) and is kept while no host it read changed,
  so a ServiceEntry outside a namespace's scope regenerates none of its parts,
  within which each service port's clusters are made once per `OutboundClusterView` and shared
  across keys and versions (a VirtualService change builds no cluster); and the inbound part (its
  own workload) once per `InboundView`, the only input of inbound generation (a
  change to another workload's Sidecar or another service's DestinationRule regenerates no
  inbound part), the view itself found once per key and version of `INBOUND_KINDS` (a
  VirtualService change makes none). An endpoint-only change (same config version)
  regenerates nothing of them;
- a ClusterLoadAssignment is built once per `AssignmentView` and shared by every proxy with the
  cluster, and the set of one list of clusters is kept while what it read is (`cache_eds.py`);
- a proxy's complete view (`ProxyResources`) is assembled once per (snapshot version, key); at
  an endpoint-only change, for a node whose binding holds, from its last view with the EDS set
  looked up again (`resolve`): nothing bound, no part asked for.

Proxies with different keys still often get equal resources (every sidecar of a namespace gets
the same route config and the same outbound clusters). Equal resources are interned, so a
thousand proxies hold one copy of each, and equal sets of them are one `ResourceSet`, whose set
version is computed once for every stream that is sent it.

Generation failing for one proxy (an input validation let through, a generator bug) stops only
that proxy: it keeps its last good config (`resources` hands back the last view generated for its
key, and /debug/syncz shows its snapshot behind the latest), every other proxy gets the
publication, the failure is counted (`pilot_total_xds_internal_errors`), and the error is logged
once per key and config version, naming the proxy and the inputs that changed since its last
good config (`changed_inputs`), the likely culprit. A proxy with no good config yet gets the
error (the server refuses its stream rather than sending half a config).

A resource's version is a hash of its serialized bytes, so two replicas fed the same inputs give
Envoy the same versions. Only the two most recent config and snapshot versions are kept (the
current one, and the one before for a change that is undone): a fleet-wide change otherwise
leaves a full copy of every proxy's config behind per version.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from meshctl.server.cache_eds import Assignments
from meshctl.server.cache_outbound import OutboundParts, generated_part
from meshctl.server.cache_parts import (
    Part,
    Recent,
    changed_inputs,
)
from meshctl.server.cache_patches import Patches
from meshctl.server.grpc_view import GrpcAssignments, grpc_config, grpc_inbound_listeners
from meshctl.server.proxy_resources import ProxyResources, Resolved, with_endpoints
from meshctl.snapshot.binding import bind_proxy, binding_inputs, binding_version, rebound
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyNode, ProxyType
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import types
from meshctl.xds.eds_locality import LocalityView, eds_localities
from meshctl.xds.generate import (
    INBOUND_KINDS,
    Assembled,
    GenerationMemos,
    generate_inbound,
)
from meshctl.xds.grpc_gen import grpc_outbound
from meshctl.xds.inbound_view import InboundView, inbound_view
from meshctl.xds.memo import GenerationMemo
from meshctl.xds.resources import Resource, ResourceSet

logger = logging.getLogger("meshctl.server.cache")

#: How many changed inputs a generation error names.
_NAMED_INPUTS = 5
#: Failures logged, remembered so each is logged once (per key and config version).
_MAX_FAILURES_REMEMBERED = 10_000


class GenerationError(Exception):
    """A proxy's config could not be generated and it has no earlier config to keep."""


@dataclass(frozen=True, slots=True, eq=False)
class _LastGood:
    """The last view generated for a key, the snapshot it came from (to say what changed since),
    and the snapshot version it was last asked for at (to forget keys no proxy asks for, and the
    snapshots they hold)."""

    view: ProxyResources
    snapshot: Snapshot
    asked_at: str


@dataclass(frozen=True, slots=True, eq=False)
class _Made:
    """A view generated for a key, and what its EDS set was looked up with (`Assignments.eds_set`):
    the config's EDS names and the proxy's locality views (`eds_localities`), both read of the
    config version and the key alone. None for a proxyless node's view."""

    view: ProxyResources
    eds: tuple[tuple[str, ...], Mapping[str, LocalityView]] | None


@dataclass(slots=True, eq=False)
class _Bound:
    """A node as last bound: the proxy, its generation key, the binding version it was bound
    at, what the binding read beyond it (`binding_inputs`); and, changed in place (under the
    lock) at each resolution, the snapshot version it was last resolved at and the view it was
    given there, if generated (not a last good view kept)."""

    node: ProxyNode
    proxy: Proxy
    key: tuple[object, ...]
    binding_version: str
    inputs: tuple[object, ...]
    at: str
    made: _Made | None


_CONFIG_TYPES = (types.CLUSTER, types.LISTENER, types.ROUTE)


class ResourceCache:
    """Shared, serialized resources for every proxy; safe to call from several threads."""

    def __init__(
        self, *, keep_versions: int = 2, on_failure: Callable[[], object] | None = None, strict: bool = False
    ) -> None:
        #: called (outside the lock) for each proxy view whose generation failed: a metric
        self._on_failure = on_failure
        #: raise a generation error instead of keeping the last good view: for the offline
        #: commands, where a view kept from another tree would be a wrong answer
        self._strict = strict
        self._memos = GenerationMemos()
        self._memo_version = ""
        self._lock = threading.Lock()
        #: whole configs by generation key, per config version
        self._config: Recent[tuple[object, ...], Part] = Recent(keep_versions)
        #: inbound parts by `InboundView` (their only input), and joined sets by their parts
        self._inbound_parts: GenerationMemo[InboundView, Part] = GenerationMemo()
        self._joins: GenerationMemo[tuple[str, int, int], tuple[ResourceSet, ResourceSet, ResourceSet]] = (
            GenerationMemo()
        )
        #: each key's inbound view and part with the version of `INBOUND_KINDS` it was found at
        #: (the view's memo forgets what it was not asked for in two config versions), and its
        #: last joined (unpatched) config with the two parts it joined, kept while both parts are
        #: the very same; both forgotten with the key's last good view
        self._inbound_held: dict[tuple[object, ...], tuple[str, InboundView, Part]] = {}
        self._joined: dict[tuple[object, ...], tuple[Part, Part, Part]] = {}
        #: gRPC server listeners by `InboundView`, as the Envoy inbound parts
        self._grpc_inbound: GenerationMemo[InboundView, ResourceSet] = GenerationMemo()
        #: gRPC assignment sets by the id of the Envoy set they are made from (held by the entry),
        #: advanced per snapshot version (endpoints change without the config)
        self._grpc_eds: GenerationMemo[int, tuple[ResourceSet, ResourceSet]] = GenerationMemo()
        self._grpc_eds_at = ""
        self._views: Recent[tuple[object, ...], _Made] = Recent(keep_versions)
        # Equal resources and equal sets, shared while anything holds them.
        self._resources: weakref.WeakValueDictionary[tuple[str, str, str], Resource] = weakref.WeakValueDictionary()
        self._sets: weakref.WeakValueDictionary[tuple[str, str], ResourceSet] = weakref.WeakValueDictionary()
        #: the assignments and EDS sets, shared by every proxy (`cache_eds.Assignments`)
        self._assignments = Assignments(self._lock, self._set, self._intern, keep_versions)
        #: the outbound parts (`cache_outbound`), the bulk of every config
        self._outbound = OutboundParts(
            self._lock,
            self._memos,
            set_of=self._set,
            intern=self._intern,
            assignments=self._assignments,
            keep_versions=keep_versions,
        )
        #: Counters for /metrics and the benchmarks: how often work was done vs. shared.
        self._generations = 0  # inbound parts and gRPC configs (outbound ones: `self._outbound`)
        self.inbound_views = 0  # inbound views made (one per key and version of `INBOUND_KINDS`)
        #: Proxy views whose generation failed (each kept its last good config, or had none).
        self.generation_failures = 0
        #: the last good view per generation key, for a proxy whose generation fails
        self._last_good: dict[tuple[object, ...], _LastGood] = {}
        #: each node as last bound, by node id (`resolve`); nodes bound at no snapshot version
        #: still kept are forgotten with the views
        self._bound: dict[str, _Bound] = {}
        #: the binding versions (by proxy type) of the latest snapshot resolved at
        self._binding_at: tuple[str, dict[ProxyType, str]] = ("", {})
        #: Nodes bound (`bind_proxy`) by `resolve`, for the tests and benchmarks.
        self.bindings = 0
        #: ... and nodes `resolve` gave their last view with its endpoints looked up again
        #: (`_endpoints_moved`: an endpoint-only change, nothing bound, no part asked for)
        self.endpoint_resolutions = 0
        self._failures_logged: set[tuple[str, tuple[object, ...]]] = set()
        #: proxyless gRPC nodes' configs by outbound key, per config version, and their
        #: assignments made from the shared ones (`grpc_view`)
        self._grpc_config: Recent[OutboundProxy, Part] = Recent(keep_versions)
        self._grpc_assignments = GrpcAssignments()
        #: EnvoyFilters and WasmPlugins applied to parts (`cache_patches`)
        self._patcher = Patches(self._lock, self._set, self._join)

    def route_translations(self) -> tuple[int, int]:
        """VirtualService translations run and reused (`RouteMemo`), for the tests and benchmarks."""
        return self._memos.routes.made, self._memos.routes.reused

    def route_plans(self) -> tuple[int, int]:
        """Route configurations' domain plans made whole and updated from the one before
        (`route_plan`), for the tests and benchmarks."""
        plans = self._memos.routes.virtual_hosts
        return plans.plans_made, plans.plans_updated

    @property
    def patched_parts(self) -> int:
        """Parts EnvoyFilters and WasmPlugins were applied to."""
        return self._patcher.parts

    @property
    def patched_resources(self) -> int:
        """Resources decoded to apply them."""
        return self._patcher.resources

    @property
    def generations(self) -> int:
        """Outbound and inbound parts generated."""
        return self._generations + self._outbound.generations

    @property
    def outbound_generations(self) -> int:
        """Outbound parts generated (one of their halves at least)."""
        return self._outbound.outbound_generations

    @property
    def cluster_generations(self) -> int:
        """Outbound parts whose clusters had to be generated (whole or brought up to date)."""
        return self._outbound.cluster_generations

    @property
    def cluster_resources_made(self) -> int:
        """Outbound clusters serialized for those parts (a part brought up to date across a
        service change serializes the changed services' clusters alone)."""
        return self._outbound.cluster_resources_made

    @property
    def inbound_parts_made(self) -> int:
        """Inbound parts generated (the rest were shared from an `InboundView`)."""
        return self._inbound_parts.made

    @property
    def eds_builds(self) -> int:
        """Assignments built (the rest were shared from an `AssignmentView`)."""
        return self._assignments.builds

    @property
    def eds_set_members_made(self) -> int:
        """Assignments looked up or built for the EDS sets made (the rest taken from the last set)."""
        return self._assignments.set_members_made

    @property
    def eds_set_builds(self) -> int:
        """EDS sets (the assignments of one list of clusters) made."""
        return self._assignments.set_builds

    @property
    def clusters_built(self) -> int:
        """Service ports whose clusters were generated (the rest were shared from a view)."""
        return self._memos.clusters.made

    def resolve(self, node: ProxyNode, snapshot: Snapshot) -> Resolved:
        """`node` bound in `snapshot` (`bind_proxy`), and its resources: what the ADS servicer
        asks of the cache, the one place the two meet.

        A node bound before at the same binding version (`binding_version`: what binding reads
        of the configs and the registry), whose WorkloadEntry and endpoints are as they were
        (`binding_inputs`), is the proxy it was, with the same generation key: an endpoint
        change binds again only the proxies of the workloads it touched, a VirtualService or
        DestinationRule change none (unless it changes a label selector), and every other
        stream's resolution is one lookup of its key's view. At a snapshot of the config
        version its last view was generated at (an endpoint change), that view with its
        endpoints looked up again is its view (`_endpoints_moved`), and the proxy is the one it
        was bound as (at an earlier snapshot: everything binding reads is as it was there)."""
        inputs = binding_inputs(node, snapshot)
        with self._lock:
            last = self._bound.get(node.id)
            if self._binding_at[0] != snapshot.version:
                self._binding_at = (snapshot.version, {})
            versions = self._binding_at[1]
            version = versions.get(node.type)
            made = last.made if last is not None else None
        if version is None:
            version = binding_version(snapshot, node.type)
            with self._lock:
                versions[node.type] = version
        if (
            last is not None
            and last.binding_version == version
            and (last.node is node or last.node == node)
            and last.inputs == inputs
        ):
            if made is not None and made.eds is not None and made.view.config_version == snapshot.config_version:
                view = self._endpoints_moved(snapshot, last, made)
                if view is not None:
                    return Resolved(last.proxy, view)
            proxy, key = rebound(last.proxy, snapshot), last.key
        else:
            proxy = bind_proxy(node, snapshot)
            key = proxy.generation_key()
            with self._lock:
                self.bindings += 1
        bound = _Bound(node, proxy, key, version, inputs, snapshot.version, None)
        with self._lock:
            self._bound[node.id] = bound
        view, made = self._view_of(snapshot, proxy, key)
        if made is not None:
            with self._lock:
                bound.made = made
        return Resolved(proxy, view)

    def _endpoints_moved(self, snapshot: Snapshot, bound: _Bound, made: _Made) -> ProxyResources | None:
        """The view of a node whose binding holds, at a snapshot of the config version its last
        view (`made`) was generated at: its config is that view's (parts are keyed on the config
        version and the key), and so are its EDS names and locality views (read of the same), so
        its assignments alone are looked up, and no proxy is bound, no part asked for. Forgets
        nothing the full path keeps: the view is shared by its key at this snapshot, and is its
        key's last good one. None when looking them up fails: the full path then says why, and
        keeps the last good view."""
        key = bound.key
        with self._lock:
            found = self._views.get(snapshot.version, key)
            if found is not None:
                bound.at, bound.made = snapshot.version, found
                self.endpoint_resolutions += 1
                return found.view
        assert made.eds is not None
        names, localities = made.eds
        try:
            eds = self._assignments.eds_set(snapshot, names, localities)
        except Exception:
            return None
        fresh = _Made(with_endpoints(snapshot, made.view.by_type, eds), made.eds)
        with self._lock:
            bound.at, bound.made = snapshot.version, fresh
            self.endpoint_resolutions += 1
            self._keep_view(snapshot, key, fresh)
        return fresh.view

    def resources(self, snapshot: Snapshot, proxy: Proxy) -> ProxyResources:
        """Everything `proxy` may be sent at `snapshot`; when generating it fails, the last good
        view of its key (see the module docstring), or GenerationError when there is none."""
        return self._view_of(snapshot, proxy, proxy.generation_key())[0]

    def _view_of(
        self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]
    ) -> tuple[ProxyResources, _Made | None]:
        """The key's view at `snapshot`, and how it was made (None for a last good view kept)."""
        with self._lock:
            # A version asked for again (a change undone) is the most recent one again (`Recent.get`):
            # else the next version would drop it, and the bindings and last good views asked for there.
            made = self._views.get(snapshot.version, key)
        if made is not None:
            return made.view, made
        try:
            made = self._generate_view(snapshot, proxy, key)
        except Exception as exc:
            if self._strict:
                raise
            return self._last_good_for(snapshot, proxy, key, exc), None
        with self._lock:
            self._keep_view(snapshot, key, made)
        return made.view, made

    def _keep_view(self, snapshot: Snapshot, key: tuple[object, ...], made: _Made) -> None:
        """`made` is the key's view at `snapshot`, and its last good one. Called with the lock
        held."""
        dropped = self._views.put(snapshot.version, key, made)
        self._last_good[key] = _LastGood(made.view, snapshot, snapshot.version)
        if dropped:
            self._forget_last_good()

    def _last_good_for(
        self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...], exc: Exception
    ) -> ProxyResources:
        """The view a proxy keeps when its generation failed; the error logged once per key and
        config version, naming the inputs that changed since that view."""
        with self._lock:
            self.generation_failures += 1
            last = self._last_good.get(key)
            if last is not None:
                self._last_good[key] = _LastGood(last.view, last.snapshot, snapshot.version)
            first = (snapshot.config_version, key) not in self._failures_logged
            if len(self._failures_logged) >= _MAX_FAILURES_REMEMBERED:
                self._failures_logged.clear()  # bounded even if nothing ever generates again
            self._failures_logged.add((snapshot.config_version, key))
        if self._on_failure is not None:
            self._on_failure()
        inputs = changed_inputs(last.snapshot, snapshot) if last is not None else []
        named = ", ".join(inputs[:_NAMED_INPUTS]) + (
            f" and {len(inputs) - _NAMED_INPUTS} more" if len(inputs) > _NAMED_INPUTS else ""
        )
        where = f"proxy {proxy.id}" + (f" (workload {proxy.workload})" if proxy.workload else "")
        if last is None:
            raise GenerationError(
                f"cannot generate config for {where} at snapshot {snapshot.version}: {type(exc).__name__}: {exc}"
            ) from exc
        if first:
            logger.error(
                "cannot generate config for %s at snapshot %s (%s: %s); it keeps its last good config "
                "(snapshot %s). Inputs changed since: %s",
                where, snapshot.version, type(exc).__name__, exc, last.view.snapshot_version, named or "none",
                exc_info=exc,
            )  # fmt: skip
        return last.view

    def _forget_last_good(self) -> None:
        """Drop what no proxy asked for at a snapshot version still kept (proxies that left), so
        the last good views, and the snapshots they hold, do not pile up. Called with the lock
        held."""
        kept = set(self._views.versions)
        self._last_good = {k: g for k, g in self._last_good.items() if g.asked_at in kept}
        self._bound = {n: b for n, b in self._bound.items() if b.at in kept}
        self._joined = {k: j for k, j in self._joined.items() if k in self._last_good}
        self._inbound_held = {k: h for k, h in self._inbound_held.items() if k in self._last_good}
        configs = set(self._config.versions)
        self._failures_logged = {f for f in self._failures_logged if f[0] in configs}

    def _generate_view(self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]) -> _Made:
        if proxy.node.proxyless:
            return _Made(self._grpc_view(snapshot, proxy), None)
        config = self._config_for(snapshot, proxy, key)
        views = eds_localities(snapshot, proxy, config.eds_names)
        eds = self._assignments.eds_set(snapshot, config.eds_names, views)
        return _Made(with_endpoints(snapshot, config.by_type, eds), (config.eds_names, views))

    def _grpc_view(self, snapshot: Snapshot, proxy: Proxy) -> ProxyResources:
        """A proxyless gRPC node's view: its config made once per config version and outbound key
        (`grpc_view.grpc_config`), its endpoints the shared assignments as gRPC takes them."""
        outbound_key = grpc_outbound(proxy, snapshot)
        with self._lock:
            config = self._grpc_config.get(snapshot.config_version, outbound_key)
            self._advance_memos(snapshot)
            if self._grpc_eds_at != snapshot.version:
                self._grpc_eds_at = snapshot.version
                self._grpc_eds.advance()
        if config is None:
            config = self._generated(grpc_config(snapshot, outbound_key, self._memos))
            with self._lock:
                self._grpc_config.put(snapshot.config_version, outbound_key, config)
        by_type: dict[str, Mapping[str, Resource]] = dict(config.by_type)
        # Made once per InboundView and joined once per pair of sets, as an Envoy's inbound part.
        inbound = self._grpc_inbound.get(
            inbound_view(ProxyScope(snapshot, proxy)),
            lambda view: self._set(types.LISTENER, grpc_inbound_listeners(view)),
        )
        by_type[types.LISTENER] = self._join(types.LISTENER, config.by_type[types.LISTENER], inbound)
        # The Envoy assignments, per-locality variants included, as gRPC takes them.
        views = eds_localities(snapshot, proxy, config.eds_names)
        envoy_eds = self._assignments.eds_set(snapshot, config.eds_names, views)
        by_type[types.ENDPOINT] = self._grpc_eds.get(
            id(envoy_eds),
            lambda _key: (envoy_eds, self._set(types.ENDPOINT, self._grpc_assignments.of(envoy_eds.ordered))),
        )[1]
        return ProxyResources(snapshot.version, snapshot.config_version, MappingProxyType(by_type))

    def _config_for(self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]) -> Part:
        with self._lock:
            cached = self._config.get(snapshot.config_version, key)
            if cached is None:
                self._advance_memos(snapshot)
        if cached is not None:
            return cached
        outbound = self._outbound_for(snapshot, proxy)
        inbound = self._inbound_for(snapshot, proxy, key)
        patched = bool(proxy.envoy_filters or proxy.wasm_plugins)
        with self._lock:
            held = self._joined.get(key)
        if held is not None and held[0] is outbound and held[1] is inbound and not patched:
            result = held[2]
        else:
            by_type = {t: self._join(t, outbound.by_type[t], inbound.by_type[t]) for t in _CONFIG_TYPES}
            # Inbound parts name no EDS cluster as a rule: then the outbound part's (sorted) list, shared.
            eds_names = (
                outbound.eds_names
                if not inbound.eds_names
                else tuple(sorted({*outbound.eds_names, *inbound.eds_names}))
            )
            result = Part(MappingProxyType(by_type), eds_names)
            if patched:
                result = self._patched(outbound, inbound, result, proxy)
            else:
                with self._lock:
                    self._joined[key] = (outbound, inbound, result)
        with self._lock:
            self._config.put(snapshot.config_version, key, result)
        return result

    def _inbound_for(self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]) -> Part:
        """The inbound part of the key's proxies: its view found once per version of what the view
        reads (`INBOUND_KINDS`; the proxy through `key`), so a VirtualService change makes no
        view; the part made once per view."""
        version = snapshot.version_of(INBOUND_KINDS)
        with self._lock:
            found = self._inbound_held.get(key)
        if found is not None and found[0] == version:
            return found[2]
        view = inbound_view(ProxyScope(snapshot, proxy))
        if found is not None and found[1] == view:
            part = found[2]  # a change elsewhere (a service it does not serve): the part it was
        else:
            part = self._inbound_parts.get(view, lambda made: self._generated(generate_inbound(made)))
        with self._lock:
            self.inbound_views += 1
            self._inbound_held[key] = (version, view, part)
        return part

    def _advance_memos(self, snapshot: Snapshot) -> None:
        """On a new config version, what no proxy asked for in the last two goes. Called with the
        lock held."""
        if self._memo_version != snapshot.config_version:
            self._memo_version = snapshot.config_version
            for memo in (self._memos, self._inbound_parts, self._joins, self._patcher, self._grpc_inbound):
                memo.advance()

    def _patched(self, outbound: Part, inbound: Part, joined: Part, proxy: Proxy) -> Part:
        """The joined config with the proxy's WasmPlugins and EnvoyFilters applied (`cache_patches`)."""
        return self._patcher.patched(outbound, inbound, joined, proxy)

    def _outbound_for(self, snapshot: Snapshot, proxy: Proxy) -> Part:
        """The outbound part for the proxy (`cache_outbound.OutboundParts`)."""
        return self._outbound.part_for(snapshot, proxy)

    def _generated(self, generated: Assembled) -> Part:
        """A generated part as shared sets of serialized resources, counted."""
        result = generated_part(self._set, generated)
        with self._lock:
            self._generations += 1
        return result

    def _join(self, type_url: str, outbound: ResourceSet, inbound: ResourceSet) -> ResourceSet:
        """One set of both parts' resources (on a name in both, outbound wins, as in
        `generate_config`); a part alone is shared as it is, and two parts are joined once."""
        if not inbound:
            return outbound
        if not outbound:
            return inbound
        # Keyed by the parts' identities; the entry holds both, so neither id can be reused.
        joined = self._joins.get(
            (type_url, id(outbound), id(inbound)),
            # Inbound first, so outbound's resource is the one kept under a shared name. Both
            # parts' resources are interned already.
            lambda _key: (outbound, inbound, self._set(type_url, [*inbound.ordered, *outbound.ordered], interned=True)),
        )
        return joined[2]

    def _set(self, type_url: str, resources: Iterable[Resource], *, interned: bool = False) -> ResourceSet:
        """The set of `resources`, each interned, and the set itself interned."""
        serialized = list(resources)
        with self._lock:
            fresh = ResourceSet(serialized if interned else (self._intern(type_url, r) for r in serialized))
            found = self._sets.get((type_url, fresh.version))
            if found is not None and found.ordered == fresh.ordered:
                return found
            self._sets[(type_url, fresh.version)] = fresh
            return fresh

    def _intern(self, type_url: str, resource: Resource) -> Resource:
        key = (type_url, resource.name, resource.version)
        found = self._resources.get(key)
        # Equal versions are equal bytes but for a hash collision; the bytes decide.
        if found is not None and found.body == resource.body:
            return found
        self._resources[key] = resource
        return resource
