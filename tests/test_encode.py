"""Hand-assembled responses must parse as the protobuf messages Envoy expects."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from meshctl.server.encode import encode_delta, encode_sotw
from meshctl.server.subscription import Push, Resource

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


def cluster_resource(name: str) -> Resource:
    any_msg = any_pb2.Any()
    any_msg.Pack(cluster_pb2.Cluster(name=name, connect_timeout={"seconds": 10}))
    return Resource(name, "v-" + name, any_msg.SerializeToString())


def test_sotw_response_round_trips() -> None:
    resources = tuple(cluster_resource(f"outbound|9080||svc-{i}.mesh") for i in range(200))
    control_plane = base_pb2.ControlPlane(identifier="meshctl-1").SerializeToString()
    data = encode_sotw(Push(CDS, "abc123", "7", resources), control_plane)
    msg = discovery_pb2.DiscoveryResponse.FromString(data)
    assert (msg.version_info, msg.type_url, msg.nonce) == ("abc123", CDS, "7")
    assert msg.control_plane.identifier == "meshctl-1"
    clusters = [cluster_pb2.Cluster.FromString(a.value) for a in msg.resources]
    assert [c.name for c in clusters] == [r.name for r in resources]
    assert all(a.type_url == CDS for a in msg.resources)


def test_delta_response_round_trips() -> None:
    resources = (cluster_resource("a"), cluster_resource("b"))
    data = encode_delta(Push(CDS, "sys", "n1", resources, removed=("gone", "ghost")))
    msg = discovery_pb2.DeltaDiscoveryResponse.FromString(data)
    assert (msg.system_version_info, msg.nonce, msg.type_url) == ("sys", "n1", CDS)
    assert [(r.name, r.version) for r in msg.resources] == [("a", "v-a"), ("b", "v-b")]
    assert cluster_pb2.Cluster.FromString(msg.resources[0].resource.value).name == "a"
    assert list(msg.removed_resources) == ["gone", "ghost"]


def test_empty_response() -> None:
    msg = discovery_pb2.DiscoveryResponse.FromString(encode_sotw(Push(CDS, "", "1", ())))
    assert msg.nonce == "1" and len(msg.resources) == 0
