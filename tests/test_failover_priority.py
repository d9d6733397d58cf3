"""failoverPriority and traffic distribution, as Istio's pilot assigns priorities.

The first tests are the cases of Istio's `loadbalancer_test.go` (TestApplyLocalitySetting's
"FailoverPriority" and "FailoverPriority with Failover", TestGetLocalityLbSetting), run against
`apply_locality` and `locality_setting` with Istio's endpoints and labels. The rest take a mesh
from YAML: what each proxy is sent, and which proxies share one serialized assignment.
"""

from __future__ import annotations

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.registry.model import TrafficDistribution
from meshctl.server.cache import ResourceCache
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.cluster_policy import forces_failover, locality_setting
from meshctl.xds.generate import generate
from meshctl.xds.locality import apply_locality, locality_proto, proxy_priority_values, topology_value
from meshctl.xds.names import resource_name

NETWORK, CLUSTER = "topology.istio.io/network", "topology.istio.io/cluster"
REGION, ZONE, SUBZONE = "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"
PROXY_LOCALITY = "region1/zone1/subzone1"

Labels = dict[str, str]
Groups = list[tuple[str, list[tuple[str, Labels]]]]

#: buildWrappedLocalityLbEndpoints: three localities of two endpoints each.
ISTIO_ENDPOINTS: Groups = [
    (
        "region1/zone1/subzone1",
        [
            ("1.1.1.1", {NETWORK: "n1", CLUSTER: "c1"}),
            ("2.2.2.2", {"key": "value", NETWORK: "n2", CLUSTER: "c2"}),
        ],
    ),
    (
        "region2/zone2/subzone2",
        [
            ("3.3.3.3", {"key": "value", NETWORK: "n1", CLUSTER: "c3"}),
            ("4.4.4.4", {"key": "value", NETWORK: "n2", CLUSTER: "c4"}),
        ],
    ),
    (
        "region3/zone3/subzone3",
        [
            ("1.2.3.4", {"key": "value", NETWORK: "n1", CLUSTER: "c1"}),
            ("2.3.4.5", {"key": "value", NETWORK: "n2", CLUSTER: "c2"}),
        ],
    ),
]

#: buildWrappedLocalityLbEndpointsForFailoverPriorityWithFailover: six localities of one each.
ISTIO_ENDPOINTS_WITH_FAILOVER: Groups = [
    ("region1/zone1/subzone1", [("1.1.1.1", {NETWORK: "n1", CLUSTER: "c1"})]),
    ("region1/zone2/subzone2", [("2.2.2.2", {"key": "value", NETWORK: "n2", CLUSTER: "c2"})]),
    ("region2/zone2/subzone2", [("3.3.3.3", {"key": "value", NETWORK: "n1", CLUSTER: "c3"})]),
    ("region3/zone3/subzone3", [("4.4.4.4", {"key": "value", NETWORK: "n2", CLUSTER: "c4"})]),
    ("region2/zone2/subzone2", [("5.5.5.5", {NETWORK: "n2", CLUSTER: "c2"})]),
    ("region3/zone3/subzone3", [("6.6.6.6", {"key": "value", NETWORK: "n1", CLUSTER: "c6"})]),
]


def rewrite(
    groups: Groups, setting: dr_pb2.LocalityLoadBalancerSetting, proxy_labels: Labels
) -> list[tuple[list[str], int, int]]:
    """Each locality group after the rewrite as (addresses, priority, weight)."""
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name="outbound|8080||test.example.org")
    for locality, members in groups:
        group = assignment.endpoints.add(locality=locality_proto(locality))
        for address, _ in members:
            endpoint = group.lb_endpoints.add()
            endpoint.endpoint.address.socket_address.address = address
            endpoint.endpoint.address.socket_address.port_value = 10001
            endpoint.load_balancing_weight.value = 1
        group.load_balancing_weight.value = len(members)
    keys = [entry.split("=")[0] for entry in setting.failover_priority]
    values = [[tuple(labels.get(k, "") for k in keys) for _, labels in members] for _, members in groups]
    proxy = proxy_priority_values(setting.failover_priority, proxy_labels, "", "")
    apply_locality(assignment, PROXY_LOCALITY, setting, True, endpoint_values=values, proxy_values=proxy)
    return [
        ([e.endpoint.address.socket_address.address for e in g.lb_endpoints], g.priority, g.load_balancing_weight.value)
        for g in assignment.endpoints
    ]


