"""Generated config is shared: replicas of one service get one generation, and an endpoint
change rebuilds only the endpoints of the service that changed."""

from __future__ import annotations

from pathlib import Path

from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2

from meshctl.server.cache import ResourceCache
from meshctl.server.proxy_resources import ProxyResources
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate, generate_outbound
from meshctl.xds.resources import to_resource

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"
MESH = "\n---\n".join(p.read_text() for p in sorted(EXAMPLES.rglob("*.yaml")))
SECOND_V1 = """
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v1-b, namespace: bookinfo}
spec:
  address: 10.10.0.44
  labels: {app: reviews, version: v1}
  serviceAccount: bookinfo-reviews
  locality: eu-west/zone-a
"""
NEW_RATINGS = """
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ratings-v1-b, namespace: bookinfo}
spec:
  address: 10.10.0.52
  serviceAccount: bookinfo-ratings
  labels: {app: ratings, version: v1}
"""


def node(name: str, ip: str) -> str:
    return f"sidecar~{ip}~{name}.bookinfo~bookinfo.svc.cluster.local"


def assert_serves_what_generate_makes(
    view: ProxyResources, snapshot: Snapshot, proxy: Proxy, what: object = None
) -> None:
    """Every resource the cache assembled for `proxy` is, byte for byte, what `generate` makes
    for it from scratch, and nothing else is there."""
    for type_url, messages in generate(snapshot, proxy).items():
        expected = sorted((r.name, r.body) for r in (to_resource(m, type_url) for m in messages))
        assert sorted((r.name, r.body) for r in view.of(type_url).values()) == expected, (what, type_url)


def test_replicas_of_a_service_share_one_generation_and_the_same_bytes() -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1)
    cache = ResourceCache()
    a = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41")))
    b = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-b", "10.10.0.44")))
    assert (cache.generations, cache.outbound_generations) == (2, 1)  # one outbound, one inbound
    for type_url in types.PUSH_ORDER:
        assert a.of(type_url) == b.of(type_url)
    other = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v2-vm", "10.10.0.42")))
    # Its own inbound part, and its own outbound: it runs in another zone, and the mesh has a DNS
    # service, whose inline endpoints get locality priorities relative to the caller.
    assert (cache.generations, cache.outbound_generations) == (4, 2)
    # The same assignments, the same bytes, but where a locality rule is in force (reviews has
    # outlier detection, so locality failover): there each zone gets its own priorities.
    mine, theirs = dict(a.of(types.ENDPOINT)), dict(other.of(types.ENDPOINT))
    rewritten = {n for n in mine if mine[n] is not theirs[n]}
    assert "outbound|9080||reviews.bookinfo.mesh" in rewritten  # endpoints in both zones
    assert all(n.endswith("|reviews.bookinfo.mesh") for n in rewritten)


def test_vms_of_different_services_in_a_namespace_share_their_outbound_config() -> None:
    snapshot = snapshot_from_yaml(MESH)
    cache = ResourceCache()
    vms = {"productpage-v1-vm": "10.10.0.11", "details-v1-vm": "10.10.0.21", "ratings-v1-vm": "10.10.0.51"}
    views = {name: cache.resources(snapshot, proxy_for(snapshot, node(name, ip))) for name, ip in vms.items()}
    assert cache.outbound_generations == 1
    for name, view in views.items():
        inbound = {n for n in view.of(types.CLUSTER) if n.startswith("inbound|")}
        assert inbound == {"inbound|8080||"}, name
        # Each VM's inbound cluster names its own service.
        assert name.split("-")[0].encode() in view.of(types.CLUSTER)["inbound|8080||"].body
        whole = generate(snapshot, proxy_for(snapshot, node(name, vms[name])))
        for type_url in (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE):
            assert sorted(view.of(type_url)) == sorted(
                m.name if hasattr(m, "name") else m.cluster_name for m in whole[type_url]
            )


SOURCE_LABELS = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: details-from-reviews, namespace: bookinfo}
spec:
  hosts: [details.bookinfo.mesh]
  http:
  - match:
    - sourceLabels: {app: reviews}
    route:
    - destination: {host: details.bookinfo.mesh}
    timeout: 7s
  - route:
    - destination: {host: details.bookinfo.mesh}
