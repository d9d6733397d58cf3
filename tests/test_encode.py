"""Hand-assembled responses must parse as the protobuf messages Envoy expects.

Each is compared with protobuf's own serialization of the same message as well as parsed: a
singular field written twice still parses (the last one wins), so only the bytes show it.
"""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from meshctl.server import encode as encode_module
from meshctl.server.encode import BlockCache, encode_delta, encode_sotw
from meshctl.server.subscription import Push
from meshctl.xds.resources import Resource, encode_any

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


def test_delta_responses_of_one_tuple_share_its_encoding_and_differ_by_their_own_fields() -> None:
    """Streams making the same move are given one tuple; each response is still its own."""
    resources = (cluster_resource("a"), cluster_resource("b"))
    blocks = BlockCache()
    first = encode_delta(Push(CDS, "v1", "n1", resources, removed=("gone",)), blocks=blocks)
    second = encode_delta(Push(CDS, "v2", "n2", resources), blocks=blocks)
    assert first == encode_delta(Push(CDS, "v1", "n1", resources, removed=("gone",)))
    msg = discovery_pb2.DeltaDiscoveryResponse.FromString(second)
    assert (msg.system_version_info, msg.nonce, list(msg.removed_resources)) == ("v2", "n2", [])
    assert [(r.name, r.version) for r in msg.resources] == [("a", "v-a"), ("b", "v-b")]
    # A state-of-the-world block of the same tuple is another encoding, kept apart.
    sotw = discovery_pb2.DiscoveryResponse.FromString(encode_sotw(Push(CDS, "", "n3", resources), blocks=blocks))
    assert [cluster_pb2.Cluster.FromString(r.value).name for r in sotw.resources] == ["a", "b"]
    again = discovery_pb2.DeltaDiscoveryResponse.FromString(encode_delta(Push(CDS, "", "n4", resources), blocks=blocks))
    assert [r.name for r in again.resources] == ["a", "b"]


def test_empty_response() -> None:
    msg = discovery_pb2.DiscoveryResponse.FromString(encode_sotw(Push(CDS, "", "1", ())))
    assert msg.nonce == "1" and len(msg.resources) == 0


# -- against protobuf's own serialization ----------------------------------------------------------


def cluster_any(name: str, *, padding: int = 0) -> any_pb2.Any:
    """A packed Cluster; `padding` bytes of metadata make bodies long enough for multi-byte lengths."""
    cluster = cluster_pb2.Cluster(name=name, connect_timeout={"seconds": 10})
    if padding:
        cluster.alt_stat_name = "x" * padding
    packed = any_pb2.Any()
    packed.Pack(cluster, deterministic=True)
    return packed


def resource_of(packed: any_pb2.Any, name: str, version: str = "") -> Resource:
    """The way the cache makes a Resource: the Any bytes from `encode_any`, not from protobuf."""
    return Resource(name, version or "v-" + name, encode_any(packed.type_url, packed.value))


# Lengths around each varint boundary (1, 2, 3 and 4 bytes) and non-ASCII names, where a length
# counted in characters instead of bytes would show.
PADDINGS = (0, 100, 127, 128, 16_383, 16_384, 2_097_152)
NAMES = ("outbound|9080||reviews.bookinfo.mesh", "café.mesh", "日本.mesh")


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
def test_encode_any_parses_as_protobufs_any(size: int) -> None:
    value = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = encode_any(CDS, value)
    assert any_pb2.Any.FromString(data) == any_pb2.Any(type_url=CDS, value=value)
    if value:
        # protobuf writes fields in number order, as we do; only an empty value differs in bytes
        # (protobuf leaves it out, we write it with length 0, and both parse to the same Any).
        assert data == any_pb2.Any(type_url=CDS, value=value).SerializeToString()


def test_sotw_response_is_protobufs_own_serialization() -> None:
    packed = [cluster_any(f"{n}-{p}", padding=p) for n in NAMES for p in PADDINGS]
    resources = tuple(resource_of(a, str(i)) for i, a in enumerate(packed))
    control_plane = base_pb2.ControlPlane(identifier="meshctl-ñ")
    data = encode_sotw(Push(CDS, "v1-ü", "nonce-7", resources), control_plane.SerializeToString())
    expected = discovery_pb2.DiscoveryResponse(
        version_info="v1-ü", resources=packed, type_url=CDS, nonce="nonce-7", control_plane=control_plane
    )
    assert discovery_pb2.DiscoveryResponse.FromString(data) == expected
    assert data == expected.SerializeToString()