def setting_of(priority: list[str], failover: bool = False) -> dr_pb2.LocalityLoadBalancerSetting:
    setting = dr_pb2.LocalityLoadBalancerSetting(failover_priority=priority)
    if failover:
        setting.failover.add(to="region2").__setattr__("from", "region1")  # `from` is a keyword
    return setting


@pytest.mark.parametrize(
    ("name", "priority", "proxy_labels", "expected"),
    [
        (
            "match none label",
            [NETWORK, CLUSTER],
            {NETWORK: "test", CLUSTER: "test"},
            [(["1.1.1.1", "2.2.2.2"], 0, 2), (["3.3.3.3", "4.4.4.4"], 0, 2), (["1.2.3.4", "2.3.4.5"], 0, 2)],
        ),
        (
            "match network label",
            [NETWORK, CLUSTER],
            {NETWORK: "n1", CLUSTER: "test"},
            [
                (["1.1.1.1"], 0, 1),
                (["2.2.2.2"], 1, 1),
                (["3.3.3.3"], 0, 1),
                (["4.4.4.4"], 1, 1),
                (["1.2.3.4"], 0, 1),
                (["2.3.4.5"], 1, 1),
            ],
        ),
        (
            "not match the first n label",
            [NETWORK, CLUSTER],
            {NETWORK: "test", CLUSTER: "c1"},
            [(["1.1.1.1", "2.2.2.2"], 0, 2), (["3.3.3.3", "4.4.4.4"], 0, 2), (["1.2.3.4", "2.3.4.5"], 0, 2)],
        ),
        (
            "match all labels",
            ["key", NETWORK, CLUSTER],
            {"key": "value", NETWORK: "n2", CLUSTER: "c2"},
            [
                (["2.2.2.2"], 0, 1),  # matches [key, network, cluster]
                (["1.1.1.1"], 3, 1),  # matches no label
                (["4.4.4.4"], 1, 1),  # matches [key, network]
                (["3.3.3.3"], 2, 1),  # matches [key]
                (["2.3.4.5"], 0, 1),
                (["1.2.3.4"], 2, 1),
            ],
        ),
        (
            "priority assignment as per the overridden value",
            [f"{NETWORK}=n1"],
            {NETWORK: "n2", CLUSTER: "test"},
            [
                (["1.1.1.1"], 0, 1),
                (["2.2.2.2"], 1, 1),
                (["3.3.3.3"], 0, 1),
                (["4.4.4.4"], 1, 1),
                (["1.2.3.4"], 0, 1),
                (["2.3.4.5"], 1, 1),
            ],
        ),
        (
            "no endpoints with overridden value",
            [f"{NETWORK}=n3"],
            {NETWORK: "n1", CLUSTER: "test"},
            [(["1.1.1.1", "2.2.2.2"], 0, 2), (["3.3.3.3", "4.4.4.4"], 0, 2), (["1.2.3.4", "2.3.4.5"], 0, 2)],
        ),
    ],
)
def test_istio_failover_priority_cases(
    name: str, priority: list[str], proxy_labels: Labels, expected: list[tuple[list[str], int, int]]
) -> None:
    assert rewrite(ISTIO_ENDPOINTS, setting_of(priority), proxy_labels) == expected, name


def test_istio_failover_priority_with_failover() -> None:
    """Labels first, then, within each label priority, the proxy's locality and the failover
    region: `priority * 5 + locality priority`, renumbered."""
    got = rewrite(
        ISTIO_ENDPOINTS_WITH_FAILOVER, setting_of([NETWORK, CLUSTER], failover=True), {NETWORK: "n2", CLUSTER: "c2"}
    )
    assert [(addresses[0], priority) for addresses, priority, _ in got] == [
        ("1.1.1.1", 3),  # no label matches, but the proxy's own locality
        ("2.2.2.2", 0),  # every label matches, and the same region
        ("3.3.3.3", 4),  # no label, another region, but the one region1 fails over to
        ("4.4.4.4", 2),  # the first label matches, not the second
        ("5.5.5.5", 1),  # every label matches, in the failover region
        ("6.6.6.6", 5),  # nothing matches
    ]


def test_without_failover_enabled_failover_priority_does_nothing() -> None:
    """Istio's enableFailover: without outlier detection (or a traffic distribution) Envoy
    would never leave priority 0, so priorities are not set."""
    assignment = endpoint_pb2.ClusterLoadAssignment()
    assignment.endpoints.add(locality=locality_proto("region1/zone1")).lb_endpoints.add()
    apply_locality(assignment, PROXY_LOCALITY, setting_of([NETWORK]), False, endpoint_values=[[("n9",)]])
    assert [g.priority for g in assignment.endpoints] == [0]