"""


def test_proxies_matching_other_source_labels_get_their_own_routes() -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1 + SOURCE_LABELS)
    cache = ResourceCache()
    reviews = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41")))
    reviews_b = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-b", "10.10.0.44")))
    details = cache.resources(snapshot, proxy_for(snapshot, node("details-v1-vm", "10.10.0.21")))
    assert cache.outbound_generations == 2  # app=reviews matches the selector; details does not
    assert reviews.of(types.ROUTE) == reviews_b.of(types.ROUTE)
    assert reviews.of(types.ROUTE) != details.of(types.ROUTE)
    assert _details_timeouts(reviews) == [7]  # the 7 s timeout, for reviews only
    assert _details_timeouts(details) == [0]


def _details_timeouts(view: ProxyResources) -> list[int]:
    wrapped = any_pb2.Any.FromString(view.of(types.ROUTE)["9080"].body)
    config = route_pb2.RouteConfiguration.FromString(wrapped.value)
    (host,) = [h for h in config.virtual_hosts if h.name.startswith("details.bookinfo.mesh")]
    return [r.route.timeout.seconds for r in host.routes]


def test_a_route_change_rebuilds_no_assignment() -> None:
    before = snapshot_from_yaml(MESH)
    after = snapshot_from_yaml(MESH + SOURCE_LABELS)
    assert before.config_version != after.config_version
    cache = ResourceCache()
    client = node("reviews-v1-vm", "10.10.0.41")
    old = cache.resources(before, proxy_for(before, client))
    builds = cache.eds_builds
    new = cache.resources(after, proxy_for(after, client))
    assert cache.eds_builds == builds
    assert new.of(types.ENDPOINT) == old.of(types.ENDPOINT)
    assert new.of(types.ROUTE) != old.of(types.ROUTE)


def test_a_route_change_regenerates_outbound_config_only_and_a_rule_change_inbound_too() -> None:
    before = snapshot_from_yaml(MESH)
    routed = snapshot_from_yaml(MESH + SOURCE_LABELS)
    cache = ResourceCache()
    clients = [node("reviews-v1-vm", "10.10.0.41"), node("details-v1-vm", "10.10.0.21")]
    for client in clients:
        cache.resources(before, proxy_for(before, client))
    generations, outbound = cache.generations, cache.outbound_generations
    for client in clients:
        cache.resources(routed, proxy_for(routed, client))
    assert cache.generations - generations == cache.outbound_generations - outbound == 2
    pooled = snapshot_from_yaml(MESH + SOURCE_LABELS + DETAILS_POOL)
    generations = cache.generations
    view = cache.resources(pooled, proxy_for(pooled, clients[1]))
    assert cache.generations - generations == 2  # both parts: the rule applies to its inbound cluster
    assert b"\x08\x07" in view.of(types.CLUSTER)["inbound|8080||"].body  # max_connections 7
    assert (
        view.of(types.CLUSTER)["inbound|8080||"].body
        == to_resource(
            next(
                c for c in generate(pooled, proxy_for(pooled, clients[1]))[types.CLUSTER] if c.name == "inbound|8080||"
            ),
            types.CLUSTER,
        ).body
    )


DETAILS_POOL = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: details-pool, namespace: bookinfo}
spec:
  host: details.bookinfo.mesh
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 7}
"""


def test_with_iptables_a_proxys_own_address_is_part_of_its_config() -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1)
    cache = ResourceCache()
    meta = {"INTERCEPTION_MODE": "REDIRECT"}
    cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41"), meta))
    cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-b", "10.10.0.44"), meta))
    assert (cache.generations, cache.outbound_generations) == (4, 2)


def test_an_endpoint_change_rebuilds_only_that_services_endpoints() -> None:
    before = snapshot_from_yaml(MESH)
    after = snapshot_from_yaml(MESH + NEW_RATINGS)
    assert before.config_version == after.config_version and before.version != after.version
    cache = ResourceCache()
    client = node("productpage-v1-vm", "10.10.0.11")
    old = cache.resources(before, proxy_for(before, client))
    generations, eds_builds = cache.generations, cache.eds_builds
    new = cache.resources(after, proxy_for(after, client))
    assert cache.generations == generations  # clusters, listeners and routes reused
    rebuilt = cache.eds_builds - eds_builds
    ratings = {n for n in new.of(types.ENDPOINT) if n.endswith("|ratings.bookinfo.mesh")}
    assert rebuilt == len(ratings) == 2
    changed = {n for n, r in new.of(types.ENDPOINT).items() if old.of(types.ENDPOINT)[n] != r}
    assert changed == ratings
    for type_url in (types.CLUSTER, types.LISTENER, types.ROUTE):
        assert new.of(type_url) == old.of(type_url)


