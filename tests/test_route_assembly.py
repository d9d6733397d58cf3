"""Route configurations assembled from virtual hosts serialized once (`meshctl.xds.route_assembly`):
the bytes the server sends must be the very bytes of the whole message serialized
deterministically (so every replica gives Envoy the same versions), and a VirtualService change
must serialize only the virtual hosts it changed, across every namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.config.mesh import mesh_settings
from meshctl.snapshot.binding import outbound_of
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import GenerationMemos, generate_config, generate_outbound_listeners_and_routes
from meshctl.xds.resources import Serialized, decode_resource, to_resource
from meshctl.xds.route_context import service_on_port
from meshctl.xds.route_memo import RouteMemo
from meshctl.xds.routes import build_route_resources, build_routes

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "routes"
BOOKINFO = ROOT / "examples" / "configs" / "bookinfo"
CLIENT = "sidecar~10.0.0.99~client.bookinfo~bookinfo.svc.cluster.local"
INGRESS = "router~10.0.0.50~ingress.istio-system~istio-system.svc.cluster.local"
INGRESS_LABELS = {"LABELS": {"istio": "ingressgateway"}}


def service(name: str, ns: str, port: int = 8080, *, extra: str = "") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{name}.{ns}.svc.cluster.local]
  addresses: [10.1.{len(name)}.{sum(map(ord, name)) % 250}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}, {{number: 9090, name: grpc, protocol: GRPC}}]
  endpoints: [{{address: 10.2.0.{len(name)}}}]
{extra}"""


def route(name: str, ns: str, host: str, timeout: str = "5s") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{host}]
  http:
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]
    timeout: {timeout}
    route: [{{destination: {{host: {host}, subset: v2}}}}]
  - route:
    - {{destination: {{host: {host}}}, weight: 90}}
    - {{destination: {{host: {host}, port: {{number: 9090}}}}, weight: 10}}
"""


def mesh(timeout: str = "5s", hash_header: str = "x-user") -> str:
    """Three namespaces calling each other's kube-style services (so each namespace sees its own
    short names), with VirtualServices, a consistent hash, an IPv6 address, a DYNAMIC_DNS host
    and a VirtualService host outside the registry."""
    parts = []
    for ns in ("alpha", "beta", "gamma"):
        for i in range(6):
            parts.append(service(f"svc{i}", ns))
        parts.append(route("front", ns, f"svc0.{ns}.svc.cluster.local", timeout))
        parts.append(route("short", ns, "svc1"))
    parts.append("""---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: sticky, namespace: beta}
spec:
  host: svc2.beta.svc.cluster.local
  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: HASH_HEADER}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: v6, namespace: gamma}
spec:
  hosts: [v6.example.com]
  addresses: ["2001:db8::7"]
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: "2001:db8::8"}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: dynamic, namespace: gamma}
spec:
  hosts: ["*.dyn.example"]
  location: MESH_EXTERNAL
  resolution: DYNAMIC_DNS
  ports: [{number: 8080, name: http, protocol: HTTP}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: outside, namespace: alpha}
spec:
  hosts: [legacy.example.net]
  http:
  - route: [{destination: {host: svc3.alpha.svc.cluster.local}}]
