"""A sidecar's outbound listeners kept across snapshots (`xds/listener_memo.py`).

The memo reuses a key's last build where it read the same. These tests hold it to a fresh
build after random sequences of changes applied as the server applies them (the store, the
file registry, a snapshot updated from the one before), byte for byte and in what the build
asked for (its DestinationRule and short-name traces, which decide when the server keeps the
part), and count that a VirtualService change with HTTP routes alone walks no service again.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.config.mesh import MeshSettings
from meshctl.server.cache import ResourceCache
from meshctl.snapshot.binding import bind_proxy, outbound_of
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, file_discovery
from meshctl.xds import types
from meshctl.xds.generate import generate
from meshctl.xds.listener_memo import ListenerMemo
from meshctl.xds.listeners import build_outbound_listeners
from meshctl.xds.names import resource_name

NAMES = ("a", "b", "c", "d")
#: Hosts some changes add, which no tree starts with.
LATER = ("e",)
CLIENTS = ("ns1", "ns2")
NAMESPACES = (*CLIENTS, "ns3")
#: A loopback range of six addresses: hosts collide and run out, so one host added moves others.
SMALL_LOOPBACK = MeshSettings(loopback_range="127.240.0.0/29")

#: (protocol, port name) of a service port: declared, implied by the name, or sniffed.
PORTS = (("HTTP", "http"), ("TCP", "tcp"), ("TLS", "tls"), ("", "db"), ("MONGO", "mongo"), ("GRPC", "grpc"))


def _entry(name: str, ns: str, n: int) -> str:
    """A ServiceEntry whose host, ports, protocols, addresses and resolution all move with `n`:
    a host that may name another namespace (short names in ns1 then find it), a wildcard host
    resolved by DYNAMIC_DNS, one or two ports on shared numbers (listeners merge services), an
    address, a CIDR or none, endpoints from its WorkloadEntry (listeners per endpoint under
    iptables)."""
    resolution = ("STATIC", "NONE", "DNS", "NONE", "DYNAMIC_DNS")[n % 5]
    protocol, port_name = PORTS[n % len(PORTS)]
    host = f"{name}.{NAMESPACES[n % 3]}.mesh"
    address = ("", f"[240.1.0.{n}]", f"[10.40.{n}.0/24]", "")[n % 4]
    selected = resolution in ("STATIC", "NONE")
    extra = f"\n  workloadSelector: {{labels: {{app: {name}}}}}" if selected else ""
    if resolution == "DNS":
        address = address if "/" not in address else ""
    if resolution == "DYNAMIC_DNS":
        host, address = f"*.{name}.example.com", ""
        protocol, port_name = ("HTTP", "http") if n % 2 else ("TLS", "tls")
    ports = [f"{{number: {5000 + n % 3}, name: {port_name}{', protocol: ' + protocol if protocol else ''}}}"]
    if n % 4 == 1:
        ports.append("{number: 9080, name: http-alt, protocol: HTTP}")
    if n >= 8 and resolution != "DYNAMIC_DNS":
        ports = ["{number: 9080, name: http-web, protocol: HTTP}"]  # plain HTTP: the walk is patched
    export = '["."]' if n == 7 else '["*"]'
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: ["{host}"]
  location: MESH_INTERNAL
  resolution: {resolution}
  exportTo: {export}{f"{chr(10)}  addresses: {address}" if address else ""}
  ports: [{", ".join(ports)}]{extra}
"""


def _workload(name: str, ns: str, n: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}-vm, namespace: {ns}}}
spec: {{address: 10.{NAMESPACES.index(ns) + 1}.{(NAMES + LATER).index(name)}.{n}, labels: {{app: {name}}}}}
"""


def _rule(name: str, ns: str, n: int) -> str:
    """A DestinationRule whose TCP settings a tcp_proxy reads (idle timeout, source-IP hash)."""
    return f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {ns}}}
spec:
  host: {name}.{NAMESPACES[n % 3]}.mesh
  trafficPolicy:
    connectionPool: {{tcp: {{idleTimeout: {n}s}}}}
    loadBalancer: {{consistentHash: {{useSourceIp: {"true" if n % 2 else "false"}}}}}
"""


