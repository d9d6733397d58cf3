"""Push decisions of one stream, driven without gRPC: order, proactive EDS, two-phase removal."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from meshctl.errors import SubscriptionLimitError
from meshctl.server.connection import Connection
from meshctl.server.proxy_resources import ProxyResources
from meshctl.server.subscription import Push, RequestKind
from meshctl.xds import types
from meshctl.xds.resources import Resource, ResourceSet

CDS, EDS, LDS, RDS = types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE


def res(name: str, version: str = "1") -> Resource:
    return Resource(name, version, f"{name}@{version}".encode())


def resources(version: str, **by_type: list[Resource]) -> ProxyResources:
    keys = {"cds": CDS, "eds": EDS, "lds": LDS, "rds": RDS}
    return ProxyResources(
        version,
        version,
        MappingProxyType({keys[k]: MappingProxyType({r.name: r for r in v}) for k, v in by_type.items()}),
    )


def request(
    type_url: str, names: list[str] | None = None, push: Push | None = None, error: str = ""
) -> discovery_pb2.DiscoveryRequest:
    req = discovery_pb2.DiscoveryRequest(
        type_url=type_url,
        resource_names=names or [],
        version_info=push.version if push and not error else "",
        response_nonce=push.nonce if push else "",
    )
    if error:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def ack_all(conn: Connection, pushes: list[Push], names: dict[str, list[str]]) -> None:
    for p in pushes:
        conn.handle(p.type_url, request(p.type_url, names.get(p.type_url), p))


def subscribed(conn: Connection, eds: list[str], rds: list[str]) -> None:
    conn.handle(CDS, request(CDS))
    conn.handle(EDS, request(EDS, eds))
    conn.handle(LDS, request(LDS))
    conn.handle(RDS, request(RDS, rds))


def test_pushes_follow_make_before_break_order() -> None:
    conn = Connection("c1", delta=False)
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")]))
    # Envoy asks in whatever order; we answer in CDS, EDS, LDS, RDS order.
    conn.handle(RDS, request(RDS, ["r"]))
    conn.handle(LDS, request(LDS))
    conn.handle(EDS, request(EDS, ["a"]))
    conn.handle(CDS, request(CDS))
    assert [p.type_url for p in conn.pushes()] == [CDS, EDS, LDS, RDS]
    assert conn.pushes() == []


def test_a_snapshot_that_moves_none_of_the_sets_held_moves_nothing() -> None:
    """A change outside the proxy's scope: the cache offers the very sets the stream holds, under
    the new snapshot's version. The stream reports it as nothing to push (the servicer does not
    wake it), yet shows the new snapshot; one set replaced, even by an equal one, is news."""
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], ["r"])
    first = resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")])
    assert conn.update(first)
    ack_all(conn, conn.pushes(), {EDS: ["a"], RDS: ["r"]})
    same = ProxyResources("v2", "v2", MappingProxyType(dict(first.by_type)))
    assert not conn.update(same)
    assert conn.resources is same and conn.pushes() == []
    moved = ProxyResources("v3", "v3", MappingProxyType({**first.by_type, EDS: MappingProxyType({"a": res("a", "2")})}))
    assert conn.update(moved)
    assert [p.type_url for p in conn.pushes()] == [EDS]
    fewer = ProxyResources("v4", "v4", MappingProxyType({t: m for t, m in moved.by_type.items() if t != RDS}))
    assert conn.update(fewer)


def test_endpoint_only_change_pushes_eds_alone() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], ["r"])
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")]))
    ack_all(conn, conn.pushes(), {EDS: ["a"], RDS: ["r"]})
    conn.update(resources("v2", cds=[res("a")], eds=[res("a", "2")], lds=[res("l")], rds=[res("r")]))
    assert [p.type_url for p in conn.pushes()] == [EDS]


def test_changed_cluster_gets_its_endpoints_again_even_if_they_did_not_change() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], ["r"])
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")]))
    ack_all(conn, conn.pushes(), {EDS: ["a"], RDS: ["r"]})
    conn.update(resources("v2", cds=[res("a", "new-timeout")], eds=[res("a")], lds=[res("l")], rds=[res("r")]))
    pushes = conn.pushes()
    assert [p.type_url for p in pushes] == [CDS, EDS]
    assert [r.name for r in pushes[1].resources] == ["a"]


def test_removed_cluster_stays_until_routes_without_it_are_acked() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b"], ["r"])
    conn.update(resources("v1", cds=[res("a"), res("b")], eds=[res("a"), res("b")], lds=[res("l")], rds=[res("r")]))
    ack_all(conn, conn.pushes(), {EDS: ["a", "b"], RDS: ["r"]})

    # The route stops using b and b disappears: CDS still carries b until the new routes are ACKed.
    conn.update(resources("v2", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r", "2")]))
    pushes = conn.pushes()
    assert [p.type_url for p in pushes] == [RDS]
    assert conn.retained_clusters == {"b"}
    rds_push = pushes[0]
    conn.handle(RDS, request(RDS, ["r"], rds_push))
    assert conn.retained_clusters == frozenset()
    follow_up = conn.pushes()
    # EDS says only that its set is now the one without b: the node holds a already.
    assert [(p.type_url, [r.name for r in p.resources]) for p in follow_up] == [(CDS, ["a"]), (EDS, [])]


def test_removed_cluster_is_kept_while_routes_are_rejected() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b"], ["r"])
    conn.update(resources("v1", cds=[res("a"), res("b")], eds=[res("a"), res("b")], lds=[res("l")], rds=[res("r")]))
    ack_all(conn, conn.pushes(), {EDS: ["a", "b"], RDS: ["r"]})
    conn.update(resources("v2", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r", "bad")]))
    (rds_push,) = conn.pushes()
    conn.handle(RDS, request(RDS, ["r"], rds_push, error="route rejected"))
    assert conn.retained_clusters == {"b"}
    assert conn.pushes() == []  # not the same rejected config again
    assert conn.status()[3].nack == "route rejected"


def test_delta_stream_resends_changed_cluster_endpoints() -> None:
    conn = Connection("d1", delta=True)
    conn.handle(CDS, discovery_pb2.DeltaDiscoveryRequest(type_url=CDS))
    conn.handle(EDS, discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["a"]))
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")]))
    first = conn.pushes()
    for p in first:
        conn.handle(p.type_url, discovery_pb2.DeltaDiscoveryRequest(type_url=p.type_url, response_nonce=p.nonce))
    conn.update(resources("v2", cds=[res("a", "2")], eds=[res("a")]))
    pushes = conn.pushes()
    assert [(p.type_url, [r.name for r in p.resources]) for p in pushes] == [(CDS, ["a"]), (EDS, ["a"])]


def test_routes_wait_until_the_node_asks_for_a_new_clusters_endpoints() -> None:
    """A new EDS cluster stays warming in Envoy until its endpoints arrive, and Envoy asks for
    them only after applying CDS: a route naming it before then would answer 503."""
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], ["r"])
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")]))
    initial = conn.pushes()
    ack_all(conn, initial, {EDS: ["a"], RDS: ["r"]})
    conn.update(
        resources("v2", cds=[res("a"), res("b")], eds=[res("a"), res("b")], lds=[res("l")], rds=[res("r", "2")])
    )
    first = conn.pushes()
    assert [p.type_url for p in first] == [CDS]
    conn.handle(CDS, request(CDS, None, first[0]))
    assert conn.pushes() == []  # still waiting for the node to watch b's endpoints
    last_eds = next(p for p in initial if p.type_url == EDS)
    conn.handle(EDS, request(EDS, ["a", "b"], last_eds))
    assert [p.type_url for p in conn.pushes()] == [EDS, RDS]


def _sets(version: str, **by_type: list[Resource]) -> ProxyResources:
    """As `resources`, with each type's resources one `ResourceSet`, as the cache hands out."""
    keys = {"cds": CDS, "eds": EDS, "lds": LDS, "rds": RDS}
    return ProxyResources(version, version, MappingProxyType({keys[k]: ResourceSet(v) for k, v in by_type.items()}))


