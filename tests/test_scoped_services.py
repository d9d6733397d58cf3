"""A service change regenerates only the outbound parts whose scope reads it.

A sidecar's outbound parts are not keyed on every service but checked against what they read
of the registry (`ServicesRead`): these tests count the parts generated after a ServiceEntry
no other namespace imports, and check, after random service edits through the store and the
file registry as the server applies them, that every part the cache kept is what generation
makes from scratch.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.config.mesh import MeshSettings
from meshctl.server.cache import ResourceCache
from meshctl.server.proxy_resources import ProxyResources
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.snapshot.proxy import Proxy
from meshctl.testing.builders import configs_from_yaml, file_discovery, proxy_for, snapshot_from_yaml
from meshctl.xds.generate import generate
from meshctl.xds.names import resource_name
from meshctl.xds.resources import to_resource

NAMES = ("a", "b", "c")
#: Namespaces with clients (and a Sidecar each), and one with services alone.
CLIENTS = ("ns1", "ns2")
NAMESPACES = (*CLIENTS, "ns3")
#: A loopback range of six addresses: hosts collide and run out, so one host added moves others.
SMALL_LOOPBACK = MeshSettings(loopback_range="127.240.0.0/29")


def _entry(name: str, ns: str, n: int) -> str:
    """A ServiceEntry `name` in `ns` whose host may name another namespace (`a.ns1.mesh` declared
    in ns3, where a route's short name `a` in ns1 then finds it), resolved by STATIC, NONE or
    DNS, HTTP or TCP (TCP hosts get loopback addresses), exported everywhere or to `ns` alone."""
    host = f"{name}.{NAMESPACES[n % 3]}.mesh"
    protocol = "TCP" if n % 2 == 0 else "HTTP"
    resolution = ("STATIC", "NONE", "DNS")[(n // 3) % 3]
    export = '["."]' if n in (4, 5) else '["*"]'
    selector = "" if resolution == "DNS" else f"\n  workloadSelector: {{labels: {{app: {name}}}}}"
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{host}]
  location: MESH_INTERNAL
  resolution: {resolution}
  exportTo: {export}
  ports: [{{number: {8000 + n % 2}, name: {protocol.lower()}, protocol: {protocol}}}]{selector}
"""


def _rule(name: str, ns: str, n: int) -> str:
    """A DestinationRule of `ns` hashing by a header, for a host that may be declared elsewhere:
    a client asks for it by the service's namespace, so a service moving changes which applies."""
    return f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {ns}}}
spec:
  host: {name}.{NAMESPACES[n % 3]}.mesh
  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-{n}}}}}}}
"""


def _workload(name: str, ns: str, n: int) -> str:
    """A VM of service `name` in `ns`, under one of two service accounts (the identities a
    client's mutual TLS checks)."""
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}-vm, namespace: {ns}}}
spec: {{address: 10.{NAMESPACES.index(ns) + 1}.{NAMES.index(name)}.{n}, labels: {{app: {name}}},
  serviceAccount: sa-{n % 2}}}
"""


def _route(name: str, ns: str, n: int) -> str:
    """A VirtualService of `ns` for `name`, by its short name or in full, routing to another
    service by short name (resolved among every known host) or in full."""
    other = NAMES[(NAMES.index(name) + n) % len(NAMES)]
    host = name if n % 2 else f"{name}.{ns}.mesh"
    target = other if n != 2 else f"{other}.{ns}.mesh"
    return f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{host}]
  http: [{{timeout: {n}s, route: [{{destination: {{host: {target}}}}}]}}]
  tcp: [{{route: [{{destination: {{host: {target}}}}}]}}]
"""


def _sidecar(ns: str, n: int) -> str:
    """Its own namespace only, everything, its own and ns3's, or its own and one host."""
    hosts = {1: '["./*"]', 2: '["*/*"]', 3: '["./*", "ns3/*"]'}.get(n, '["./*", "*/b.ns1.mesh"]')
    return f"""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  egress: [{{hosts: {hosts}}}]
"""


