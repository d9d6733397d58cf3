"""An endpoint change binds again only the proxies whose own workload it touched: every other
node resolves to the proxy it was, at the new snapshot, and gets what binding it afresh gives."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.server.cache import ResourceCache
from meshctl.server.proxy_resources import Resolved
from meshctl.snapshot.binding import bind_proxy, rebound
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.node import ProxyNode, parse_node_id
from meshctl.snapshot.proxy import Proxy
from meshctl.testing.builders import configs_from_yaml
from meshctl.xds import types

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"
MESH = "\n---\n".join(p.read_text() for p in sorted(EXAMPLES.rglob("*.yaml")))
NEW_RATINGS = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ratings-v1-b, namespace: bookinfo}
spec:
  address: 10.10.0.52
  serviceAccount: bookinfo-ratings
  labels: {app: ratings, version: v1}
"""
REVIEWS_V1_RELABELLED = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v1-vm, namespace: bookinfo}
spec:
  address: 10.10.0.41
  labels: {app: reviews, version: v1, track: canary}
  serviceAccount: bookinfo-reviews
  locality: eu-west/zone-a
"""
NODES = {
    "productpage": "sidecar~10.10.0.11~productpage-v1-vm.bookinfo~bookinfo.svc.cluster.local",
    "reviews-v1": "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local",
    "reviews-v2": "sidecar~10.10.0.42~reviews-v2-vm.bookinfo~bookinfo.svc.cluster.local",
    # No workload at its address until NEW_RATINGS adds one.
    "ratings-b": "sidecar~10.10.0.52~ratings-v1-b.bookinfo~bookinfo.svc.cluster.local",
}


def _snapshot(configs: list[Config]) -> Snapshot:
    return build_snapshot(configs, build_file_model(configs))


def _mesh(change: str = "") -> tuple[list[Config], Snapshot, Snapshot]:
    """The example mesh, and it with `change` applied as the config store applies one: the
    configs it leaves alone are the very objects they were (one with the same key replaced)."""
    base = configs_from_yaml(MESH)
    added = configs_from_yaml(change) if change else []
    keys = {c.key for c in added}
    after = [c for c in base if c.key not in keys] + added
    return base, _snapshot(base), _snapshot(after)


def _bytes(view: object) -> dict[str, dict[str, bytes]]:
    return {t: {n: r.body for n, r in view.of(t).items()} for t in types.PUSH_ORDER}  # type: ignore[attr-defined]


def test_an_endpoint_change_binds_no_proxy_whose_workload_it_leaves_alone() -> None:
    _, before, after = _mesh(NEW_RATINGS)
    assert before.config_version == after.config_version and before.version != after.version
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    first = {name: cache.resolve(node, before) for name, node in nodes.items()}
    assert cache.bindings == len(nodes)
    assert first["ratings-b"].proxy.workload == ""  # nothing at its address yet

    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    # Only the node at the new workload's address was bound again: it is that workload now.
    assert cache.bindings == len(nodes) + 1
    assert again["ratings-b"].proxy.workload == "bookinfo/ratings-v1-b"
    for name, resolved in again.items():
        assert resolved.resources.snapshot_version == after.version
        # What each is sent is what binding it afresh in a cache of its own gives, byte for byte.
        fresh = ResourceCache().resolve(nodes[name], after)
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
        assert resolved.proxy.generation_key() == fresh.proxy.generation_key(), name
    # The other proxies see the new endpoint of ratings.
    ratings = again["productpage"].resources.of(types.ENDPOINT)["outbound|9080||ratings.bookinfo.mesh"]
    assert b"10.10.0.52" in ratings.body


def test_an_endpoint_change_to_a_proxys_own_workload_binds_it_again() -> None:
    _, before, after = _mesh(REVIEWS_V1_RELABELLED)
    assert before.config_version == after.config_version  # workload labels are endpoints' business
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    for node in nodes.values():
        cache.resolve(node, before)
    bound = cache.bindings
    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    assert cache.bindings == bound + 1  # reviews-v1 alone
    assert again["reviews-v1"].proxy.labels.get("track") == "canary"
    assert again["reviews-v2"].proxy.labels.get("track") is None
    fresh = ResourceCache().resolve(nodes["reviews-v1"], after)
    assert _bytes(again["reviews-v1"].resources) == _bytes(fresh.resources)
    assert again["reviews-v1"].proxy.generation_key() == fresh.proxy.generation_key()


REVIEWS_ROUTE = """
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  http:
  - route:
    - destination: {host: reviews.bookinfo.mesh, subset: v2}
      weight: 70
    - destination: {host: reviews.bookinfo.mesh, subset: v3}
      weight: 30