SIDECAR_SELECTOR = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews-only, namespace: bookinfo}
spec:
  workloadSelector: {labels: {app: reviews, version: v3}}
  egress:
  - hosts: [./ratings.bookinfo.mesh]
"""


ADMIN = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: admin, namespace: bookinfo}
spec:
  hosts: [admin.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
  workloadSelector:
    labels: {app: admin}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: admin-vm, namespace: bookinfo}
spec:
  address: 10.10.0.61
  labels: {app: admin}
  locality: eu-west/zone-a
"""


def test_equal_outbound_proxies_mean_equal_outbound_config_and_the_cache_serves_what_generate_makes() -> None:
    """The OutboundProxy is what lets proxies share: outbound generation from it must be what
    generation from the whole proxy makes, and every view the cache assembles from shared parts
    must be exactly what `generate` makes for that proxy alone."""
    vms = {
        "productpage-v1-vm": "10.10.0.11",
        "details-v1-vm": "10.10.0.21",
        "reviews-v1-vm": "10.10.0.41",
        "reviews-v2-vm": "10.10.0.42",
        "reviews-v3-vm": "10.10.0.43",
        "ratings-v1-vm": "10.10.0.51",
        "reviews-v1-b": "10.10.0.44",
        "admin-vm": "10.10.0.61",  # its app listens on 9080: no outbound listener there
        "client": "10.10.0.99",
    }
    for extra in ("", SOURCE_LABELS, SIDECAR_SELECTOR):
        snapshot = snapshot_from_yaml(MESH + SECOND_V1 + ADMIN + extra)
        cache = ResourceCache()
        for meta in ({}, {"INTERCEPTION_MODE": "REDIRECT"}):
            for name, ip in vms.items():
                proxy = proxy_for(snapshot, node(name, ip), meta)
                assert proxy.outbound is not None
                # Outbound generation runs on the OutboundProxy alone, never the bound proxy.
                assert ProxyScope(snapshot, proxy.outbound).bound is None
                outbound = generate_outbound(snapshot, proxy.outbound)
                whole = generate(snapshot, proxy)
                for type_url, messages in outbound.items():
                    names = {m.name for m in whole[type_url]}  # type: ignore[attr-defined]
                    assert {m.name for m in messages} <= names, (name, meta, type_url)  # type: ignore[attr-defined]
                view = cache.resources(snapshot, proxy)
                for type_url, messages in generate(snapshot, proxy).items():
                    expected = [to_resource(m, type_url) for m in messages]
                    assert sorted((r.name, r.body) for r in view.of(type_url).values()) == sorted(
                        (r.name, r.body) for r in expected
                    ), (name, meta, type_url)
        assert cache.outbound_generations < cache.generations / 2 + 2


def test_a_route_change_generates_no_cluster_and_a_rule_change_only_its_hosts() -> None:
    """Clusters are made once per OutboundClusterView: a VirtualService edit regenerates the
    proxies' routes but reuses every cluster; a DestinationRule edit regenerates the clusters of
    its own host alone; and what is served is what `generate` makes from scratch."""
    before = snapshot_from_yaml(MESH)
    routed = snapshot_from_yaml(MESH + SOURCE_LABELS)
    pooled = snapshot_from_yaml(MESH + SOURCE_LABELS + DETAILS_POOL)
    cache = ResourceCache()
    client = node("reviews-v1-vm", "10.10.0.41")
    cache.resources(before, proxy_for(before, client))
    built = cache.clusters_built
    assert built > 3
    cache.resources(routed, proxy_for(routed, client))
    assert cache.clusters_built == built
    view = cache.resources(pooled, proxy_for(pooled, client))
    details_ports = len(pooled.services.services["details.bookinfo.mesh"].ports)
    assert cache.clusters_built == built + details_ports
    expected = generate(pooled, proxy_for(pooled, client))[types.CLUSTER]
    assert {c.name: to_resource(c, types.CLUSTER).body for c in expected} == {
        n: r.body for n, r in view.of(types.CLUSTER).items()
    }