class Tree:
    """The mesh as files would hold it, one document per (what, name, namespace)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str, str], str] = {}
        for ns in CLIENTS:
            self.docs[("sidecar", "", ns)] = _sidecar(ns, 1)
            for name in NAMES:
                self.docs[("entry", name, ns)] = _entry(name, ns, 3 if ns == "ns1" else 1)
                self.docs[("workload", name, ns)] = _workload(name, ns, 1)
        self.docs[("route", "a", "ns1")] = _route("a", "ns1", 1)

    def apply(self, edit: tuple[str, str, str, int]) -> None:
        what, name, ns, n = edit
        key = (what, name if what != "sidecar" else "", ns)
        if n == 0:
            self.docs.pop(key, None)
        elif what == "sidecar":
            if ns in CLIENTS:
                self.docs[key] = _sidecar(ns, n)
        elif what == "route":
            self.docs[key] = _route(name, ns, n)
        else:
            self.docs[key] = {"entry": _entry, "workload": _workload, "rule": _rule}[what](name, ns, n)

    def text(self) -> str:
        return "---".join(self.docs[k] for k in sorted(self.docs))


edits = st.tuples(
    st.sampled_from(("entry", "entry", "workload", "route", "rule", "sidecar")),
    st.sampled_from(NAMES),
    st.sampled_from(NAMESPACES),
    st.integers(min_value=0, max_value=8),
)


def assert_serves_what_generate_makes(view: ProxyResources, snapshot: Snapshot, proxy: Proxy, what: object) -> None:
    """Every resource the cache assembled for `proxy` is, byte for byte, what `generate` makes
    for it from scratch, and nothing else is there."""
    for type_url, messages in generate(snapshot, proxy).items():
        expected = sorted((r.name, r.body) for r in (to_resource(m, type_url) for m in messages))
        assert sorted((r.name, r.body) for r in view.of(type_url).values()) == expected, (what, type_url)


#: A client per namespace without iptables (outbound listeners on loopback addresses), and one
#: with (listeners per endpoint for TCP services without an address).
NODES: list[tuple[str, dict[str, str]]] = [
    *((f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local", {}) for i, ns in enumerate(CLIENTS)),
    ("sidecar~10.9.0.9~redirected.ns1~ns1.svc.cluster.local", {"INTERCEPTION_MODE": "REDIRECT"}),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(edits, min_size=1, max_size=10))
def test_kept_parts_equal_fresh_ones_after_random_service_edits(sequence: list[tuple[str, str, str, int]]) -> None:
    """After each edit, applied as the server applies it (the store, the file registry, an
    updated snapshot), every client is served exactly what generation from a full build makes;
    and a ServiceEntry no client can see (exported to its own namespace, named by no short
    name) regenerates no part at all."""
    tree = Tree()
    store, discovery = file_discovery(mesh=SMALL_LOOPBACK)
    cache = ResourceCache()
    nodes = [parse_node_id(n, metadata) for n, metadata in NODES]

    def serve() -> None:
        snapshot = discovery.build_next()
        full = discovery.build()
        for node in nodes:
            served = cache.resources(snapshot, bind_proxy(node, snapshot))
            for type_url, messages in generate(full, bind_proxy(node, full)).items():
                got = served.of(type_url)
                assert sorted(got) == sorted(resource_name(m) for m in messages), (node.id, type_url)
                for message in messages:
                    body = message.SerializeToString(deterministic=True)
                    assert got[resource_name(message)].body.endswith(body), (node.id, type_url)

    store.replace_all(configs_from_yaml(tree.text()))
    serve()
    for edit in sequence:
        tree.apply(edit)
        store.replace_all(configs_from_yaml(tree.text()))
        serve()
    # A part is checked when its key's config is not found whole at the snapshot's config
    # version: an edit undone finds the whole one of before, so the first entry below may
    # still regenerate a part last made for the undone edit; the second none.
    for unseen in ("unseen-1", "unseen-2"):
        tree.docs[(unseen, "", "ns3")] = f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {unseen}, namespace: ns3}}
spec:
  hosts: [{unseen}.ns3.mesh]
  exportTo: ["."]
  resolution: STATIC
  ports: [{{number: 80, name: http, protocol: HTTP}}]
"""
        generations = (cache.cluster_generations, cache.outbound_generations)
        store.replace_all(configs_from_yaml(tree.text()))
        serve()
    assert (cache.cluster_generations, cache.outbound_generations) == generations


def _namespaces_mesh(extra: str = "") -> str:
    """ns1 and ns2 import their own namespace alone; ns3 has no Sidecar, so sees everything."""
    docs = []
    for i, ns in enumerate(NAMESPACES):
        docs.append(
            f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: {ns}}}
spec:
  hosts: [web.{ns}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.{i}.0.1}}]
"""
        )
        if ns in CLIENTS:
            docs.append(_sidecar(ns, 1))
    return "---".join(docs) + extra


CATALOG_ENTRY = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: catalog}
spec:
  hosts: [billing.catalog.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9090, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.7.0.1}]
"""