def enabled(value: bool | None = None, **fields: object) -> dr_pb2.LocalityLoadBalancerSetting:
    setting = dr_pb2.LocalityLoadBalancerSetting(**fields)  # type: ignore[arg-type]
    if value is not None:
        setting.enabled.value = value
    return setting


def lb_with(setting: dr_pb2.LocalityLoadBalancerSetting | None) -> dr_pb2.LoadBalancerSettings | None:
    return None if setting is None else dr_pb2.LoadBalancerSettings(locality_lb_setting=setting)


FAILOVER = [dr_pb2.LocalityLoadBalancerSetting.Failover(to="region2")]
ANY, SAME_ZONE_TD = TrafficDistribution.ANY, TrafficDistribution.PREFER_SAME_ZONE
SAME_ZONE = [NETWORK, REGION, ZONE]


@pytest.mark.parametrize(
    ("name", "mesh", "rule", "distribution", "expected"),
    [
        ("mesh only", enabled(), None, TrafficDistribution.ANY, enabled()),
        ("dr only override", enabled(), enabled(True), TrafficDistribution.ANY, enabled(True)),
        ("dr and mesh", enabled(), enabled(failover=FAILOVER), TrafficDistribution.ANY, enabled(failover=FAILOVER)),
        (
            "all",
            enabled(),
            enabled(failover=FAILOVER),
            TrafficDistribution.PREFER_SAME_ZONE,
            enabled(failover=FAILOVER),
        ),
        (
            "prefer close service and mesh",
            enabled(),
            None,
            TrafficDistribution.PREFER_SAME_ZONE,
            enabled(True, failover_priority=SAME_ZONE),
        ),
        (
            "prefer same node service and mesh",
            enabled(),
            None,
            TrafficDistribution.PREFER_SAME_NODE,
            enabled(True, failover_priority=[*SAME_ZONE, SUBZONE, "kubernetes.io/hostname"]),
        ),
        ("mesh disabled", enabled(False), None, TrafficDistribution.ANY, None),
        ("dr disabled", enabled(True), enabled(False), TrafficDistribution.ANY, None),
        ("dr enabled override mesh disabled", enabled(False), enabled(True), TrafficDistribution.ANY, enabled(True)),
    ],
)
def test_istio_get_locality_lb_setting_cases(
    name: str,
    mesh: dr_pb2.LocalityLoadBalancerSetting,
    rule: dr_pb2.LocalityLoadBalancerSetting | None,
    distribution: TrafficDistribution,
    expected: dr_pb2.LocalityLoadBalancerSetting | None,
) -> None:
    """TestGetLocalityLbSetting; the rule's setting wins, then the service's distribution,
    which alone forces failover (GetLocalityLbSetting's second answer)."""
    assert locality_setting(lb_with(rule), mesh, distribution) == expected, name
    assert forces_failover(lb_with(rule), distribution) == (
        rule is None and distribution is not TrafficDistribution.ANY
    )


def test_topology_labels_are_augmented_as_istio_does() -> None:
    """AugmentLabels: the locality's parts override the labels; the network label wins over
    the workload's network."""
    labels = {REGION: "label-region", NETWORK: "label-net", "rack": "r1"}
    assert topology_value(labels, "us-east/zone-a", "vm-net", REGION) == "us-east"
    assert topology_value(labels, "us-east/zone-a", "vm-net", ZONE) == "zone-a"
    assert topology_value(labels, "us-east/zone-a", "vm-net", SUBZONE) == ""
    assert topology_value(labels, "", "vm-net", REGION) == "label-region"
    assert topology_value(labels, "", "vm-net", NETWORK) == "label-net"
    assert topology_value({}, "", "vm-net", NETWORK) == "vm-net"
    assert topology_value(labels, "", "", "rack") == "r1"


# A mesh from YAML: the api service's endpoints in two zones and racks; clients in each.

HOST = "api.lb.mesh"
CLUSTER_NAME = f"outbound|80||{HOST}"


def node(name: str, ip: str) -> str:
    return f"sidecar~{ip}~{name}.lb~lb.svc.cluster.local"


