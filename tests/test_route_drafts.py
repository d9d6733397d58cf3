"""A sidecar route configuration built from its build before (`meshctl.xds.route_drafts`) is the
one built from nothing: byte for byte, with the same DestinationRules and short names noted in
the scope's traces (what the server keeps the part by), after any sequence of changes applied
as the server applies them (the store, the file registry, snapshots built from the one before,
so unchanged services, rules and configs keep their objects). And a VirtualService changed, or
a service added, costs its own pieces: the rest is taken over."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyNode, parse_node_id
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, file_discovery
from meshctl.xds import types
from meshctl.xds.resources import to_resource
from meshctl.xds.route_memo import RouteMemo
from meshctl.xds.routes import build_route_resources, build_routes

NAMES = ("a", "b", "c", "d")
CLIENTS = ("ns1", "ns2")
NAMESPACES = (*CLIENTS, "ns3")


def _entry(name: str, ns: str, n: int) -> str:
    """A ServiceEntry whose host may name another namespace, on one or two HTTP ports or a TCP
    one, with or without an address, resolved statically, by DNS or dynamically."""
    host = f"{name}.{NAMESPACES[n % 3]}.mesh"
    ports = {
        0: "[{number: 9080, name: http, protocol: HTTP}]",
        1: "[{number: 9080, name: http, protocol: HTTP}, {number: 8000, name: http2, protocol: HTTP}]",
        2: "[{number: 8000, name: http, protocol: HTTP}]",
        3: "[{number: 9080, name: tcp, protocol: TCP}]",
    }[(n // 3) % 4]
    resolution = "DYNAMIC_DNS" if n == 7 and name.startswith("*") else ("STATIC", "DNS")[n % 2]
    addresses = f"\n  addresses: [10.7.{n}.{NAMES.index(name.lstrip('*.') or 'a') + 1}]" if n % 4 == 1 else ""
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name.replace("*.", "wild-")}, namespace: {ns}}}
spec:
  hosts: [{host}]{addresses}
  location: MESH_INTERNAL
  resolution: {resolution}
  ports: {ports}
  endpoints: [{{address: 10.8.{n}.1}}]
"""


def _route(name: str, ns: str, n: int) -> str:
    """A VirtualService of `ns`: for one host (by short name or in full), several, or every
    host of a namespace (a wildcard), routing by short name or in full, some with no HTTP route
    (TCP alone), one delegating to another VirtualService."""
    other = NAMES[(NAMES.index(name) + n) % len(NAMES)]
    neighbour = NAMES[(NAMES.index(name) + 1) % len(NAMES)]
    hosts = {
        0: f"[{name}]",
        1: f"[{name}.{ns}.mesh]",
        2: f"[{name}.{ns}.mesh, {neighbour}.ns3.mesh, api.example.com]",
        3: f'["*.{ns}.mesh"]',
        4: f"[{name}, {neighbour}]",
        5: f"[{name}.{ns}.mesh]",
    }[n % 6]
    target = other if n % 2 else f"{other}.{NAMESPACES[n % 3]}.mesh"
    if n == 5:
        http = f"[{{delegate: {{name: delegate, namespace: {ns}}}}}]"
    elif n == 8:
        http = "[]"
    else:
        http = f"[{{timeout: {n + 1}s, route: [{{destination: {{host: {target}}}}}]}}]"
    return f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: {hosts}
  http: {http}
  tcp: [{{route: [{{destination: {{host: {target}}}}}]}}]
"""


def _delegate(ns: str, n: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: delegate, namespace: {ns}}}
spec:
  http: [{{timeout: {n + 10}s, route: [{{destination: {{host: {NAMES[n % 4]}.{ns}.mesh}}}}]}}]
"""


def _rule(name: str, ns: str, n: int) -> str:
    """A DestinationRule hashing by a header, for the whole host or one port of it, of a service
    of its own namespace or of another."""
    policy = (
        f"{{loadBalancer: {{consistentHash: {{httpHeaderName: x-{n}}}}}}}"
        if n % 2
        else "{portLevelSettings: [{port: {number: 9080}, "
        f"loadBalancer: {{consistentHash: {{httpHeaderName: p-{n}}}}}}}]}}"
    )
    return f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {ns}}}
spec:
  host: {name}.{ns if n < 5 else NAMESPACES[n % 3]}.mesh
  trafficPolicy: {policy}
"""


def _sidecar(ns: str, n: int) -> str:
    """Its own namespace, everything, its own and ns3's, one host, or an egress listener on a
    port no service has (its services reached on their own ports from there)."""
    if n >= 5:
        return f"""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  egress:
  - port: {{number: 7000, name: http-local, protocol: HTTP}}
    hosts: ["./*", "ns3/*"]
  - hosts: ["./*"]
