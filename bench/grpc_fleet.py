"""The fleet benchmark with proxyless gRPC clients (`bench/run.py --grpc`) instead of Envoys.

The mesh is the Envoy fleet's (`bench.fleet.Fleet`); what differs is who connects and what a
change is checked by. Each proxy is a gRPC application on its VM (node metadata `GENERATOR:
grpc`) with channels to `DIALS` services, and subscribes as grpcio's xDS client does: the
listeners `HOST:PORT` of the services it dials, then the route configs they name, the clusters
the routes send to and their endpoints, each by name. It dials the first shared services (every
scope imports them; the changes to them reach every client) and services of its own namespace,
as an application calls its neighbours.

A gRPC client asks only for the clusters its routes name: for a routed service those of its
subsets, so a change is checked on subset v1's cluster (the added VM is a v1).

What a change is checked by is what a gRPC node is sent of it: a route timeout arrives as the
route's `max_stream_duration`, and a DestinationRule's connection limit as `max_requests` (gRPC
has no connection limit, so the generated DestinationRules set both); the EnvoyFilter step is
left out (EnvoyFilters patch Envoy's config, not a gRPC node's). A change affects the clients
that dial the host.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from bench.fleet import BASE_MAX_CONNECTIONS, BASE_TIMEOUT_S, PORT, Change, Fleet, ProxyInfo, ServiceInfo, Step
from bench.meshgen import VS

#: Services each gRPC client dials.
DIALS = 5
#: Of them, shared ones (in every scope): the rest are of the client's own namespace.
SHARED_DIALS = 2

DR = """apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: {name}
  namespace: {ns}
spec:
  host: {host}
  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: {max_connections}
      http:
        http2MaxRequests: {max_connections}
    outlierDetection:
      consecutive5xxErrors: 5
      interval: 10s
      baseEjectionTime: 30s
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
"""


class GrpcFleet(Fleet):
    """A fleet of gRPC clients: what each dials, and the changes as they reach gRPC."""

    @cached_property
    def dialed(self) -> dict[str, tuple[str, ...]]:
        """Node id -> the listener names (`HOST:PORT`) it subscribes to."""
        by_group: dict[str, list[ServiceInfo]] = {}
        for svc in self.services:
            by_group.setdefault(svc.group, []).append(svc)
        shared = [s.host for s in self.shared[:SHARED_DIALS]]
        out = {}
        for proxy in self.proxies:
            own = [s.host for s in by_group[proxy.group] if s.host not in shared]
            hosts = [*shared, *own][:DIALS]
            out[proxy.node_id] = tuple(f"{h}:{PORT}" for h in hosts)
        return out

    def dials(self, proxy: ProxyInfo, host: str) -> bool:
        return f"{host}:{PORT}" in self.dialed[proxy.node_id]

    def importers(self, host: str) -> frozenset[str]:
        return frozenset(p.node_id for p in self.proxies if self.sees(p, host) and self.dials(p, host))

    def routing(
        self, svc: ServiceInfo, *, timeout: int = BASE_TIMEOUT_S, max_connections: int = BASE_MAX_CONNECTIONS
    ) -> str:
        ns = self.namespace_of(svc)
        dr = DR.format(name=svc.name, ns=ns, host=svc.host, max_connections=max_connections)
        vs = VS.format(name=svc.name, ns=ns, host=svc.host, timeout=timeout)
        return f"{dr}---\n{vs}"

    def route_change(self, step: int) -> tuple[Change, Path, str]:
        change, path, text = super().route_change(step)
        check = ("stream_duration", f"{change.host}:{PORT}", BASE_TIMEOUT_S + step)
        return Change(change.name, change.host, check, change.affected, change.kind), path, text

    def policy_change(self, step: int) -> tuple[Change, Path, str]:
        change, path, text = super().policy_change(step)
        _, _, limit = change.check
        check = ("max_requests", subset_cluster(change.host), limit)
        return Change(change.name, change.host, check, change.affected, change.kind), path, text

    def endpoint_change(self, present: bool) -> Change:
        change = super().endpoint_change(present)
        check = ("endpoint", subset_cluster(change.host), *change.check[2:])
        return Change(change.name, change.host, check, change.affected, change.kind)

    def steps(self) -> list[Step]:
        return [s for s in super().steps() if s.change.name != "EnvoyFilter"]

    def describe(self) -> str:
        return f"{super().describe()} as proxyless gRPC clients dialing {DIALS} services each"


def subset_cluster(host: str) -> str:
    """The cluster of a routed service's subset v1: a gRPC client holds it, not the plain one."""
    return f"outbound|{PORT}|v1|{host}"