def test_delta_routes_wait_until_the_node_watches_every_clusters_endpoints() -> None:
    conn = Connection("d1", delta=True)
    for type_url, names in ((CDS, []), (EDS, ["a"]), (LDS, []), (RDS, ["r"])):
        conn.handle(type_url, discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=names))

    def acked(pushes: list[Push]) -> list[str]:
        for p in pushes:
            conn.handle(p.type_url, discovery_pb2.DeltaDiscoveryRequest(type_url=p.type_url, response_nonce=p.nonce))
        return [types.SHORT_NAMES[p.type_url] for p in pushes]

    clusters, listeners = [res("a")], [res("l")]
    conn.update(_sets("v1", cds=clusters, eds=[res("a")], lds=listeners, rds=[res("r")]))
    assert acked(conn.pushes()) == ["CDS", "EDS", "LDS", "RDS"]
    # A new cluster, and routes naming it: they wait until the node watches its endpoints.
    clusters = [res("a"), res("b")]
    conn.update(_sets("v2", cds=clusters, eds=[res("a"), res("b")], lds=listeners, rds=[res("r", "2")]))
    assert acked(conn.pushes()) == ["CDS"]
    assert conn.pushes() == []
    conn.handle(EDS, discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["b"]))
    assert acked(conn.pushes()) == ["EDS", "RDS"]
    # The node stops watching b's endpoints while it still holds b (the very sets it was
    # offered before, as after a routes-only change): routes wait again.
    conn.handle(EDS, discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, resource_names_unsubscribe=["b"]))
    held = conn.resources
    assert held is not None
    routes = MappingProxyType({**held.by_type, RDS: ResourceSet([res("r", "3")])})
    conn.update(ProxyResources("v3", "v3", routes))
    assert conn.pushes() == []
    conn.handle(EDS, discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["b"]))
    assert acked(conn.pushes()) == ["EDS", "RDS"]