def test_another_services_rule_leaves_a_proxys_inbound_part_alone() -> None:
    """The inbound part is keyed by what inbound generation reads (`InboundView`): a
    DestinationRule of details regenerates details' inbound part, not reviews'."""
    routed = snapshot_from_yaml(MESH + SOURCE_LABELS)
    pooled = snapshot_from_yaml(MESH + SOURCE_LABELS + DETAILS_POOL)
    cache = ResourceCache()
    reviews, details = node("reviews-v1-vm", "10.10.0.41"), node("details-v1-vm", "10.10.0.21")
    for client in (reviews, details):
        cache.resources(routed, proxy_for(routed, client))
    generations, outbound = cache.generations, cache.outbound_generations
    for client in (reviews, details):
        cache.resources(pooled, proxy_for(pooled, client))
    inbound = (cache.generations - generations) - (cache.outbound_generations - outbound)
    assert inbound == 1  # details' own: its rule applies to its inbound cluster


def test_a_cluster_view_is_its_whole_key() -> None:
    """Whatever `service_port_clusters` may read is a field of its view, and every field takes
    part in the view's equality and hash (values that cannot be hashed enter as a `Ref`, named by
    their content): adding an input to the view adds it to the key, and there is no other way in.
    """
    import dataclasses
    import inspect

    from meshctl.xds import clusters, clusters_inbound, endpoints, inbound_view, listeners, listeners_inbound
    from meshctl.xds.memo import Ref

    for view_class in (clusters.OutboundClusterView, endpoints.AssignmentView, inbound_view.InboundView):
        fields = dataclasses.fields(view_class)
        assert fields and all(f.compare and f.hash is not False for f in fields), view_class
    assert list(inspect.signature(endpoints.build_assignment).parameters) == ["view"]
    ref_fields = dataclasses.fields(Ref)
    assert [f.name for f in ref_fields if f.compare] == ["digest"]
    # The cluster builders take the view, never a scope or a snapshot.
    for name in ("service_port_clusters", "_outbound", "_subset", "_outbound_base", "_apply_traffic_policy"):
        parameters = inspect.signature(getattr(clusters, name)).parameters
        assert "scope" not in parameters and "snapshot" not in parameters, name
    inbound = [
        clusters_inbound.build_inbound_clusters,
        listeners.build_inbound_listeners,
        listeners_inbound.build_inbound,
        listeners_inbound.inbound_ports,
    ]
    for function in inbound:
        assert list(inspect.signature(function).parameters) == ["view"], function
    snapshot = snapshot_from_yaml(MESH)
    scope_view = clusters.outbound_cluster_view
    from meshctl.snapshot.scope import ProxyScope

    scope = ProxyScope(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41")))
    service = snapshot.services.services["reviews.bookinfo.mesh"]
    a = scope_view(scope, service, service.ports[0])
    b = scope_view(scope, service, service.ports[0])
    assert a == b and hash(a) == hash(b)
    assert dataclasses.replace(a, connect_timeout=a.connect_timeout + 1) != a


def test_the_memo_keeps_what_the_last_two_config_versions_used() -> None:
    from meshctl.xds.memo import GenerationMemo

    memo: GenerationMemo[str, str] = GenerationMemo()
    assert memo.get("a", str.upper) == "A" and memo.made == 1
    memo.advance()
    assert memo.get("a", lambda _k: "again") == "A"  # used by the version before: kept
    memo.get("b", str.upper)
    memo.advance()
    memo.advance()  # two versions that asked for neither
    assert len(memo) == 0
    assert memo.get("a", lambda _k: "new") == "new" and memo.made == 3


def test_a_field_added_to_a_view_is_in_its_key() -> None:
    """Adding an input to a generator's view, as a developer would (a new field), puts it in the
    key by construction: views differing only in it are different keys of the memo, and each
    gets its own generation. There is no way to add a field that the key leaves out, short of
    `compare=False`, which the test above forbids."""
    import dataclasses

    from meshctl.snapshot.scope import ProxyScope
    from meshctl.xds import clusters
    from meshctl.xds.memo import GenerationMemo

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithNewInput(clusters.OutboundClusterView):
        new_input: str = ""

    snapshot = snapshot_from_yaml(MESH)
    scope = ProxyScope(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41")))
    service = snapshot.services.services["reviews.bookinfo.mesh"]
    base = clusters.outbound_cluster_view(scope, service, service.ports[0])
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    a, b = WithNewInput(**fields, new_input="a"), WithNewInput(**fields, new_input="b")
    assert a != b and hash(a) != hash(b)
    memo: GenerationMemo[clusters.OutboundClusterView, tuple[object, ...]] = GenerationMemo()
    made: list[str] = []
    for view in (a, b, a):
        memo.get(view, lambda v: (made.append(v.new_input), ())[1])  # type: ignore[attr-defined]
    assert made == ["a", "b"]


# -- the outbound view: what outbound generation reads of a proxy is its key ---------------------


def test_the_outbound_proxy_is_the_whole_key_of_outbound_generation() -> None:
    """Outbound generation takes the OutboundProxy and the snapshot, nothing of the bound proxy,
    and every field of the OutboundProxy is compared: an input added to it is keyed, and one
    not added cannot be read (a scope of an OutboundProxy has no bound proxy to read it from)."""
    import dataclasses
    import inspect

    import pytest

    from meshctl.snapshot.proxy import OutboundProxy
    from meshctl.xds.inbound_view import inbound_view

    fields = dataclasses.fields(OutboundProxy)
    assert fields and all(f.compare and f.hash is not False for f in fields)
    parameters = inspect.signature(generate_outbound).parameters
    assert list(parameters) == ["snapshot", "proxy", "memos"]
    assert parameters["proxy"].annotation == "OutboundProxy"
    snapshot = snapshot_from_yaml(MESH)
    proxy = proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41"))
    assert proxy.outbound is not None
    scope = ProxyScope(snapshot, proxy.outbound)
    assert scope.bound is None and scope.proxy is proxy.outbound
    with pytest.raises(ValueError, match="bound proxy"):
        inbound_view(scope)
    # A proxy bound in another snapshot is seen as this snapshot sees it, not as it was bound.
    other = snapshot_from_yaml(MESH + SIDECAR_SELECTOR)
    assert ProxyScope(other, proxy).proxy == proxy_for(other, node("reviews-v1-vm", "10.10.0.41")).outbound


LOOPBACK_INGRESS = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shop, namespace: shop}
spec:
  hosts: [shop.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP, targetPort: 9080}]
  resolution: STATIC
  workloadSelector: {labels: {app: shop}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: shop-a, namespace: shop}
