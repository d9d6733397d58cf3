"""Translated VirtualService routes reused across snapshots only where they read the same
(`meshctl.xds.route_memo`): the key holds what is known before translating, a trace the answers
to what translation asked of its context."""

from __future__ import annotations

import dataclasses

from envoy.config.route.v3 import route_components_pb2 as rc

from meshctl.registry.model import Protocol, Resolution, Service, ServicePort
from meshctl.server.cache import ResourceCache
from meshctl.testing.builders import configs_from_yaml, proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate
from meshctl.xds.resources import to_resource
from meshctl.xds.route_actions import RouteContext
from meshctl.xds.route_memo import KEY_FIELDS, TRACED_FIELDS, RouteMemo

VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: front, namespace: shop}
spec:
  hosts: [front.shop.mesh]
  http:
  - route:
    - destination: {host: back}
"""


def test_the_context_has_no_field_the_memo_does_not_key_or_trace() -> None:
    """A field added to RouteContext must be added to the key or traced: else a translation
    would be reused where it reads something else."""
    assert {f.name for f in dataclasses.fields(RouteContext)} == {*KEY_FIELDS, *TRACED_FIELDS}


def context(resolve: dict[str, str], services: dict[str, Service], hashes: dict[str, object]) -> RouteContext:
    return RouteContext(
        listen_port=8080,
        gateways=frozenset({"mesh"}),
        proxy_labels={},
        proxy_namespace="shop",
        resolve_host=lambda host, _ns: resolve.get(host, host),
        lookup_service=services.get,
        lookup_hash=lambda _destination, host: hashes.get(host),  # type: ignore[return-value, arg-type]
    )


def _cluster(routes: list[rc.Route]) -> str:
    return routes[0].route.cluster


def test_a_translation_is_reused_while_every_question_it_asked_gets_the_same_answer() -> None:
    from meshctl.xds.route_actions import ConsistentHash

    (vs,) = configs_from_yaml(VS)
    http = list(vs.spec.http)
    one_port = Service("back.shop.svc.cluster.local", "shop", (ServicePort("http", 9000, Protocol.HTTP),))
    two_ports = dataclasses.replace(one_port, ports=(*one_port.ports, ServicePort("http2", 9001, Protocol.HTTP)))
    resolve = {"back": one_port.hostname}
    base = context(resolve, {one_port.hostname: one_port}, {})

    def primed() -> RouteMemo:
        memo = RouteMemo()
        assert _cluster(memo.routes(vs, base, http)) == "outbound|9000||back.shop.svc.cluster.local"
        return memo

    memo = primed()
    same = context(dict(resolve), {one_port.hostname: one_port}, {})
    assert memo.routes(vs, same, http) == memo.routes(vs, base, http)
    assert (memo.made, memo.reused) == (1, 2)
    # Each question answered otherwise: translated again, and the answer shows.
    memo = primed()
    routes = memo.routes(vs, context({"back": "back.shop.mesh"}, {}, {}), http)
    assert _cluster(routes) == "outbound|8080||back.shop.mesh"
    memo = primed()
    routes = memo.routes(vs, context(resolve, {one_port.hostname: two_ports}, {}), http)
    assert _cluster(routes) == "outbound|8080||back.shop.svc.cluster.local"
    memo = primed()
    hashes = {one_port.hostname: ConsistentHash(http_header_name="x")}
    routes = memo.routes(vs, context(resolve, {one_port.hostname: one_port}, hashes), http)
    assert routes[0].route.hash_policy[0].header.header_name == "x"
    assert (memo.made, memo.reused) == (2, 0)
    assert one_port.resolution is Resolution.STATIC


SHOP = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: front, namespace: shop}
spec:
  hosts: [front.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.1}]
---
"""
BACK = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: back, namespace: shop}
spec:
  hosts: [back.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.2}]
---
"""


def test_a_short_name_that_comes_to_name_a_service_changes_the_served_route() -> None:
    """The VirtualService does not change; a service its short destination name now stands for
    appears. The server's route must follow, as a build from scratch does."""
    cache = ResourceCache()
    node = "sidecar~10.0.0.9~client.shop~shop.svc.cluster.local"
    for text in (SHOP + VS, SHOP + BACK + VS, SHOP + VS):
        snapshot = snapshot_from_yaml(text)
        proxy = proxy_for(snapshot, node)
        served = cache.resources(snapshot, proxy).of(types.ROUTE)
        routes = generate(snapshot, proxy)[types.ROUTE]
        expected = {r.name: r.body for r in (to_resource(m, types.ROUTE) for m in routes)}
        assert {n: r.body for n, r in served.items()} == expected
    # The second snapshot's answer differed, so it translated again; the third is the first
    # again, whose outbound part the cache still holds.
    assert cache.route_translations() == (2, 0)