def test_a_delta_reconnect_holding_every_version_is_in_sync_without_a_push() -> None:
    conn = Connection("d1", delta=True)
    conn.update(resources("v1", cds=[res("a")]))
    conn.handle(CDS, discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, initial_resource_versions={"a": "1"}))
    assert conn.pushes() == []
    (status,) = conn.status()
    assert status.sent_version and status.sent_version == status.acked_version


def names_sent(pushes: list[Push]) -> list[tuple[str, list[str]]]:
    return [(types.SHORT_NAMES[p.type_url], [r.name for r in p.resources]) for p in pushes]


def test_sotw_endpoint_change_sends_the_changed_assignment_alone() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b", "c"], ["r"])
    clusters, rest = [res("a"), res("b"), res("c")], {"lds": [res("l")], "rds": [res("r")]}
    conn.update(resources("v1", cds=clusters, eds=[res("a"), res("b"), res("c")], **rest))
    first = conn.pushes()
    assert names_sent(first)[:2] == [("CDS", ["a", "b", "c"]), ("EDS", ["a", "b", "c"])]
    ack_all(conn, first, {EDS: ["a", "b", "c"], RDS: ["r"]})
    conn.update(resources("v2", cds=clusters, eds=[res("a"), res("b", "2"), res("c")], **rest))
    (push,) = conn.pushes()
    assert names_sent([push]) == [("EDS", ["b"])]
    ack_all(conn, [push], {EDS: ["a", "b", "c"]})
    assert {s.type_url: s.sent_version == s.acked_version for s in conn.status()} == dict.fromkeys(
        (CDS, EDS, LDS, RDS), True
    )


def test_sotw_cds_and_lds_stay_complete_while_eds_and_rds_carry_changes() -> None:
    """Envoy removes any cluster or listener a CDS or LDS response leaves out, and keeps any
    assignment or route config an EDS or RDS response leaves out."""
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b"], ["r1", "r2"])
    eds = [res("a"), res("b")]
    conn.update(
        resources("v1", cds=[res("a"), res("b")], eds=eds, lds=[res("l1"), res("l2")], rds=[res("r1"), res("r2")])
    )
    ack_all(conn, conn.pushes(), {EDS: ["a", "b"], RDS: ["r1", "r2"]})
    conn.update(
        resources(
            "v2",
            cds=[res("a", "2"), res("b")],
            eds=eds,
            lds=[res("l1"), res("l2", "2")],
            rds=[res("r1"), res("r2", "2")],
        )
    )
    pushes = conn.pushes()
    # The changed cluster's endpoints come again (it is warming until they do), and only its.
    assert names_sent(pushes) == [("CDS", ["a", "b"]), ("EDS", ["a"]), ("LDS", ["l1", "l2"]), ("RDS", ["r2"])]