"""
MTLS_STRICT = """
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: bookinfo}
spec:
  mtls: {mode: STRICT}
"""
# A route only proxies labelled app=productpage take: productpage's outbound config parts ways
# with the other proxies' (its labels are tested by a selector now).
REVIEWS_FROM_PRODUCTPAGE = """
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  http:
  - match:
    - sourceLabels: {app: productpage}
    route:
    - destination: {host: reviews.bookinfo.mesh, subset: v3}
  - route:
    - destination: {host: reviews.bookinfo.mesh, subset: v1}
"""


def _resolve_across(change: str) -> tuple[ResourceCache, dict[str, Resolved], Snapshot, dict[str, ProxyNode]]:
    _, before, after = _mesh(change)
    assert before.config_version != after.config_version
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    for node in nodes.values():
        cache.resolve(node, before)
    assert cache.bindings == len(nodes)
    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    return cache, again, after, nodes


def test_a_virtualservice_change_binds_no_proxy_and_each_gets_what_a_fresh_binding_gives() -> None:
    cache, again, after, nodes = _resolve_across(REVIEWS_ROUTE)
    assert cache.bindings == len(nodes)  # none bound again
    for name, resolved in again.items():
        fresh = ResourceCache().resolve(nodes[name], after)
        assert resolved.resources.config_version == after.config_version
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
        assert resolved.proxy.outbound == fresh.proxy.outbound, name
    # The new weights reached the proxies that call reviews.
    routes = b"".join(r.body for r in again["productpage"].resources.of(types.ROUTE).values())
    assert b"v3" in routes


def test_a_virtualservice_change_makes_no_inbound_view_and_joins_no_config_again() -> None:
    """Inbound views read no VirtualService (`INBOUND_KINDS`): each key's view and part, and its
    joined config where the outbound part is the same, are kept across the change."""
    _, before, after = _mesh(REVIEWS_ROUTE)
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    first = {name: cache.resolve(node, before) for name, node in nodes.items()}
    views = cache.inbound_views
    assert views == len({r.proxy.generation_key() for r in first.values()})
    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    assert cache.inbound_views == views
    for name, resolved in again.items():
        fresh = ResourceCache().resolve(nodes[name], after)
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
    # A change of a kind inbound views read makes them again.
    _, _, relabelled = _mesh(REVIEWS_ROUTE + "---\n" + MTLS_STRICT)
    for node in nodes.values():
        cache.resolve(node, relabelled)
    assert cache.inbound_views == 2 * views


def test_a_virtualservice_change_that_adds_a_label_selector_binds_every_proxy_again() -> None:
    cache, again, after, nodes = _resolve_across(REVIEWS_FROM_PRODUCTPAGE)
    assert cache.bindings == 2 * len(nodes)
    for name, resolved in again.items():
        fresh = ResourceCache().resolve(nodes[name], after)
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
        assert resolved.proxy.outbound == fresh.proxy.outbound, name
    outbound = again["productpage"].proxy.outbound
    assert outbound is not None and ("app", "productpage") in outbound.label_pairs


def test_a_proxy_carried_to_a_snapshot_keeps_every_field_but_the_snapshot_it_is_bound_in() -> None:
    _, before, after = _mesh(REVIEWS_ROUTE)
    proxy = bind_proxy(parse_node_id(NODES["reviews-v1"]), before)
    carried = rebound(proxy, after)
    for f in fields(Proxy):
        expected = after.version if f.name == "snapshot_version" else getattr(proxy, f.name)
        assert getattr(carried, f.name) == expected, f.name


#: One change of each kind binding or inbound config reads, and of some they do not, applied
#: one after another to the example mesh.
CHANGES = {
    "VirtualService": REVIEWS_ROUTE,
    "Telemetry": """
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: reviews-logs, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  accessLogging: [{providers: [{name: envoy}]}]
""",
    "EnvoyFilter": """
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: reviews-timeout, namespace: bookinfo}
spec:
  workloadSelector: {labels: {app: reviews}}
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: MERGE, value: {connect_timeout: 7s}}
""",
    "WasmPlugin": """
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: auth, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: productpage}}
  url: file:///opt/plugins/auth.wasm
""",
    "AuthorizationPolicy": """
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-admin, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  action: DENY
  rules: [{to: [{operation: {paths: [/admin]}}]}]
""",
    "PeerAuthentication": MTLS_STRICT,
    "VirtualService with a selector": REVIEWS_FROM_PRODUCTPAGE,
    "Sidecar": """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: bookinfo}
spec:
  egress: [{hosts: ["./*"]}]
""",
    "DestinationRule": """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: bookinfo}
spec:
  host: ratings.bookinfo.mesh
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}
  subsets: [{name: v1, labels: {version: v1}}]