A1 = node("client-a1", "10.1.0.1")  # zone-a, rack r1
A2 = node("client-a2", "10.1.0.2")  # zone-a, rack r1, another subzone
A3 = node("client-a3", "10.1.0.3")  # zone-a, rack r2
B1 = node("client-b1", "10.1.0.4")  # zone-b, rack r1
ADHOC = node("adhoc", "10.1.0.9")  # no workload, no locality


def lb_mesh(policy: str, annotations: str = "") -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: lb{annotations}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  endpoints:
  - {{address: 10.0.0.1, locality: us-east/zone-a, labels: {{rack: r1}}}}
  - {{address: 10.0.0.2, locality: us-east/zone-a, labels: {{rack: r2}}}}
  - {{address: 10.0.0.3, locality: us-east/zone-b, labels: {{rack: r1}}}}
  - {{address: 10.0.0.4, locality: us-west/zone-c, network: far, labels: {{rack: r1}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: client, namespace: lb}}
spec:
  hosts: [client.lb.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9000, name: http, protocol: HTTP}}]
  endpoints:
  - {{address: 10.1.0.1, locality: us-east/zone-a/s1, labels: {{app: client, rack: r1}}}}
  - {{address: 10.1.0.2, locality: us-east/zone-a/s2, labels: {{app: client, rack: r1}}}}
  - {{address: 10.1.0.3, locality: us-east/zone-a/s1, labels: {{app: client, rack: r2}}}}
  - {{address: 10.1.0.4, locality: us-east/zone-b, labels: {{app: client, rack: r1}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: api, namespace: lb}}
spec:
  host: {HOST}
  trafficPolicy:
{policy}
"""


OUTLIER = "    outlierDetection: {consecutive5xxErrors: 3}\n"


def priority_rule(*keys: str, outlier: bool = True) -> str:
    listed = ", ".join(keys)
    return f"    loadBalancer: {{localityLbSetting: {{failoverPriority: [{listed}]}}}}\n" + (OUTLIER if outlier else "")


PREFER_CLOSE = ", annotations: {networking.istio.io/traffic-distribution: PreferClose}"


def sent(text: str, *nodes: str) -> list[dict[str, int]]:
    """For each node: endpoint address -> priority in the api assignment the server sends it,
    checked against what `generate` (dump) makes."""
    snapshot = snapshot_from_yaml(text)
    cache = ResourceCache()
    out = []
    for node_id in nodes:
        proxy = proxy_for(snapshot, node_id)
        (made,) = [a for a in generate(snapshot, proxy)[types.ENDPOINT] if resource_name(a) == CLUSTER_NAME]
        body = cache.resources(snapshot, proxy).of(types.ENDPOINT)[CLUSTER_NAME].body
        assert body.endswith(made.SerializeToString(deterministic=True))
        out.append(
            {e.endpoint.address.socket_address.address: g.priority for g in made.endpoints for e in g.lb_endpoints}
        )
    return out


def test_failover_priority_orders_endpoints_by_the_proxys_labels() -> None:
    a1, a3, b1 = sent(lb_mesh(priority_rule(ZONE, "rack")), A1, A3, B1)
    assert a1 == {"10.0.0.1": 0, "10.0.0.2": 1, "10.0.0.3": 2, "10.0.0.4": 2}
    assert a3 == {"10.0.0.2": 0, "10.0.0.1": 1, "10.0.0.3": 2, "10.0.0.4": 2}
    assert b1 == {"10.0.0.3": 0, "10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.4": 1}


def test_failover_priority_needs_outlier_detection() -> None:
    (a1,) = sent(lb_mesh(priority_rule(ZONE, "rack", outlier=False)), A1)
    assert set(a1.values()) == {0}


def test_network_is_the_workloads_when_no_label_says() -> None:
    """The endpoint in network `far` is last for a proxy of the default network; a proxy whose
    own label puts it in `far` prefers it."""
    (a1,) = sent(lb_mesh(priority_rule(NETWORK)), A1)
    assert a1 == {"10.0.0.1": 0, "10.0.0.2": 0, "10.0.0.3": 0, "10.0.0.4": 1}
    (pinned,) = sent(lb_mesh(priority_rule(f"{NETWORK}=far")), A1)
    assert pinned == {"10.0.0.4": 0, "10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}


def test_a_proxy_without_locality_still_gets_label_priorities() -> None:
    (adhoc,) = sent(lb_mesh(priority_rule("rack")), ADHOC)  # no rack label: endpoints without one first
    assert set(adhoc.values()) == {0}
    snapshot = snapshot_from_yaml(lb_mesh(priority_rule("rack")))
    proxy = proxy_for(snapshot, ADHOC, {"LABELS": {"rack": "r2"}})
    (made,) = [a for a in generate(snapshot, proxy)[types.ENDPOINT] if resource_name(a) == CLUSTER_NAME]
    assert {e.endpoint.address.socket_address.address: g.priority for g in made.endpoints for e in g.lb_endpoints} == {
        "10.0.0.2": 0,
        "10.0.0.1": 1,
        "10.0.0.3": 1,
        "10.0.0.4": 1,
    }


def test_prefer_close_prefers_network_region_zone_without_outlier_detection() -> None:
    """A ServiceEntry's traffic distribution: no DestinationRule locality setting, no outlier
    detection, and still the proxy's zone first, its region next (subzones are alike)."""
    a1, a2, b1 = sent(lb_mesh("    connectionPool: {tcp: {maxConnections: 10}}\n", PREFER_CLOSE), A1, A2, B1)
    assert a1 == a2 == {"10.0.0.1": 0, "10.0.0.2": 0, "10.0.0.3": 1, "10.0.0.4": 2}
    assert b1 == {"10.0.0.3": 0, "10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.4": 2}


def test_a_destination_rules_locality_setting_wins_over_the_traffic_distribution() -> None:
    (a1,) = sent(lb_mesh(priority_rule("rack"), PREFER_CLOSE), A1)
    assert a1 == {"10.0.0.1": 0, "10.0.0.3": 0, "10.0.0.4": 0, "10.0.0.2": 1}


def test_traffic_distribution_cluster_balances_by_locality() -> None:
    """Istio sets localityWeightedLbConfig on the cluster when failover is forced."""
    snapshot = snapshot_from_yaml(lb_mesh("    connectionPool: {tcp: {maxConnections: 10}}\n", PREFER_CLOSE))
    (cluster,) = [c for c in generate(snapshot, proxy_for(snapshot, A1))[types.CLUSTER] if c.name == CLUSTER_NAME]
    assert cluster.common_lb_config.HasField("locality_weighted_lb_config")


def test_proxies_that_the_rule_reads_alike_share_one_serialized_assignment() -> None:
    """failoverPriority alone reads the proxy's values of its keys and nothing else: A1 and A2
    (same zone and rack, other subzones and addresses) share one build and one resource, A3
    (another rack) gets its own. With `failover` regions too the locality is read, so A2 is a
    build of its own (its bytes, equal to A1's, are still one interned resource)."""

    def builds(text: str) -> list[int]:
        cache = ResourceCache()
        snapshot = snapshot_from_yaml(text)
        counts, seen = [], []
        for n in (A1, A2, A3):
            seen.append(cache.resources(snapshot, proxy_for(snapshot, n)).of(types.ENDPOINT)[CLUSTER_NAME])
            counts.append(cache.eds_builds)
        assert seen[0] is seen[1] and seen[0].body != seen[2].body
        return [b - a for a, b in zip([0, *counts], counts, strict=False)][1:]

    assert builds(lb_mesh(priority_rule(ZONE, "rack"))) == [0, 1]
    with_regions = priority_rule("rack").replace("]}}", "], failover: [{from: us-east, to: us-west}]}}")
    assert builds(lb_mesh(with_regions)) == [1, 1]


def traffic_distribution_findings(value: str, resolution: str = "STATIC") -> list[str]:
    from meshctl.config.loader import load_text

    text = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: api
  namespace: lb
  annotations: {{networking.istio.io/traffic-distribution: {value}}}
spec:
  hosts: [api.lb.mesh]
  location: MESH_INTERNAL
  resolution: {resolution}
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  endpoints: [{{address: {"10.0.0.1" if resolution == "STATIC" else "api.example.com"}}}]
"""
    return [f"{f.severity.value} {f.message}" for f in load_text(text, "se.yaml").findings]


def test_validate_warns_about_a_traffic_distribution_that_does_nothing() -> None:
    """Istio reads an unknown value as Any (and logs it); on a DNS entry it orders nothing."""
    assert traffic_distribution_findings("preferclose") == []
    assert traffic_distribution_findings("PreferSameNode") == []
    (unknown,) = traffic_distribution_findings("PreferNearby")
    assert unknown.startswith("warning ") and '"PreferNearby"' in unknown and "served as Any" in unknown
    (dns,) = traffic_distribution_findings("PreferClose", "DNS")
    assert dns.startswith("warning ") and "resolution DNS it changes nothing" in dns
    assert traffic_distribution_findings("Any", "DNS") == []
