"""Generated config is shared: replicas of one service get one generation, and an endpoint
change rebuilds only the endpoints of the service that changed."""

from __future__ import annotations

from pathlib import Path

from meshctl.server.cache import ResourceCache
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types

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
  labels: {app: ratings, version: v1}
"""


def node(name: str, ip: str) -> str:
    return f"sidecar~{ip}~{name}.bookinfo~bookinfo.svc.cluster.local"


def test_replicas_of_a_service_share_one_generation_and_the_same_bytes() -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1)
    cache = ResourceCache()
    a = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41")))
    b = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-b", "10.10.0.44")))
    assert cache.generations == 1
    for type_url in types.PUSH_ORDER:
        assert a.of(type_url) == b.of(type_url)
    other = cache.resources(snapshot, proxy_for(snapshot, node("reviews-v2-vm", "10.10.0.42")))
    assert cache.generations == 2  # other labels (version v2): its own generation
    assert other.of(types.ENDPOINT) == a.of(types.ENDPOINT)  # the same endpoints, the same bytes


def test_with_iptables_a_proxys_own_address_is_part_of_its_config() -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1)
    cache = ResourceCache()
    meta = {"INTERCEPTION_MODE": "REDIRECT"}
    cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-vm", "10.10.0.41"), meta))
    cache.resources(snapshot, proxy_for(snapshot, node("reviews-v1-b", "10.10.0.44"), meta))
    assert cache.generations == 2


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
