"""All of a proxy's Envoy config from one snapshot: the one entry point to the generators.

Each xDS type has its own module of pure functions over a `ProxyScope` (which is itself a pure
function of the snapshot and the proxy). `generate` runs them in push order; the server, `meshctl
dump` and `meshctl diff` all call it, so what a command prints is what the server sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from google.protobuf.message import Message

from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import types
from meshctl.xds.clusters import build_clusters
from meshctl.xds.endpoints import build_endpoints
from meshctl.xds.listeners import build_listeners
from meshctl.xds.routes import build_routes

Generated = Mapping[str, tuple[Message, ...]]


def generate(snapshot: Snapshot, proxy: Proxy) -> Generated:
    """Every resource of every type for `proxy`, keyed by type URL, each list sorted by name."""
    scope = ProxyScope(snapshot, proxy)
    clusters = build_clusters(scope)
    out: dict[str, tuple[Message, ...]] = {
        types.CLUSTER: tuple(clusters),
        types.ENDPOINT: tuple(build_endpoints(scope, clusters)),
        types.LISTENER: tuple(build_listeners(scope)),
        types.ROUTE: tuple(build_routes(scope)),
    }
    return MappingProxyType(out)


def resource_name(message: Message) -> str:
    """The xDS name of a generated resource (Cluster/Listener/RouteConfiguration `name`,
    ClusterLoadAssignment `cluster_name`)."""
    name = getattr(message, "cluster_name", "") or getattr(message, "name", "")
    return str(name)
