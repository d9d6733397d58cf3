"""The xDS protocol rules, driven directly on the sans-IO subscription objects."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from meshctl.server.subscription import DeltaSubscription, RequestKind, Resource, SotwSubscription

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def res(name: str, version: str = "1") -> Resource:
    return Resource(name, version, f"{name}@{version}".encode())


def pool(*resources: Resource) -> dict[str, Resource]:
    return {r.name: r for r in resources}


def sotw(names: list[str] | None = None, nonce: str = "", version: str = "", error: str = ""):  # type: ignore[no-untyped-def]
    req = discovery_pb2.DiscoveryRequest(
        resource_names=names or [], response_nonce=nonce, version_info=version, type_url=CDS
    )
    if error:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def test_sotw_wildcard_initial_ack_and_change() -> None:
    sub = SotwSubscription(CDS, wildcard_when_empty=True)
    assert sub.next_push(pool(res("a"))) is None  # nothing asked yet
    assert sub.handle(sotw()).kind is RequestKind.INITIAL
    push = sub.next_push(pool(res("a"), res("b")))
    assert push is not None and [r.name for r in push.resources] == ["a", "b"]
    assert sub.handle(sotw(nonce=push.nonce, version=push.version)).kind is RequestKind.ACK
    assert sub.acked_version == push.version
    assert sub.next_push(pool(res("a"), res("b"))) is None  # nothing new
    second = sub.next_push(pool(res("a", "2"), res("b")))
    assert second is not None and second.version != push.version and second.nonce != push.nonce
    assert len(second.resources) == 2  # state of the world: the complete set


def test_sotw_empty_set_is_still_answered_so_the_node_stops_waiting() -> None:
    sub = SotwSubscription(CDS, wildcard_when_empty=True)
    sub.handle(sotw())
    push = sub.next_push({})
    assert push is not None and push.resources == ()


def test_sotw_stale_nonce_is_ignored() -> None:
    sub = SotwSubscription(EDS, wildcard_when_empty=False)
    sub.handle(sotw(["a"]))
    first = sub.next_push(pool(res("a")))
    second = sub.next_push(pool(res("a", "2")))
    assert first is not None and second is not None
    outcome = sub.handle(sotw(["a", "b"], nonce=first.nonce, version=first.version))
    assert outcome.kind is RequestKind.STALE
    assert sub.names == {"a"}  # a stale request changes nothing


def test_sotw_nack_is_recorded_and_not_answered_with_the_same_config() -> None:
    sub = SotwSubscription(CDS, wildcard_when_empty=True)
    sub.handle(sotw())
    good = sub.next_push(pool(res("a")))
    assert good is not None
    sub.handle(sotw(nonce=good.nonce, version=good.version))
    bad = sub.next_push(pool(res("a", "bad")))
    assert bad is not None
    outcome = sub.handle(sotw(nonce=bad.nonce, version=good.version, error="invalid cluster"))
    assert outcome.kind is RequestKind.NACK and outcome.error == "invalid cluster"
    assert sub.nack is not None and sub.nack.version == bad.version
    assert sub.acked_version == good.version
    assert sub.next_push(pool(res("a", "bad"))) is None  # same content: not again
    fixed = sub.next_push(pool(res("a", "fixed")))
    assert fixed is not None
    sub.handle(sotw(nonce=fixed.nonce, version=fixed.version))
    assert sub.nack is None


def test_sotw_named_resources_that_appear_later_are_sent() -> None:
    sub = SotwSubscription(EDS, wildcard_when_empty=False)
    sub.handle(sotw(["a", "later"]))
    first = sub.next_push(pool(res("a"), res("other")))
    assert first is not None and [r.name for r in first.resources] == ["a"]
    sub.handle(sotw(["a", "later"], nonce=first.nonce, version=first.version))
    assert sub.next_push(pool(res("a"), res("other"))) is None
    second = sub.next_push(pool(res("a"), res("later"), res("other")))
    assert second is not None and [r.name for r in second.resources] == ["a", "later"]


def test_sotw_subscription_change_on_ack_is_answered() -> None:
    sub = SotwSubscription(EDS, wildcard_when_empty=False)
    sub.handle(sotw(["a"]))
    first = sub.next_push(pool(res("a"), res("b")))
    assert first is not None
    outcome = sub.handle(sotw(["a", "b"], nonce=first.nonce, version=first.version))
    assert outcome.kind is RequestKind.ACK and outcome.subscription_changed
    second = sub.next_push(pool(res("a"), res("b")))
    assert second is not None and [r.name for r in second.resources] == ["a", "b"]


def test_sotw_reconnect_with_current_version_sends_nothing() -> None:
    sub = SotwSubscription(CDS, wildcard_when_empty=True)
    sub.handle(sotw())
    push = sub.next_push(pool(res("a")))
    assert push is not None
    again = SotwSubscription(CDS, wildcard_when_empty=True)
    again.handle(sotw(version=push.version))
    assert again.next_push(pool(res("a"))) is None
    assert again.next_push(pool(res("a", "2"))) is not None


def delta(
    sub: list[str] | None = None,
    unsub: list[str] | None = None,
    nonce: str = "",
    initial: dict[str, str] | None = None,
    error: str = "",
) -> discovery_pb2.DeltaDiscoveryRequest:
    req = discovery_pb2.DeltaDiscoveryRequest(
        type_url=EDS,
        resource_names_subscribe=sub or [],
        resource_names_unsubscribe=unsub or [],
        response_nonce=nonce,
        initial_resource_versions=initial or {},
    )
    if error:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def test_delta_sends_only_changes_and_removals() -> None:
    sub = DeltaSubscription(CDS, wildcard_when_empty=True)
    sub.handle(delta())
    first = sub.next_push(pool(res("a"), res("b")))
    assert first is not None and [r.name for r in first.resources] == ["a", "b"]
    assert sub.handle(delta(nonce=first.nonce)).kind is RequestKind.ACK
    assert sub.next_push(pool(res("a"), res("b"))) is None
    change = sub.next_push(pool(res("a", "2")))
    assert change is not None
    assert [r.name for r in change.resources] == ["a"] and change.removed == ("b",)


def test_delta_initial_resource_versions_skip_what_the_node_has() -> None:
    sub = DeltaSubscription(EDS, wildcard_when_empty=False)
    sub.handle(delta(sub=["a", "b"], initial={"a": "1", "b": "old"}))
    push = sub.next_push(pool(res("a"), res("b")))
    assert push is not None and [r.name for r in push.resources] == ["b"]


def test_delta_subscribe_unsubscribe_even_on_a_stale_nonce_and_absent_names() -> None:
    sub = DeltaSubscription(EDS, wildcard_when_empty=False)
    sub.handle(delta(sub=["a"]))
    first = sub.next_push(pool(res("a")))
    second_nonce_holder = sub.next_push(pool(res("a", "2")))
    assert first is not None and second_nonce_holder is not None
    sub.handle(delta(sub=["ghost"], unsub=["a"], nonce=first.nonce))
    assert sub.names == {"ghost"}
    push = sub.next_push(pool(res("a", "2")))
    assert push is not None and push.resources == () and push.removed == ("ghost",)
    assert sub.next_push(pool(res("a", "2"))) is None  # absence is told once
    appeared = sub.next_push(pool(res("a", "2"), res("ghost")))
    assert appeared is not None and [r.name for r in appeared.resources] == ["ghost"]


def test_delta_nack_does_not_resend_the_rejected_content() -> None:
    sub = DeltaSubscription(EDS, wildcard_when_empty=False)
    sub.handle(delta(sub=["a"]))
    bad = sub.next_push(pool(res("a", "bad")))
    assert bad is not None
    outcome = sub.handle(delta(nonce=bad.nonce, error="no"))
    assert outcome.kind is RequestKind.NACK and sub.nack is not None
    assert sub.next_push(pool(res("a", "bad"))) is None
    good = sub.next_push(pool(res("a", "good")))
    assert good is not None and [r.version for r in good.resources] == ["good"]


def test_delta_resubscribe_resends() -> None:
    sub = DeltaSubscription(EDS, wildcard_when_empty=False)
    sub.handle(delta(sub=["a"]))
    first = sub.next_push(pool(res("a")))
    assert first is not None
    sub.handle(delta(nonce=first.nonce))
    sub.handle(delta(unsub=["a"]))
    assert sub.next_push(pool(res("a"))) is None
    sub.handle(delta(sub=["a"]))
    again = sub.next_push(pool(res("a")))
    assert again is not None and [r.name for r in again.resources] == ["a"]