spec: {address: 10.0.0.5, labels: {app: shop}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: shop-b, namespace: shop}
spec: {address: 127.0.0.1, labels: {app: shop}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  ingress:
  - port: {number: 9080, name: http, protocol: HTTP}
    defaultEndpoint: 127.0.0.1:8080
"""


def test_proxies_whose_app_ports_differ_by_their_address_get_their_own_outbound_config() -> None:
    """A Sidecar ingress listener without `bind` binds the proxy's own address: on a VM's
    address it takes the service port from the app (outbound 127.0.0.1:9080 stays), on a
    loopback address it cannot, and the app's port must stay free. Two replicas of one service
    differing only in that must not share an outbound part (their old key held the family of
    the address, not this)."""
    snapshot = snapshot_from_yaml(LOOPBACK_INGRESS)
    cache = ResourceCache()
    outbound = {}
    for name, ip in (("shop-a", "10.0.0.5"), ("shop-b", "127.0.0.1")):
        proxy = proxy_for(snapshot, f"sidecar~{ip}~{name}.shop~shop.svc.cluster.local")
        assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, name)
        assert proxy.outbound is not None
        outbound[name] = proxy.outbound
    assert outbound["shop-a"].app_ports == {8080} and outbound["shop-b"].app_ports == {8080, 9080}
    listeners = {
        name: {m.name for m in generate_outbound(snapshot, o)[types.LISTENER]}  # type: ignore[attr-defined]
        for name, o in outbound.items()
    }
    assert "127.0.0.1_9080" in listeners["shop-a"] and "127.0.0.1_9080" not in listeners["shop-b"]


def test_projected_labels_match_every_tested_selector_as_the_labels_do() -> None:
    """The OutboundProxy keeps of the labels only the pairs some tested selector holds; for
    every selector generation tests, matching those pairs is matching the full labels."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from meshctl.config.labels import labels_match

    keys, values = st.sampled_from("abcd"), st.sampled_from("xyz")
    labels_st = st.dictionaries(keys, values, max_size=4)
    selectors_st = st.lists(st.dictionaries(keys, values, min_size=1, max_size=3), max_size=6)

    @settings(max_examples=200, deadline=None)
    @given(labels=labels_st, selectors=selectors_st)
    def check(labels: dict[str, str], selectors: list[dict[str, str]]) -> None:
        sidecars = "".join(
            f"---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r{i}, namespace: ns}}\n"
            f"spec:\n  host: h{i}.example.com\n  workloadSelector:\n    matchLabels: {dict(s)}\n"
            for i, s in enumerate(selectors)
        )
        snapshot = snapshot_from_yaml(sidecars or "---\n", namespace="ns")
        proxy = proxy_for(snapshot, "sidecar~10.0.0.9~c.ns~ns.svc.cluster.local", {"LABELS": labels})
        assert proxy.outbound is not None
        projected = proxy.outbound.labels
        for selector in selectors:
            assert labels_match(selector, projected) == labels_match(selector, labels)
        assert set(projected.items()) <= set(labels.items())

    check()


# -- the kinds each part reads, declared once in xds/generate.py ----------------------------------


#: What the shared rich mesh lacks for this test: a namespace without mutual TLS (its services'
#: clusters get no auto mTLS) and a gateway whose JWT keys are fetched (a JWKS cluster).
KINDS_EXTRA = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: plain, namespace: plain}
spec:
  hosts: [plain.plain.mesh]
  location: MESH_INTERNAL
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: plain}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: plain-1, namespace: plain}
spec: {address: 10.30.0.1, labels: {app: plain}, serviceAccount: plain}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: plain}
spec: {mtls: {mode: DISABLE}}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: edge-jwt, namespace: bookinfo}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  jwtRules:
  - issuer: https://issuer.example.com
    jwksUri: https://keys.example.com/jwks.json