def _route(name: str, ns: str, n: int) -> str:
    """A VirtualService with HTTP routes only, TCP routes, TLS routes or all three, by short
    name or in full, to another service by short name or in full."""
    other = NAMES[((NAMES + LATER).index(name) + n) % len(NAMES)]
    host = name if n % 2 else f"{name}.{NAMESPACES[n % 3]}.mesh"
    target = other if n % 3 else f"{other}.{NAMESPACES[n % 3]}.mesh"
    parts = [f"http: [{{timeout: {n}s, route: [{{destination: {{host: {target}}}}}]}}]"]
    if n % 4 in (1, 3):
        parts.append(f"tcp: [{{match: [{{port: {5000 + n % 3}}}], route: [{{destination: {{host: {target}}}}}]}}]")
    if n % 4 in (2, 3):
        parts.append(
            f"tls: [{{match: [{{sniHosts: [{host}]}}], "
            f"route: [{{destination: {{host: {target}}}, weight: 60}}, "
            f"{{destination: {{host: {name}}}, weight: 40}}]}}]"
        )
    body = "\n  ".join(parts)
    return f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{host}]
  {body}
"""


def _sidecar(ns: str, n: int) -> str:
    """No egress (everything), its own namespace, everything, a port-specific egress listener
    before the catch-all (bound elsewhere, or without capture), a catch-all without capture,
    or an outbound policy."""
    egress = {
        1: '[{hosts: ["./*"]}]',
        2: '[{hosts: ["*/*"]}]',
        3: '[{port: {number: 5001, name: tcp, protocol: TCP}, hosts: ["*/*"]}, {hosts: ["./*", "ns3/*"]}]',
        4: '[{port: {number: 7000, name: http, protocol: HTTP}, bind: 127.0.0.9, hosts: ["*/*"]}, {hosts: ["*/*"]}]',
        5: '[{port: {number: 5000, name: tls, protocol: TLS}, captureMode: NONE, hosts: ["ns3/*"]}, {hosts: ["*/*"]}]',
        6: '[{captureMode: NONE, hosts: ["*/*"]}]',
    }.get(n)
    body = f"egress: {egress}" if egress else "outboundTrafficPolicy: {mode: REGISTRY_ONLY}"
    return f"""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  {body}
"""


class Tree:
    """The mesh as files would hold it, one document per (what, name, namespace)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str, str], str] = {}
        for ns in NAMESPACES:
            for i, name in enumerate(NAMES):
                n = i + NAMESPACES.index(ns) if name != "d" else 8 + NAMESPACES.index(ns)  # d: plain HTTP
                self.docs[("entry", name, ns)] = _entry(name, ns, n)
                self.docs[("workload", name, ns)] = _workload(name, ns, 1)
        self.docs[("route", "a", "ns1")] = _route("a", "ns1", 1)

    def apply(self, edit: tuple[str, str, str, int]) -> None:
        what, name, ns, n = edit
        key = (what, name if what != "sidecar" else "", ns)
        if n == 0:
            self.docs.pop(key, None)
        elif what == "sidecar":
            self.docs[key] = _sidecar(ns, n)
        else:
            make = {"entry": _entry, "workload": _workload, "rule": _rule, "route": _route}[what]
            self.docs[key] = make(name, ns, n)

    def text(self) -> str:
        return "---".join(self.docs[k] for k in sorted(self.docs))


edits = st.tuples(
    st.sampled_from(("entry", "entry", "workload", "route", "route", "rule", "sidecar")),
    st.sampled_from(NAMES + LATER),
    st.sampled_from(NAMESPACES),
    st.integers(min_value=0, max_value=11),
)

#: Clients without iptables (listeners bound on loopback addresses, one with a DNS table) and
#: with (listeners per endpoint for TCP services without an address), in two namespaces.
NODES: list[tuple[str, dict[str, str]]] = [
    ("sidecar~10.9.0.1~client.ns1~ns1.svc.cluster.local", {"DNS_CAPTURE": "true"}),
    ("sidecar~10.9.0.2~client.ns2~ns2.svc.cluster.local", {}),
    ("sidecar~10.9.0.9~redirected.ns1~ns1.svc.cluster.local", {"INTERCEPTION_MODE": "REDIRECT"}),
    ("sidecar~10.9.0.8~redirected.ns3~ns3.svc.cluster.local", {"INTERCEPTION_MODE": "REDIRECT"}),
]


def _listeners(snapshot: Snapshot, scope: ProxyScope, memo: ListenerMemo | None) -> list[tuple[str, bytes]]:
    return [(str(m.name), m.SerializeToString(deterministic=True)) for m in build_outbound_listeners(scope, memo)]