def test_a_service_entry_no_sidecar_imports_regenerates_only_the_parts_that_see_it() -> None:
    """A ServiceEntry in a namespace of its own: ns1's and ns2's clients import their own
    namespace alone and keep their parts (clusters, listeners and routes); ns3's client, with
    no Sidecar, sees the new service and gets it. Replacing it by another likewise. Every client
    is served what `generate` makes."""
    cache = ResourceCache()
    nodes = [f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local" for i, ns in enumerate(NAMESPACES)]
    for step, extra in enumerate(("", CATALOG_ENTRY, CATALOG_ENTRY.replace("billing", "payments"))):
        snapshot = snapshot_from_yaml(_namespaces_mesh(extra))
        before = (cache.cluster_generations, cache.outbound_generations)
        for n in nodes:
            proxy = proxy_for(snapshot, n)
            assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, (step, n))
        made = (cache.cluster_generations - before[0], cache.outbound_generations - before[1])
        assert made == ((3, 3) if step == 0 else (1, 1)), (step, made)


def _web(resolution: str = "STATIC", protocol: str = "HTTP", address: str = "10.1.0.1", account: str = "web") -> str:
    """ns1's service, its VM, and ns1's Sidecar importing ns1 alone."""
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: ns1}}
spec:
  hosts: [web.ns1.mesh]
  location: MESH_INTERNAL
  resolution: {resolution}
  ports: [{{number: 8080, name: {protocol.lower()}, protocol: {protocol}}}]
  workloadSelector: {{labels: {{app: web}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: web-vm, namespace: ns1}}
spec: {{address: {address}, labels: {{app: web}}, serviceAccount: {account}}}
---
{_sidecar("ns1", 1)}"""


def _hidden(host: str, protocol: str = "HTTP") -> str:
    """A ServiceEntry of ns3 that ns1 cannot see (exported to ns3 alone)."""
    return f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: hidden, namespace: ns3}}
spec:
  hosts: [{host}]
  exportTo: ["."]
  resolution: STATIC
  ports: [{{number: 8080, name: {protocol.lower()}, protocol: {protocol}}}]
"""


def _web_route(destination: str) -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: ns1}}
spec:
  hosts: [web.ns1.mesh]
  http: [{{route: [{{destination: {{host: {destination}, port: {{number: 8080}}}}}}]}}]
"""


HASHING_RULE = """---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: ns3}
spec:
  host: api.ns1.mesh
  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
"""
#: (what it shows, the mesh before, after, the client's node metadata)
READS = {
    # A route's short destination `api` in ns1 comes to name a host ns1 cannot see.
    "a short name resolved": (_web() + _web_route("api"), _web() + _web_route("api") + _hidden("api.ns1.mesh"), {}),
    # A host ns1 cannot see comes to be declared in ns3, whose rule then applies to it.
    "a rule asked for": (
        _web() + _web_route("api.ns1.mesh") + HASHING_RULE,
        _web() + _web_route("api.ns1.mesh") + HASHING_RULE + _hidden("api.ns1.mesh"),
        {},
    ),
    # A TCP host sorting before web's and wanting its loopback address takes it.
    "a loopback address": (_web(protocol="TCP"), _web(protocol="TCP") + _hidden("a3.ns3.mesh", "TCP"), {}),
    # web's VM runs under another account: its clients' mutual TLS checks another identity.
    "an identity": (_web(), _web(account="web-2") + _hidden("other.ns3.mesh"), {}),
    # web has no address: a redirected client listens on its endpoints' addresses.
    "endpoints": (
        _web("NONE", "TCP"),
        _web("NONE", "TCP", address="10.1.0.2") + _hidden("other.ns3.mesh"),
        {"INTERCEPTION_MODE": "REDIRECT"},
    ),
}


@pytest.mark.parametrize("what", sorted(READS))
def test_a_part_is_regenerated_when_a_host_it_read_changed(what: str) -> None:
    """Each way an ns1 client's outbound part reads the registry beyond its scope's list of
    services, changed by a service ns1 cannot see (or alongside one): the part is not kept."""
    before, after, metadata = READS[what]
    cache = ResourceCache()
    node = "sidecar~10.9.0.1~client.ns1~ns1.svc.cluster.local"
    configs = []
    for step, text in enumerate((before, after)):
        snapshot = snapshot_from_yaml(text, mesh=SMALL_LOOPBACK)
        proxy = proxy_for(snapshot, node, metadata)
        assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, (what, step))
        configs.append(generate(snapshot, proxy))
    assert configs[0] != configs[1], "the change shows in the client's config"
    assert cache.outbound_generations == 2


def test_an_endpoint_change_rebuilds_only_the_eds_sets_naming_its_service() -> None:
    """ns1's service moves to another address: the EDS sets of ns1's client and of ns3's (which
    sees everything) are made again, ns2's client keeps its own; every client is served what
    `generate` makes."""
    cache = ResourceCache()
    nodes = [f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local" for i, ns in enumerate(NAMESPACES)]
    for step, text in enumerate((_namespaces_mesh(), _namespaces_mesh().replace("10.0.0.1", "10.0.0.9"))):
        snapshot = snapshot_from_yaml(text)
        before = cache.eds_set_builds
        for n in nodes:
            proxy = proxy_for(snapshot, n)
            assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, (step, n))
        assert cache.eds_set_builds - before == (3 if step == 0 else 2), step


def test_after_a_change_undone_the_next_service_change_keeps_what_it_did_not_touch() -> None:
    """web.ns1 moves and moves back, then a ServiceEntry only ns3's client sees comes: ns1's
    and ns2's clients keep their parts and EDS sets, which are those of before the move (the
    ones the move replaced are tried too), and only ns3's are made again."""
    cache = ResourceCache()
    nodes = [f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local" for i, ns in enumerate(NAMESPACES)]
    moved = _namespaces_mesh().replace("10.0.0.1", "10.0.0.9")
    for step, text in enumerate((_namespaces_mesh(), moved, _namespaces_mesh(), _namespaces_mesh(CATALOG_ENTRY))):
        snapshot = snapshot_from_yaml(text)
        before = (cache.outbound_generations, cache.eds_set_builds)
        for n in nodes:
            proxy = proxy_for(snapshot, n)
            assert_serves_what_generate_makes(cache.resources(snapshot, proxy), snapshot, proxy, (step, n))
    assert (cache.outbound_generations - before[0], cache.eds_set_builds - before[1]) == (1, 1)


def _catalog(count: int, skip: int = -1) -> str:
    """A namespace of `count` ServiceEntries (all but `skip`) whose Sidecar imports them all."""
    docs = [_sidecar("catalog", 1)]
    for i in range(count):
        if i != skip:
            docs.append(
                f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ext-{i}, namespace: catalog}}