"""


def test_outbound_clusters_and_assignments_read_only_the_kinds_declared_for_them() -> None:
    """The server keeps outbound clusters while no kind of `CLUSTER_KINDS` changes, and EDS sets
    while no kind of `ASSIGNMENT_KINDS` (nor an endpoint) does: so taking away every config of
    any other kind, one kind at a time, from a mesh that has every kind, must change no proxy's
    outbound clusters and no assignment. (Taking away a declared kind does change them: the
    comparison is not blind.)"""
    from conftest import EXTRA_FILES, GATEWAY, PRODUCTPAGE, REVIEWS_V1, SLEEP, jwt_yaml

    from meshctl.registry.serviceentry import KINDS as REGISTRY_KINDS
    from meshctl.registry.serviceentry import build_file_model
    from meshctl.snapshot.model import build_snapshot
    from meshctl.testing.builders import configs_from_yaml
    from meshctl.xds.endpoints import build_load_assignment
    from meshctl.xds.generate import ASSIGNMENT_KINDS, CLUSTER_KINDS, generate_outbound_clusters
    from meshctl.xds.names import eds_cluster_names

    configs = configs_from_yaml("\n---\n".join([MESH, *EXTRA_FILES.values(), jwt_yaml(), KINDS_EXTRA]))
    full = build_snapshot(configs, build_file_model(configs))
    shop = "sidecar~10.20.0.5~reviews-v1.shop~shop.svc.cluster.local"
    outbound = {}
    for node_id in (PRODUCTPAGE, REVIEWS_V1, GATEWAY, SLEEP, shop):
        bound = proxy_for(full, node_id, {"LABELS": {"istio": "ingressgateway"}} if node_id == GATEWAY else None)
        assert bound.outbound is not None
        outbound[node_id] = bound.outbound

    def clusters(snapshot: Snapshot) -> dict[str, list[bytes]]:
        return {
            n: [to_resource(c, types.CLUSTER).body for c in generate_outbound_clusters(snapshot, o)]
            for n, o in outbound.items()
        }

    names = sorted({n for o in outbound.values() for n in eds_cluster_names(generate_outbound_clusters(full, o))})

    def assignments(snapshot: Snapshot) -> list[bytes]:
        return [build_load_assignment(snapshot, n).SerializeToString(deterministic=True) for n in names]

    def without(kind: str) -> Snapshot:
        kept = [c for c in configs if c.key.kind != kind]
        return build_snapshot(kept, build_file_model(kept))

    kinds = {c.key.kind for c in configs} - REGISTRY_KINDS
    assert {"VirtualService", "Gateway", "AuthorizationPolicy", *CLUSTER_KINDS} <= kinds
    expected_clusters, expected_assignments = clusters(full), assignments(full)
    assert len(names) >= 9  # every service and subset of the example, the shop among them
    for kind in sorted(kinds):
        reduced = without(kind)
        if kind not in CLUSTER_KINDS:
            assert clusters(reduced) == expected_clusters, f"outbound clusters read {kind}"
            assert reduced.version_of(CLUSTER_KINDS) == full.version_of(CLUSTER_KINDS)
        if kind not in ASSIGNMENT_KINDS:
            assert assignments(reduced) == expected_assignments, f"assignments read {kind}"
    assert clusters(without("DestinationRule")) != expected_clusters
    assert assignments(without("DestinationRule")) != expected_assignments
    assert without("DestinationRule").version_of(CLUSTER_KINDS) != full.version_of(CLUSTER_KINDS)


def test_a_virtual_service_change_keeps_every_outbound_cluster_part_and_eds_set() -> None:
    """What the kinds buy: after a VirtualService edit the server generates no cluster part and
    builds no EDS set again, and every proxy is still served exactly what `generate` makes."""
    snapshot = snapshot_from_yaml(MESH)
    edited = snapshot_from_yaml(MESH.replace("weight: 90", "weight: 70").replace("weight: 10", "weight: 30"))
    assert edited.config_version != snapshot.config_version
    cache = ResourceCache()
    nodes = [node("productpage-v1-vm", "10.10.0.11"), node("reviews-v1-vm", "10.10.0.41")]
    for n in nodes:
        cache.resources(snapshot, proxy_for(snapshot, n))
    clusters, eds = cache.cluster_generations, cache.eds_builds
    for n in nodes:
        proxy = proxy_for(edited, n)
        assert_serves_what_generate_makes(cache.resources(edited, proxy), edited, proxy, n)
    assert (cache.cluster_generations, cache.eds_builds) == (clusters, eds)


def _scoped_mesh(max_connections: int) -> str:
    """Two namespaces, each importing only its own services (Sidecar `./*`), and a rule for a
    service of the first."""
    out = []
    for ns in ("ns-a", "ns-b"):
        out.append(
            f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: {ns}}}
spec:
  hosts: [web.{ns}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.{len(out)}.0.1}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  egress: [{{hosts: ["./*"]}}]
"""
        )
    out.append(
        f"""apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: web, namespace: ns-a}}
spec:
  host: web.ns-a.mesh
  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: {max_connections}}}}}}}
"""
    )
    return "---\n".join(out)


def test_a_rule_change_regenerates_only_the_parts_that_asked_for_that_rule() -> None:
    """Outbound parts note the DestinationRules they asked for: a rule of a host only one
    namespace imports regenerates that namespace's parts, and the other namespace keeps its own
    (they asked for no such rule), while every proxy is still served what `generate` makes."""
    cache = ResourceCache()
    nodes = [f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local" for i, ns in enumerate(("ns-a", "ns-b"))]
    for step, limit in enumerate((10, 20)):
        snapshot = snapshot_from_yaml(_scoped_mesh(limit))
        before = (cache.cluster_generations, cache.outbound_generations)
        for n in nodes:
            proxy = proxy_for(snapshot, n)
            assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, n)
        made = (cache.cluster_generations - before[0], cache.outbound_generations - before[1])
        assert made == ((2, 2) if step == 0 else (1, 1)), made