def _traced_scope(snapshot: Snapshot, node: object) -> ProxyScope:
    scope = ProxyScope(snapshot, outbound_of(bind_proxy(node, snapshot), snapshot))  # type: ignore[arg-type]
    scope.rule_trace = {}
    scope.name_trace = set()
    return scope


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(edits, min_size=1, max_size=12))
def test_kept_listeners_equal_fresh_ones_after_random_changes(sequence: list[tuple[str, str, str, int]]) -> None:
    """After each change, every client's outbound listeners through the memo are, byte for
    byte, a fresh build's from a whole snapshot, with the same traces; and the server, whose
    generation goes through the memo, serves what generation from scratch makes."""
    tree = Tree()
    store, discovery = file_discovery(mesh=SMALL_LOOPBACK)
    memo = ListenerMemo()
    cache = ResourceCache()
    nodes = [parse_node_id(n, metadata) for n, metadata in NODES]

    def check(step: object) -> None:
        snapshot = discovery.build_next()
        full = discovery.build()
        memo.advance()
        for node in nodes:
            kept = _traced_scope(snapshot, node)
            fresh = _traced_scope(full, node)
            assert _listeners(snapshot, kept, memo) == _listeners(full, fresh, None), (step, node.id)
            assert kept.rule_trace == fresh.rule_trace, (step, node.id)
            assert kept.name_trace == fresh.name_trace, (step, node.id)
            served = cache.resources(snapshot, bind_proxy(node, snapshot)).of(types.LISTENER)
            expected = generate(full, bind_proxy(node, full))[types.LISTENER]
            assert sorted(served) == sorted(resource_name(m) for m in expected), (step, node.id)
            for message in expected:
                body = message.SerializeToString(deterministic=True)
                assert served[resource_name(message)].body.endswith(body), (step, node.id)

    store.replace_all(configs_from_yaml(tree.text()))
    check("start")
    for edit in sequence:
        tree.apply(edit)
        store.replace_all(configs_from_yaml(tree.text()))
        check(edit)


SOLO = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: solo, namespace: ns1}
spec:
  hosts: [solo.ns1.mesh]
  location: MESH_INTERNAL
  resolution: DNS
  ports: [{number: 7070, name: http, protocol: HTTP}]
"""


def test_a_virtual_service_with_http_routes_alone_walks_no_service_again() -> None:
    """A VirtualService change with HTTP routes only reuses every client's listeners, and a
    plain HTTP service added beside others on its port patches them; a TCP route, or a TCP
    service, builds them again. Each is what a fresh build makes."""
    tree = Tree()
    tree.apply(("route", "a", "ns1", 4))  # HTTP routes alone
    tree.apply(("entry", "a", "ns1", 8))  # plain HTTP on 9080, with d.ns2's HTTP port there
    store, discovery = file_discovery(mesh=SMALL_LOOPBACK)
    memo = ListenerMemo()
    nodes = [parse_node_id(n, metadata) for n, metadata in NODES]

    def build(edit: tuple[str, str, str, int] | None) -> tuple[int, int, int]:
        if edit is not None:
            tree.apply(edit)
        store.replace_all(configs_from_yaml(tree.text()))
        snapshot = discovery.build_next()
        memo.advance()
        made, reused, patched = memo.made, memo.reused, memo.patched
        for node in nodes:
            kept = _listeners(snapshot, _traced_scope(snapshot, node), memo)
            assert kept == _listeners(snapshot, _traced_scope(snapshot, node), None)
        return memo.made - made, memo.reused - reused, memo.patched - patched

    assert build(None) == (len(NODES), 0, 0)
    assert build(("route", "a", "ns1", 8)) == (0, len(NODES), 0)  # another timeout and host
    assert build(("route", "b", "ns2", 4)) == (0, len(NODES), 0)  # a new one, HTTP routes alone
    assert build(("entry", "e", "ns1", 8)) == (0, 0, len(NODES))  # plain HTTP beside a.ns1 on 9080
    assert build(("entry", "e", "ns1", 0)) == (0, 0, len(NODES))  # and gone again
    # A plain HTTP service alone on its port: its listener comes and goes with it.
    tree.docs[("entry", "solo", "ns1")] = SOLO
    assert build(None) == (len(NODES), 0, 0)
    del tree.docs[("entry", "solo", "ns1")]
    assert build(None) == (len(NODES), 0, 0)
    made, _, _ = build(("route", "a", "ns1", 5))  # a TCP route for `a`
    assert made >= 1
    made, _, _ = build(("entry", "e", "ns1", 1))  # a TCP port
    assert made >= 1