""")
    return "".join(parts).replace("HASH_HEADER", hash_header)


def cases() -> Iterator[tuple[str, Snapshot, list[str]]]:
    """(name, snapshot, node ids) over the route goldens, the bookinfo example and `mesh()`."""
    for path in sorted(GOLDEN.glob("*.in.yaml")):
        yield path.name, snapshot_from_yaml(path.read_text()), [CLIENT, INGRESS]
    bookinfo = "\n---\n".join(p.read_text() for p in sorted(BOOKINFO.glob("*.yaml")))
    nodes = [
        f"sidecar~10.10.0.{ip}~{name}.bookinfo~bookinfo.svc.cluster.local"
        for ip, name in ((11, "productpage-v1-vm"), (21, "details-v1-vm"), (31, "reviews-v1-vm"))
    ]
    yield "bookinfo", snapshot_from_yaml(bookinfo), [*nodes, CLIENT, INGRESS]
    nodes = [f"sidecar~10.0.0.9~client.{ns}~{ns}.svc.cluster.local" for ns in ("alpha", "beta", "gamma")]
    yield "mesh", snapshot_from_yaml(mesh()), nodes
    settings, _ = mesh_settings({"outboundTrafficPolicy": {"mode": "ALLOW_ANY_DYNAMIC_DNS"}})
    yield "mesh, ALLOW_ANY_DYNAMIC_DNS", snapshot_from_yaml(mesh(), mesh=settings), nodes


CASES = list(cases())


@pytest.mark.parametrize(("name", "snapshot", "nodes"), CASES, ids=[c[0] for c in CASES])
def test_assembled_bytes_are_the_whole_message_serialized_deterministically(
    name: str, snapshot: Snapshot, nodes: list[str]
) -> None:
    memo = RouteMemo()  # one memo for every proxy of the mesh: virtual hosts shared among them
    for node in nodes:
        router = node.startswith("router")
        proxy = proxy_for(snapshot, node, INGRESS_LABELS if router else None)
        whole = build_routes(ProxyScope(snapshot, proxy))
        for _ in range(2):  # made, then reused from the memo
            assembled = build_route_resources(ProxyScope(snapshot, proxy), memo)
            assert [m.name for m in assembled] == [m.name for m in whole]
            for message, expected in zip(assembled, whole, strict=True):
                # A sidecar's are assembled; a router's are messages (`route_gateway`).
                assert isinstance(message, Serialized) is not router
                if isinstance(message, Serialized):
                    assert message.value == expected.SerializeToString(deterministic=True)
                resource = to_resource(message, types.ROUTE)
                assert resource == to_resource(expected, types.ROUTE)
                assert decode_resource(resource, types.ROUTE) == expected


def outbound_routes(snapshot: Snapshot, memos: GenerationMemos, node: str) -> list[tuple[str, bytes]]:
    proxy = outbound_of(proxy_for(snapshot, node), snapshot)
    generated = generate_outbound_listeners_and_routes(snapshot, proxy, memos)
    return [(r.name, r.body) for r in (to_resource(m, types.ROUTE) for m in generated[types.ROUTE])]


def test_a_virtual_service_change_serializes_only_the_virtual_hosts_it_changed() -> None:
    """Every namespace's route configuration holds the VirtualService's host; after the edit,
    each namespace's configuration is what generation from scratch gives, and the virtual hosts
    serialized are the edited one's alone (per namespace: its short names are the namespace's own)."""
    nodes = [f"sidecar~10.0.0.9~client.{ns}~{ns}.svc.cluster.local" for ns in ("alpha", "beta", "gamma")]
    memos = GenerationMemos()
    vhosts = memos.routes.virtual_hosts
    before = snapshot_from_yaml(mesh("5s"))
    for node in nodes:
        outbound_routes(before, memos, node)
    first = vhosts.made
    assert first > 3 * 18  # every service's, on two ports, in three namespaces
    memos.advance()
    after = snapshot_from_yaml(mesh("7s"))  # each namespace's `front` VirtualService edited
    for node in nodes:
        served = outbound_routes(after, memos, node)
        scratch = generate_config(after, proxy_for(after, node))[types.ROUTE]
        assert served == [(r.name, r.body) for r in (to_resource(m, types.ROUTE) for m in scratch)]
    # The three edited VirtualServices' hosts, on the two ports each serves, seen from the
    # three namespaces (each sees its own `svc0` by its short names too): nothing else.
    assert vhosts.made - first == 3 * 2 * 3


def test_which_rule_applies_is_carried_past_a_change_of_other_kinds_only() -> None:
    """A VirtualService change regenerates every namespace's routes, each asking which
    DestinationRule applies to each of its hosts: the answers of the snapshot before stand while
    the rules and the services are the same objects, and a rule change asks again."""
    host = "svc2.beta.svc.cluster.local"
    proxy = proxy_for(first := snapshot_from_yaml(mesh()), "sidecar~10.0.0.9~client.alpha~alpha.svc.cluster.local")
    key = (proxy.namespace, outbound_of(proxy, first).label_pairs)

    def answers(snapshot: Snapshot) -> dict[str, object]:
        found: dict[str, object] = snapshot.index.scoped("destination_rules", key, dict)
        return found

    def rule_header(snapshot: Snapshot) -> str:
        rule = ProxyScope(snapshot, proxy_for(snapshot, proxy.id)).destination_rule(host)
        assert rule is not None
        return str(rule.spec.traffic_policy.load_balancer.consistent_hash.http_header_name)

    assert rule_header(first) == "x-user"
    assert host in answers(first)

    def next_snapshot(before: Snapshot, text: str, kind: str) -> Snapshot:
        configs = configs_from_yaml(text)
        changed = {c.key for c in configs if c.kind == kind}
        return build_snapshot(configs, before.services, previous=before, changed=changed)

    routes_changed = next_snapshot(first, mesh("7s"), "VirtualService")
    assert answers(routes_changed) is answers(first)
    assert rule_header(routes_changed) == "x-user"
    rule_changed = next_snapshot(routes_changed, mesh("7s", "x-team"), "DestinationRule")
    assert host not in answers(rule_changed)
    assert rule_header(rule_changed) == "x-team"


def test_a_service_reduced_to_a_port_is_the_same_object_in_every_scope_and_snapshot() -> None:
    """What the route memo's traces compare on every check: equal answers that are the very same
    objects, so a check costs an identity test rather than a copy and a field-by-field compare."""
    host = "svc3.beta.svc.cluster.local"
    first = snapshot_from_yaml(mesh())
    later = build_snapshot(configs_from_yaml(mesh("7s")), first.services, previous=first)
    answers = [
        service_on_port(ProxyScope(snapshot, proxy_for(snapshot, node)), 8080)(host)
        for snapshot in (first, later)
        for node in ("sidecar~10.0.0.9~client.alpha~alpha.svc.cluster.local", CLIENT)
    ]
    assert answers[0] is not None and [p.number for p in answers[0].ports] == [8080]
    assert all(a is answers[0] for a in answers)
    assert service_on_port(ProxyScope(first, proxy_for(first, CLIENT)), 9090)(host) is not answers[0]