def test_sotw_eds_nack_loses_nothing() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b", "c"], [])
    clusters = [res("a"), res("b"), res("c")]
    conn.update(resources("v1", cds=clusters, eds=[res("a"), res("b"), res("c")]))
    ack_all(conn, conn.pushes(), {EDS: ["a", "b", "c"]})
    conn.update(resources("v2", cds=clusters, eds=[res("a", "bad"), res("b"), res("c")]))
    (bad,) = conn.pushes()
    assert names_sent([bad]) == [("EDS", ["a"])]
    conn.handle(EDS, request(EDS, ["a", "b", "c"], bad, error="bad assignment"))
    assert conn.pushes() == []
    conn.update(resources("v3", cds=clusters, eds=[res("a", "bad"), res("b"), res("c", "2")]))
    (after,) = conn.pushes()
    assert names_sent([after]) == [("EDS", ["a", "c"])]


def test_sotw_new_cluster_gets_its_assignment_alone_when_the_node_asks() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], [])
    conn.update(resources("v1", cds=[res("a")], eds=[res("a")]))
    initial = conn.pushes()
    ack_all(conn, initial, {EDS: ["a"]})
    conn.update(resources("v2", cds=[res("a"), res("b")], eds=[res("a"), res("b")]))
    (cds,) = conn.pushes()
    conn.handle(CDS, request(CDS, None, cds))
    last_eds = next(p for p in initial if p.type_url == EDS)
    conn.handle(EDS, request(EDS, ["a", "b"], last_eds))
    assert names_sent(conn.pushes()) == [("EDS", ["b"])]


def test_a_new_sotw_stream_starts_from_the_whole_set() -> None:
    state = resources("v2", cds=[res("a"), res("b")], eds=[res("a", "2"), res("b")])
    conn = Connection("c2", delta=False)
    conn.handle(CDS, request(CDS))
    conn.handle(EDS, request(EDS, ["a", "b"]))
    conn.update(state)
    assert names_sent(conn.pushes()) == [("CDS", ["a", "b"]), ("EDS", ["a", "b"])]


# -- what one stream can make the server hold -----------------------------------------------------


def test_the_name_limit_reaches_every_subscription_and_a_refused_one_is_not_kept() -> None:
    for delta in (False, True):
        conn = Connection("c1", delta=delta, max_names=2)
        conn.handle(CDS, delta_or_sotw(delta, CDS, []))
        with pytest.raises(SubscriptionLimitError, match="the 2 one stream"):
            conn.handle(EDS, delta_or_sotw(delta, EDS, ["a", "b", "c"]))
        assert set(conn.subscriptions) == {CDS}
        conn.handle(EDS, delta_or_sotw(delta, EDS, ["a", "b"]))
        with pytest.raises(SubscriptionLimitError):
            conn.handle(EDS, delta_or_sotw(delta, EDS, ["a", "b", "c"]))
        assert set(conn.subscriptions) == {CDS, EDS} and conn.subscriptions[EDS].names == {"a", "b"}


def delta_or_sotw(delta: bool, type_url: str, names: list[str]) -> Any:
    if delta:
        return discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=names)
    return request(type_url, names)


def test_only_the_types_served_get_a_subscription() -> None:
    conn = Connection("c1", delta=False)
    with pytest.raises(ValueError, match="not a type this server serves"):
        conn.handle("type.googleapis.com/made.Up", request("type.googleapis.com/made.Up"))
    assert conn.subscriptions == {}


def test_a_repeated_nack_is_passed_on_and_counted_once() -> None:
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a"], [])
    conn.update(resources("v1", cds=[res("a", "bad")], eds=[res("a")]))
    cds = next(p for p in conn.pushes() if p.type_url == CDS)
    first = conn.handle(CDS, request(CDS, None, cds, error="bad cluster"))
    again = conn.handle(CDS, request(CDS, None, cds, error="bad cluster"))
    assert not first.repeated and again.repeated and again.kind is RequestKind.NACK
    assert conn.nacks == 1


def test_a_node_that_never_acks_keeps_a_bounded_record_of_what_it_was_sent() -> None:
    conn = Connection("c1", delta=False)
    conn.handle(CDS, request(CDS))
    for i in range(200):
        conn.update(resources(f"v{i}", cds=[res("a", str(i))]))
        (last,) = conn.pushes()
    assert len(conn._sent_generation[CDS]) <= 64
    # The newest are the ones kept: an ACK of the latest still moves the acknowledged generation.
    conn.handle(CDS, request(CDS, None, last))
    assert conn._acked_generation[CDS] == 200