""",
    "WorkloadEntry": NEW_RATINGS,
    "ServiceEntry elsewhere": """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: shop}
spec:
  hosts: [billing.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.40.0.1}]
""",
    # The reviews workloads' own service: they are bound again (their instances changed).
    "ServiceEntry of their own": """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP, targetPort: 8081}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
""",
    "Telemetry again": """
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: reviews-logs, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  accessLogging: [{disabled: true}]
""",
}


def test_after_each_change_of_a_sequence_every_proxy_gets_what_a_fresh_binding_gives() -> None:
    """Bindings and inbound parts kept across changes that leave what they read (one cache
    through the whole sequence) serve, after every change, what a fresh cache serves."""
    configs = {c.key: c for c in configs_from_yaml(MESH)}
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    # Traffic redirected to it: it has inbound listeners (policies, mutual TLS, access logs).
    nodes["reviews-v2"] = parse_node_id(NODES["reviews-v2"], {"INTERCEPTION_MODE": "REDIRECT"})
    bindings = []
    inbound: dict[str, dict[str, bytes]] = {}
    for what, change in [("start", ""), *CHANGES.items()]:
        configs |= {c.key: c for c in (configs_from_yaml(change) if change else [])}
        snapshot = _snapshot(list(configs.values()))
        before = cache.bindings
        for name, node in nodes.items():
            served = cache.resolve(node, snapshot)
            fresh = ResourceCache().resolve(node, snapshot)
            assert _bytes(served.resources) == _bytes(fresh.resources), (what, name)
            assert served.proxy.generation_key() == fresh.proxy.generation_key(), (what, name)
        bindings.append((what, cache.bindings - before))
        inbound[what] = _bytes(cache.resolve(nodes["reviews-v2"], snapshot).resources)[types.LISTENER]
    kept = {what for what, bound in bindings if bound == 0}
    assert {"VirtualService", "AuthorizationPolicy", "PeerAuthentication", "DestinationRule"} <= kept
    assert "ServiceEntry elsewhere" in kept
    assert dict(bindings)["ServiceEntry of their own"] == 2  # reviews-v1 and reviews-v2 alone
    # The policy changes reached the redirected proxy's inbound listeners (the test is not blind).
    assert inbound["AuthorizationPolicy"] != inbound["WasmPlugin"]
    assert inbound["PeerAuthentication"] != inbound["AuthorizationPolicy"]


def test_a_change_undone_and_another_made_binds_no_proxy_again() -> None:
    """The snapshot a change undone goes back to is the latest again: the next change keeps
    the bindings made or kept there, instead of forgetting them with the version before it."""
    base = configs_from_yaml(MESH)
    keyed = {c.key: c for c in base}
    first = _snapshot(base)
    routed = _snapshot(list((keyed | {c.key: c for c in configs_from_yaml(REVIEWS_ROUTE)}).values()))
    other = REVIEWS_ROUTE.replace("weight: 70", "weight: 60").replace("weight: 30", "weight: 40")
    rerouted = _snapshot(list((keyed | {c.key: c for c in configs_from_yaml(other)}).values()))
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    for snapshot in (first, routed, first, rerouted):
        for name, node in nodes.items():
            served = cache.resolve(node, snapshot)
            assert _bytes(served.resources) == _bytes(ResourceCache().resolve(node, snapshot).resources), name
    assert cache.bindings == len(nodes)


def test_a_service_elsewhere_after_changes_that_kept_inbound_parts_makes_none() -> None:
    """Inbound parts kept across VirtualService changes are still the parts of their views
    when a change of the services makes the views again: none is generated again."""
    keyed = {c.key: c for c in configs_from_yaml(MESH)}
    weights = [("weight: 70", "weight: 60"), ("weight: 70", "weight: 50"), ("weight: 70", "weight: 40")]
    routes = [REVIEWS_ROUTE.replace(*w) for w in weights]
    service = CHANGES["ServiceEntry elsewhere"]
    steps = [keyed, *({**keyed, **{c.key: c for c in configs_from_yaml(r)}} for r in routes)]
    steps.append({**steps[-1], **{c.key: c for c in configs_from_yaml(service)}})
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in NODES.items()}
    nodes["reviews-v2"] = parse_node_id(NODES["reviews-v2"], {"INTERCEPTION_MODE": "REDIRECT"})
    made = []
    for configs in steps:
        snapshot = _snapshot(list(configs.values()))
        for name, node in nodes.items():
            served = cache.resolve(node, snapshot)
            assert _bytes(served.resources) == _bytes(ResourceCache().resolve(node, snapshot).resources), name
        made.append(cache.inbound_parts_made)
    assert made[0] > 0
    assert made[-1] == made[0], made