def test_sotw_response_without_optional_fields_is_protobufs_own_serialization() -> None:
    packed = cluster_any("a")
    data = encode_sotw(Push(CDS, "", "1", (resource_of(packed, "a"),)))
    expected = discovery_pb2.DiscoveryResponse(resources=[packed], type_url=CDS, nonce="1")
    assert data == expected.SerializeToString()
    assert not discovery_pb2.DiscoveryResponse.FromString(data).HasField("control_plane")


def test_delta_response_is_protobufs_own_serialization() -> None:
    packed = [(f"{n}-{p}", cluster_any(f"{n}-{p}", padding=p)) for n in NAMES for p in PADDINGS]
    resources = tuple(resource_of(a, name, "ver-" + name) for name, a in packed)
    control_plane = base_pb2.ControlPlane(identifier="meshctl-1")
    push = Push(CDS, "sys-é", "n-3", resources, removed=("gone.mesh", "ñ.mesh"))
    data = encode_delta(push, control_plane.SerializeToString())
    expected = discovery_pb2.DeltaDiscoveryResponse(
        system_version_info="sys-é",
        resources=[discovery_pb2.Resource(version="ver-" + name, resource=a, name=name) for name, a in packed],
        type_url=CDS,
        nonce="n-3",
        removed_resources=["gone.mesh", "ñ.mesh"],
        control_plane=control_plane,
    )
    assert discovery_pb2.DeltaDiscoveryResponse.FromString(data) == expected
    assert data == expected.SerializeToString()


def test_delta_response_with_only_removals_is_protobufs_own_serialization() -> None:
    data = encode_delta(Push(CDS, "", "n-4", (), removed=("a", "b")))
    expected = discovery_pb2.DeltaDiscoveryResponse(type_url=CDS, nonce="n-4", removed_resources=["a", "b"])
    assert data == expected.SerializeToString()


# -- the shared block --------------------------------------------------------------------------------


def many(count: int, prefix: str = "svc") -> tuple[Resource, ...]:
    return tuple(cluster_resource(f"{prefix}-{i}.mesh") for i in range(count))


def test_a_resource_set_is_encoded_once_and_its_bytes_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = many(50)
    calls: list[tuple[Resource, ...]] = []
    real = encode_module._resources

    def counting(resources: tuple[Resource, ...]) -> bytes:
        calls.append(resources)
        return real(resources)

    monkeypatch.setattr(encode_module, "_resources", counting)
    blocks = BlockCache()
    # The same set to many streams, each with its own nonce: what an endpoint change does.
    responses = [encode_sotw(Push(CDS, "v1", str(n), resources), blocks=blocks) for n in range(20)]
    assert calls == [resources]
    assert blocks.get(resources) is blocks.get(resources)
    for n, data in enumerate(responses):
        assert data == encode_sotw(Push(CDS, "v1", str(n), resources))
        assert discovery_pb2.DiscoveryResponse.FromString(data).nonce == str(n)


def test_blocks_are_found_by_identity_not_equality() -> None:
    blocks = BlockCache()
    resources = many(3)
    equal_copy = tuple(r for r in resources)
    assert equal_copy == resources and equal_copy is not resources
    first = blocks.get(resources)
    other = blocks.get(equal_copy)
    assert other == first and other is not first
    assert blocks.get(resources) is first


def test_the_cache_keeps_the_most_recently_encoded_sets() -> None:
    blocks = BlockCache(size=2)
    a, b, c = many(2, "a"), many(2, "b"), many(2, "c")
    block_a, block_b = blocks.get(a), blocks.get(b)
    block_c = blocks.get(c)  # one more than the cache holds: the oldest, a, goes
    assert blocks.get(b) is block_b and blocks.get(c) is block_c
    again = blocks.get(a)
    assert again == block_a and again is not block_a


def test_a_dead_sets_block_is_never_served_for_a_new_set() -> None:
    # Short-lived tuples of one size are where CPython reuses an id: each must get its own bytes.
    blocks = BlockCache(size=1)
    for i in range(200):
        resources = many(2, f"round-{i}")
        msg = discovery_pb2.DiscoveryResponse.FromString(encode_sotw(Push(CDS, "v", "n", resources), blocks=blocks))
        assert [cluster_pb2.Cluster.FromString(a.value).name for a in msg.resources] == [r.name for r in resources]


def test_an_empty_set_through_the_cache() -> None:
    blocks = BlockCache()
    data = encode_sotw(Push(CDS, "v0", "1", ()), blocks=blocks)
    assert data == discovery_pb2.DiscoveryResponse(version_info="v0", type_url=CDS, nonce="1").SerializeToString()
