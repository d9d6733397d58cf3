"""An endpoint-only change resolves a node whose binding holds by its last view with the
endpoints looked up again (`ResourceCache._endpoints_moved`): what each proxy gets is still
what a cache of its own gives it at the new snapshot, byte for byte, its own locality's variant
of an assignment included, and a node whose own workload the change touched is bound again."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import any_pb2
from test_resolve_binding import MESH as BOOKINFO
from test_resolve_binding import NEW_RATINGS as RATINGS_B

from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.server.cache import ResourceCache
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import configs_from_yaml
from meshctl.xds import types

BOOKINFO_NODES = {
    "productpage": "sidecar~10.10.0.11~productpage-v1-vm.bookinfo~bookinfo.svc.cluster.local",
    "reviews-v1": "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local",
    "ratings-b": "sidecar~10.10.0.52~ratings-v1-b.bookinfo~bookinfo.svc.cluster.local",
}

API = "api.loc.mesh"
API_CLUSTER = f"outbound|80||{API}"
#: A service in two regions, failover by locality (outlier detection on), and two clients of
#: it, one per region: each gets its own variant of the assignment.
LOCALITY = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: loc}
spec:
  hosts: [api.loc.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  workloadSelector: {labels: {app: api}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: client, namespace: loc}
spec:
  hosts: [client.loc.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: client}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: loc}
spec:
  host: api.loc.mesh
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 5}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client-east, namespace: loc}
spec: {address: 10.0.1.1, labels: {app: client}, locality: us-east/zone-a}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client-west, namespace: loc}
spec: {address: 10.0.1.2, labels: {app: client}, locality: us-west/zone-c}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: api-a, namespace: loc}
spec: {address: 10.0.0.1, labels: {app: api}, locality: us-east/zone-a}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: api-c, namespace: loc}
spec: {address: 10.0.0.3, labels: {app: api}, locality: us-west/zone-c}
"""
#: A VM of api that was never seen, in the east's second zone.
API_B = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: api-b, namespace: loc}
spec: {address: 10.0.0.2, labels: {app: api}, locality: us-east/zone-b}
"""
LOCALITY_NODES = {
    "east": "sidecar~10.0.1.1~client-east.loc~loc.svc.cluster.local",
    "west": "sidecar~10.0.1.2~client-west.loc~loc.svc.cluster.local",
}


def _snapshots(mesh: str, added: str) -> tuple[Snapshot, Snapshot]:
    """`mesh`, and it with the configs of `added` too, as the config store gives them: the
    configs already there are the very objects they were."""
    base = configs_from_yaml(mesh)
    after: list[Config] = [*base, *configs_from_yaml(added)]
    return build_snapshot(base, build_file_model(base)), build_snapshot(after, build_file_model(after))


def _bytes(view: object) -> dict[str, dict[str, bytes]]:
    return {t: {n: r.body for n, r in view.of(t).items()} for t in types.PUSH_ORDER}  # type: ignore[attr-defined]


def test_a_proxy_whose_own_workload_is_the_endpoint_added_is_bound_again() -> None:
    before, after = _snapshots(BOOKINFO, RATINGS_B)
    assert before.config_version == after.config_version
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in BOOKINFO_NODES.items()}
    first = {name: cache.resolve(node, before) for name, node in nodes.items()}
    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    # ratings-b was bound again (it is that workload now); the others took their last views.
    assert cache.bindings == len(nodes) + 1
    assert cache.endpoint_resolutions == len(nodes) - 1
    assert again["ratings-b"].proxy.workload == "bookinfo/ratings-v1-b"
    # It serves ratings now: its inbound cluster (to the app's port) is there.
    assert "inbound|8080||" not in first["ratings-b"].resources.of(types.CLUSTER)
    assert "inbound|8080||" in again["ratings-b"].resources.of(types.CLUSTER)
    for name, resolved in again.items():
        assert resolved.resources.snapshot_version == after.version
        fresh = ResourceCache().resolve(nodes[name], after)
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
    ratings = again["productpage"].resources.of(types.ENDPOINT)["outbound|9080||ratings.bookinfo.mesh"]
    assert b"10.10.0.52" in ratings.body


def _priorities(view: object) -> dict[str, int]:
    """zone -> priority of the api assignment in `view`."""
    body = view.of(types.ENDPOINT)[API_CLUSTER].body  # type: ignore[attr-defined]
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(any_pb2.Any.FromString(body).value)
    return {g.locality.zone: g.priority for g in cla.endpoints if g.lb_endpoints}


def test_an_endpoint_added_reaches_each_locality_in_its_own_variant() -> None:
    before, after = _snapshots(LOCALITY, API_B)
    assert before.config_version == after.config_version
    cache = ResourceCache()
    nodes = {name: parse_node_id(node_id) for name, node_id in LOCALITY_NODES.items()}
    first = {name: cache.resolve(node, before) for name, node in nodes.items()}
    assert "zone-b" not in _priorities(first["east"].resources)
    again = {name: cache.resolve(node, after) for name, node in nodes.items()}
    assert cache.bindings == len(nodes) and cache.endpoint_resolutions == len(nodes)
    # Each client's zone first, its region next: the new VM is second for the east, last for the west.
    assert _priorities(again["east"].resources) == {"zone-a": 0, "zone-b": 1, "zone-c": 2}
    assert _priorities(again["west"].resources) == {"zone-c": 0, "zone-a": 1, "zone-b": 1}
    for name, resolved in again.items():
        fresh = ResourceCache().resolve(nodes[name], after)
        assert _bytes(resolved.resources) == _bytes(fresh.resources), name
    # The change undone: the views of the snapshot before, the very sets the streams held.
    back = {name: cache.resolve(node, before) for name, node in nodes.items()}
    for name, resolved in back.items():
        assert resolved.resources.of(types.ENDPOINT) is first[name].resources.of(types.ENDPOINT)