spec:
  hosts: [ext-{i}.catalog.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.8.{i // 256}.{i % 256}}}]
"""
            )
    return "---".join(docs)


def test_a_service_added_where_a_sidecar_sees_it_makes_its_own_clusters_alone() -> None:
    """A namespace of 200 services, its Sidecar importing them all: a service added, another,
    then one removed, each serializes the clusters of the services that changed and the
    catch-alls, not the namespace's 200 again, and its EDS set takes the other clusters'
    assignments from the last set; the client is served what `generate` makes."""
    cache = ResourceCache()
    node = "sidecar~10.9.0.1~client.catalog~catalog.svc.cluster.local"
    for step, text in enumerate((_catalog(200), _catalog(201), _catalog(202), _catalog(202, skip=7))):
        snapshot = snapshot_from_yaml(text)
        before = (cache.cluster_resources_made, cache.eds_set_members_made)
        proxy = proxy_for(snapshot, node)
        view = cache.resources(snapshot, proxy)
        assert_serves_what_generate_makes(view, snapshot, proxy, step)
        made = (cache.cluster_resources_made - before[0], cache.eds_set_members_made - before[1])
        if step == 0:
            assert min(made) >= 200
        else:
            assert max(made) < 10, (step, made)


def test_a_service_added_to_a_large_namespace_updates_its_route_plan_and_serves_what_generate_makes() -> None:
    """A namespace of 300 services through the store and the file registry, as the server
    applies edits: a service added, another, one removed, that undone (its config found whole),
    one added again. The route configuration's domain plan is updated from the one before
    where services only came, and each time the client is served, byte for byte, what
    generation makes from a full build."""
    store, discovery = file_discovery()
    cache = ResourceCache()
    node = parse_node_id("sidecar~10.9.0.1~client.catalog~catalog.svc.cluster.local")
    updated = []
    steps = (_catalog(300, 150), _catalog(300), _catalog(301), _catalog(301, 7), _catalog(301), _catalog(302, 7))
    for text in steps:
        store.replace_all(configs_from_yaml(text))
        snapshot = discovery.build_next()
        before = cache.route_plans()[1]
        view = cache.resources(snapshot, bind_proxy(node, snapshot))
        full = discovery.build()
        assert_serves_what_generate_makes(view, full, bind_proxy(node, full), text.count("ServiceEntry"))
        updated.append(cache.route_plans()[1] - before)
    assert updated == [0, 1, 1, 0, 0, 1]
