"""What `meshctl diff` compares, computed once per view rather than once per proxy.

A mesh of a thousand VMs has a thousand proxies but far fewer views: the server generates once
per `Proxy.generation_key` (and patches once per `Proxy.patch_key`), and even proxies with
different keys share most of their resources (a namespace's sidecars get one outbound part).
So the two trees are generated here the way the server generates them, through one
`ResourceCache` (strict: a generation error is an error, not a view kept from the other tree),
whose memos also carry what the old tree built over to the new one (a VirtualService change
builds no cluster). The cache hands out the same `ResourceSet` for the same resources, so each
pair of sets, one per tree, is compared once and every proxy holding that pair is told the
answer; a changed resource is decoded once, however many proxies hold it.

What is compared is what `meshctl dump` prints: the generated resources, route configs left out
that no listener asks for over RDS (`config_dump.subscribed`), compared by their bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from meshctl.cli.offline import LoadedTree
    from meshctl.config.model import Config
    from meshctl.snapshot.model import Snapshot
    from meshctl.snapshot.proxy import Proxy
    from meshctl.xds.resources import Resource


@dataclass(frozen=True, slots=True)
class Difference:
    """One resource that differs between two views, not yet tied to a proxy."""

    type_url: str
    name: str
    #: "added", "removed" or "changed" (`meshctl.cli.diff.Change`)
    change: str
    old: Message | None
    new: Message | None


_EMPTY: Mapping[str, Resource] = {}


class ViewDiff:
    """The differences of proxies' views between two snapshots, each pair of views compared once."""

    def __init__(self, before: Snapshot, after: Snapshot) -> None:
        from meshctl.server.cache import ResourceCache

        self.before, self.after = before, after
        # Two snapshot versions, both kept: the old tree's parts stay while the new one's are made.
        self._cache = ResourceCache(keep_versions=2, strict=True)
        #: (type URL, id(old set), id(new set)) -> (old set, new set, differences); the sets are
        #: held so their ids stay theirs
        self._pairs: dict[tuple[str, int, int], tuple[object, object, tuple[Difference, ...]]] = {}
        #: (id(listeners), id(routes)) -> (listeners, routes, the routes asked for over RDS)
        self._subscribed: dict[tuple[int, int], tuple[object, object, Mapping[str, Resource]]] = {}
        #: (type URL, name, version) -> the route configs a listener asks for, or a decoded message
        self._rds: dict[tuple[str, str], frozenset[str]] = {}
        self._messages: dict[tuple[str, str, str], Message] = {}
        #: how many pairs of sets were compared (the rest were shared): for the tests
        self.compared = 0

    def differences(self, old: Proxy | None, new: Proxy | None) -> list[Difference]:
        """Every resource that differs from `old`'s view in the old tree to `new`'s in the new
        one, in push order, then by name (None: the proxy does not exist on that side)."""
        from meshctl.xds.config_dump import DUMP_ORDER

        was = self._view(self.before, old)
        now = self._view(self.after, new)
        out: list[Difference] = []
        for type_url in DUMP_ORDER:
            out.extend(self._compare(type_url, was.get(type_url, _EMPTY), now.get(type_url, _EMPTY)))
        return out

    def _view(self, snapshot: Snapshot, proxy: Proxy | None) -> Mapping[str, Mapping[str, Resource]]:
        from meshctl.xds import types

        if proxy is None:
            return {}
        if proxy.node.proxyless:
            return self._grpc_view(snapshot, proxy)
        by_type = dict(self._cache.resources(snapshot, proxy).by_type)
        by_type[types.ROUTE] = self._asked_routes(by_type.get(types.LISTENER, _EMPTY), by_type.get(types.ROUTE, _EMPTY))
        return by_type

    def _grpc_view(self, snapshot: Snapshot, proxy: Proxy) -> Mapping[str, Mapping[str, Resource]]:
        """What a proxyless gRPC node is sent (as `dump --grpc` prints it): gRPC's own resources,
        one view per node (a diff names the node with `--proxy`; gRPC nodes are not in
        `--all-proxies`, which walks the tree's WorkloadEntries as Envoy sidecars)."""
        from meshctl.xds.grpc_gen import generate_grpc
        from meshctl.xds.resources import to_resource

        return {
            type_url: {r.name: r for r in (to_resource(m, type_url) for m in messages)}
            for type_url, messages in generate_grpc(snapshot, proxy).items()
        }

    def _asked_routes(
        self, listeners: Mapping[str, Resource], routes: Mapping[str, Resource]
    ) -> Mapping[str, Resource]:
        """The route configs some listener names over RDS (`config_dump.subscribed`), once per
        pair of sets."""
        from meshctl.xds import types
        from meshctl.xds.config_dump import rds_names
        from meshctl.xds.resources import decode_resource

        key = (id(listeners), id(routes))
        found = self._subscribed.get(key)
        if found is None:
            wanted: set[str] = set()
            for listener in listeners.values():
                names = self._rds.get((listener.name, listener.version))
                if names is None:
                    names = frozenset(rds_names(decode_resource(listener, types.LISTENER)))
                    self._rds[(listener.name, listener.version)] = names
                wanted |= names
            kept = {name: r for name, r in routes.items() if name in wanted}
            found = self._subscribed[key] = (listeners, routes, kept)
        return found[2]

    def _compare(
        self, type_url: str, was: Mapping[str, Resource], now: Mapping[str, Resource]
    ) -> tuple[Difference, ...]:
        if was is now:
            return ()
        key = (type_url, id(was), id(now))
        found = self._pairs.get(key)
        if found is None:
            self.compared += 1
            out = []
            for name in sorted(was.keys() | now.keys()):
                a, b = was.get(name), now.get(name)
                if a is not None and b is not None and (a is b or a.body == b.body):
                    continue
                change = "added" if a is None else "removed" if b is None else "changed"
                out.append(Difference(type_url, name, change, self._message(type_url, a), self._message(type_url, b)))
            found = self._pairs[key] = (was, now, tuple(out))
        return found[2]

    def _message(self, type_url: str, resource: Resource | None) -> Message | None:
        """The resource's message, decoded once for every proxy that holds it."""
        from meshctl.xds.resources import decode_resource

        if resource is None:
            return None
        key = (type_url, resource.name, resource.version)
        message = self._messages.get(key)
        if message is None:
            message = self._messages[key] = decode_resource(resource, type_url)
        return message


def entries_by_ref(tree: LoadedTree) -> dict[tuple[str, str], Config]:
    """The tree's WorkloadEntries by (namespace, name), the proxies it describes."""
    from meshctl.cli.offline import workload_entries

    return {(e.namespace, e.name): e for e in workload_entries(tree.snapshot)}


def proxy_of_entry(snapshot: Snapshot, entry: Config | None, interception: str) -> Proxy | None:
    """The proxy of a WorkloadEntry, bound as `offline.find_proxy` binds one named by reference."""
    from meshctl.cli.offline import DEFAULT_DNS, node_id_for
    from meshctl.snapshot.binding import bind_proxy
    from meshctl.snapshot.node import parse_node_id

    if entry is None:
        return None
    node = parse_node_id(node_id_for(snapshot, entry), {"INTERCEPTION_MODE": interception, **DEFAULT_DNS})
    return bind_proxy(node, snapshot)