def test_retained_clusters_are_bounded_when_routes_are_never_acked() -> None:
    conn = Connection("c1", delta=False, max_names=3)
    subscribed(conn, [], ["r"])
    for i in range(10):
        conn.update(resources(f"v{i}", cds=[res(f"c{i}")], lds=[res("l")], rds=[res("r", str(i))]))
        conn.pushes()
    assert conn.retained_clusters == {"c6", "c7", "c8"}  # the newest removed


def test_changed_clusters_are_forgotten_once_gone_without_eds() -> None:
    conn = Connection("c1", delta=False)
    conn.handle(CDS, request(CDS))
    for i in range(50):
        conn.update(resources(f"v{i}a", cds=[res(f"c{i}"), res("keep")]))
        conn.update(resources(f"v{i}b", cds=[res(f"c{i}", "2"), res("keep")]))
        conn.pushes()
    assert conn._changed_clusters == {"c49"}


def test_a_resumed_stream_sent_nothing_takes_new_names_without_a_nonce() -> None:
    """A SotW proxy that moved to this replica presents the versions it holds; they are
    current, so it is sent nothing, and this stream has no nonce to answer. Its next request
    (a cluster was added: its endpoints are wanted) carries no nonce either, as Envoy's do on a
    new stream, and must be taken as the subscription it is, not as a stale reply."""
    v1 = resources("v1", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r")])
    first = Connection("c1", delta=False)
    subscribed(first, ["a"], ["r"])
    first.update(v1)
    held = {p.type_url: p for p in first.pushes()}

    moved = Connection("c2", delta=False)
    moved.update(v1)
    for type_url, names in ((CDS, []), (EDS, ["a"]), (LDS, []), (RDS, ["r"])):
        resume = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=names, version_info=held[type_url].version
        )
        moved.handle(type_url, resume)
    assert moved.pushes() == []  # it holds all of it

    v2 = resources("v2", cds=[res("a"), res("b")], eds=[res("a"), res("b")], lds=[res("l")], rds=[res("r")])
    moved.update(v2)
    cds = [p for p in moved.pushes() if p.type_url == CDS]
    assert cds and [r.name for r in cds[0].resources] == ["a", "b"]
    moved.handle(CDS, request(CDS, [], cds[0]))
    outcome = moved.handle(
        EDS, discovery_pb2.DiscoveryRequest(type_url=EDS, resource_names=["a", "b"], version_info=held[EDS].version)
    )
    assert outcome.kind is not RequestKind.STALE
    eds = [p for p in moved.pushes() if p.type_url == EDS]
    assert eds and "b" in [r.name for r in eds[0].resources]


def test_a_plain_ack_leaves_nothing_due_and_one_that_releases_a_cluster_does() -> None:
    """The servicer wakes a stream after a request only when `push_due`: after a plain ACK,
    `pushes()` has nothing to say; after one that lets a retained cluster go, it has CDS."""
    conn = Connection("c1", delta=False)
    subscribed(conn, ["a", "b"], ["r"])
    assert conn.push_due
    conn.update(resources("v1", cds=[res("a"), res("b")], eds=[res("a"), res("b")], lds=[res("l")], rds=[res("r")]))
    for push in conn.pushes():
        names = {EDS: ["a", "b"], RDS: ["r"]}.get(push.type_url)
        conn.handle(push.type_url, request(push.type_url, names, push))
        assert not conn.push_due
        assert conn.pushes() == []
    conn.update(resources("v2", cds=[res("a")], eds=[res("a")], lds=[res("l")], rds=[res("r", "2")]))
    (rds_push,) = conn.pushes()
    assert conn.retained_clusters == {"b"}
    conn.handle(RDS, request(RDS, ["r"], rds_push))
    assert conn.push_due  # b was retained: its release is CDS news
    pushes = conn.pushes()
    assert [p.type_url for p in pushes] == [CDS, EDS]
    # An ACK naming other names than before is a subscription change: due.
    conn.handle(EDS, request(EDS, ["a"], pushes[1]))
    assert conn.push_due
