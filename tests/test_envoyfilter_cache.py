"""EnvoyFilters are an input of a proxy's generation key, like its Sidecar: a change regenerates
exactly the proxies the filter selects, the others keep the very same resource sets (so their
streams are not woken), outbound parts are not regenerated at all, proxies with equal inputs
share one patched set, and what the cache serves is what `generate` (dump, diff, simulate) makes.
"""

from __future__ import annotations

from test_cache import MESH, SECOND_V1, assert_serves_what_generate_makes, node

from meshctl.server.cache import ResourceCache
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types

REVIEWS, REVIEWS_B, DETAILS = (
    node("reviews-v1-vm", "10.10.0.41"),
    node("reviews-v1-b", "10.10.0.44"),
    node("details-v1-vm", "10.10.0.21"),
)


def _lua(selector: str = "workloadSelector: {labels: {app: reviews}}", extra_match: str = "") -> str:
    return f"""
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: reviews-lua, namespace: bookinfo}}
spec:
  {selector}
  configPatches:
  - applyTo: CLUSTER
    match:
      context: SIDECAR_OUTBOUND
      {extra_match}
      cluster: {{service: ratings.bookinfo.mesh}}
    patch: {{operation: MERGE, value: {{connect_timeout: 42s}}}}
"""


def _timeout(view: object, cluster: str = "outbound|9080||ratings.bookinfo.mesh") -> int:
    from envoy.config.cluster.v3 import cluster_pb2
    from google.protobuf import any_pb2

    body = view.of(types.CLUSTER)[cluster].body  # type: ignore[attr-defined]
    c = cluster_pb2.Cluster.FromString(any_pb2.Any.FromString(body).value)
    return int(c.connect_timeout.seconds)


def test_an_envoy_filter_change_regenerates_only_the_proxies_it_selects() -> None:
    before = snapshot_from_yaml(MESH + SECOND_V1)
    after = snapshot_from_yaml(MESH + SECOND_V1 + _lua())
    cache = ResourceCache()
    old = {n: cache.resources(before, proxy_for(before, n)) for n in (REVIEWS, REVIEWS_B, DETAILS)}
    outbound = cache.outbound_generations

    new = {n: cache.resources(after, proxy_for(after, n)) for n in (REVIEWS, REVIEWS_B, DETAILS)}

    assert cache.outbound_generations == outbound  # no outbound part reads EnvoyFilters
    for t in (types.CLUSTER, types.LISTENER, types.ROUTE):
        assert new[DETAILS].of(t) is old[DETAILS].of(t), t  # not selected: the same sets
    assert _timeout(new[REVIEWS]) == 42 and _timeout(new[DETAILS]) != 42
    # Two replicas of reviews: one patching, one set of shared bytes.
    assert new[REVIEWS].of(types.CLUSTER) is new[REVIEWS_B].of(types.CLUSTER)
    assert_serves_what_generate_makes(new[REVIEWS], after, proxy_for(after, REVIEWS), "patched")
    assert_serves_what_generate_makes(new[DETAILS], after, proxy_for(after, DETAILS), "unselected")


def test_root_namespace_filters_apply_everywhere_and_proxy_version_selects_by_envoy_version() -> None:
    root = _lua(selector="", extra_match="proxy: {proxyVersion: '^1\\.40\\.'}").replace(
        "namespace: bookinfo", "namespace: istio-system"
    )
    snapshot = snapshot_from_yaml(MESH + root)
    cache = ResourceCache()

    def bound(node_id: str, version: str) -> object:
        return cache.resources(snapshot, bind_proxy(parse_node_id(node_id, None, version), snapshot))

    assert _timeout(bound(DETAILS, "1.40.0")) == 42
    assert _timeout(bound(REVIEWS, "1.40.2")) == 42
    assert _timeout(bound(REVIEWS, "1.39.0")) != 42