"""
    hosts = {1: '["./*"]', 2: '["*/*"]', 3: '["./*", "ns3/*"]'}.get(n, '["./*", "*/b.ns3.mesh"]')
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
        for ns in NAMESPACES:
            for i, name in enumerate(NAMES):
                self.docs[("entry", name, ns)] = _entry(name, ns, NAMESPACES.index(ns) + 3 * i)
        for ns in CLIENTS:
            self.docs[("sidecar", "", ns)] = _sidecar(ns, 3)
            self.docs[("route", "a", ns)] = _route("a", ns, 1)
            self.docs[("rule", "b", ns)] = _rule("b", ns, 1)
            self.docs[("rule", "d", ns)] = _rule("d", ns, 2)
        self.docs[("route", "c", "ns1")] = _route("c", "ns1", 2)
        # ns2's VirtualService for `a` delegates its HTTP routes
        self.docs[("route", "a", "ns2")] = _route("a", "ns2", 5)
        self.docs[("delegate", "", "ns2")] = _delegate("ns2", 1)

    def apply(self, edit: tuple[str, str, str, int]) -> None:
        what, name, ns, n = edit
        if what == "sidecar" and ns not in CLIENTS:
            ns = CLIENTS[n % 2]
        elif what == "delegate":
            ns = "ns2"
        key = (what, "" if what in ("sidecar", "delegate") else name, ns)
        if n == 0 and what != "route":
            self.docs.pop(key, None)
        elif what == "sidecar":
            self.docs[key] = _sidecar(ns, n)
        elif what == "delegate":
            self.docs[key] = _delegate(ns, n)
        elif what == "route" and n == 9:
            self.docs.pop(key, None)
        else:
            self.docs[key] = {"entry": _entry, "route": _route, "rule": _rule}[what](name, ns, n)

    def text(self) -> str:
        return "---".join(self.docs[k] for k in sorted(self.docs))


edits = st.tuples(
    st.sampled_from(("entry", "entry", "route", "route", "route", "rule", "rule", "sidecar", "delegate")),
    st.sampled_from(NAMES),
    st.sampled_from(NAMESPACES),
    st.integers(min_value=0, max_value=9),
)

NODES = [
    parse_node_id(f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local", {}) for i, ns in enumerate(CLIENTS)
] + [parse_node_id("sidecar~10.9.0.9~redirected.ns1~ns1.mesh", {"INTERCEPTION_MODE": "REDIRECT"})]


def _routes(snapshot: Snapshot, node: ProxyNode, memo: RouteMemo | None) -> tuple[object, ...]:
    """Every route configuration of the node's sidecar as (name, bytes), and the rules and
    short names its generation noted."""
    scope = ProxyScope(snapshot, bind_proxy(node, snapshot))
    scope.rule_trace, scope.name_trace = {}, set()
    made = build_route_resources(scope, memo) if memo is not None else build_routes(scope)
    resources = sorted((r.name, r.body) for r in (to_resource(m, types.ROUTE) for m in made))
    return resources, scope.rule_trace, scope.name_trace


def test_route_configurations_taken_over_equal_fresh_ones() -> None:
    """After each edit of a random sequence, every client's route configurations, built with
    the memo that kept the builds before, are what a build from nothing (no memo, a snapshot
    built whole) makes, and the traces they leave are the same; and pieces were taken over."""
    kept: list[int] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(edits, min_size=1, max_size=12))
    def run(sequence: list[tuple[str, str, str, int]]) -> None:
        tree = Tree()
        store, discovery = file_discovery()
        memo = RouteMemo()

        def check(what: object) -> None:
            snapshot = discovery.build_next()
            full = discovery.build()
            memo.advance()
            for node in NODES:
                assert _routes(snapshot, node, memo) == _routes(full, node, None), (what, node.id)

        store.replace_all(configs_from_yaml(tree.text()))
        check("start")
        for edit in sequence:
            tree.apply(edit)
            store.replace_all(configs_from_yaml(tree.text()))
            check(edit)
        kept.append(memo.defaults_kept + memo.groups_kept)

    run()
    assert sum(kept) > 0


def _big(services: int, routed: int, timeout: int = 1, header: str = "x-user") -> str:
    """A namespace of `services` HTTP services, the first `routed` with a VirtualService and a
    consistent-hash DestinationRule (the first of them with the given timeout and header)."""
    docs = []
    for i in range(services):
        docs.append(f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: s{i}, namespace: big}}
spec:
  hosts: [s{i}.big.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.6.{i // 250}.{i % 250 + 1}}}]
""")
    for i in range(routed):
        docs.append(f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: s{i}, namespace: big}}
spec:
  hosts: [s{i}.big.mesh]
  http: [{{timeout: {timeout if i == 0 else 1}s, route: [{{destination: {{host: s{i}.big.mesh}}}}]}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: s{i}, namespace: big}}
spec:
  host: s{i}.big.mesh
  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: {header if i == 0 else "x-user"}}}}}}}
""")
    return "---".join(docs)


def test_a_virtual_service_changed_or_a_service_added_costs_its_own_pieces() -> None:
    """In a namespace of 300 services, 30 of them routed: one VirtualService changed makes its
    own group and virtual host again, and takes over every other group and default route; so
    does one DestinationRule changed, for the group that asked for it; one service added makes
    its own default route and virtual host alone. Each as built whole."""
    store, discovery = file_discovery()
    memo = RouteMemo()
    node = parse_node_id("sidecar~10.9.0.1~client.big~big.svc.cluster.local", {})

    def build(text: str) -> None:
        store.replace_all(configs_from_yaml(text))
        snapshot = discovery.build_next()
        memo.advance()
        assert _routes(snapshot, node, memo) == _routes(discovery.build(), node, None)

    build(_big(300, 30))
    counts = (memo.groups_kept, memo.groups_made, memo.defaults_kept, memo.virtual_hosts.made)
    build(_big(300, 30, timeout=7))
    assert memo.groups_made - counts[1] == 1
    assert memo.groups_kept - counts[0] == 29
    assert memo.defaults_kept - counts[2] == 270
    assert memo.virtual_hosts.made - counts[3] == 1
    counts = (memo.groups_kept, memo.groups_made, memo.defaults_kept, memo.virtual_hosts.made)
    build(_big(300, 30, timeout=7, header="x-team"))
    assert memo.groups_made - counts[1] == 1
    assert memo.groups_kept - counts[0] == 29
    assert memo.virtual_hosts.made - counts[3] == 1
    counts = (memo.groups_kept, memo.groups_made, memo.defaults_kept, memo.virtual_hosts.made)
    build(_big(301, 30, timeout=7, header="x-team"))
    assert memo.defaults_kept - counts[2] == 270
    assert memo.virtual_hosts.made - counts[3] == 1
