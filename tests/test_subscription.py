"""The xDS protocol rules, driven directly on the sans-IO subscription objects."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from meshctl.server.subscription import (
    DeltaSubscription,
    Push,
    RequestKind,
    Resource,
    ResourceSet,
    SotwSubscription,
    set_version,
)

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


# -- state of the world, partial (EDS and RDS) ---------------------------------------------------


def eds(names: list[str], nonce: str = "", version: str = "", error: str = "") -> discovery_pb2.DiscoveryRequest:
    req = sotw(names, nonce=nonce, version=version, error=error)
    req.type_url = EDS
    return req


def partial(names: list[str]) -> SotwSubscription:
    sub = SotwSubscription(EDS, wildcard_when_empty=False, partial=True)
    sub.handle(eds(names))
    return sub


def must(push: Push | None) -> Push:
    assert push is not None
    return push


def sent(push: Push | None) -> list[tuple[str, str]]:
    return [(r.name, r.version) for r in must(push).resources]


def ack(sub: SotwSubscription, push: Push | None) -> Push:
    push = must(push)
    assert sub.handle(eds(sorted(sub.names), nonce=push.nonce, version=push.version)).kind is RequestKind.ACK
    return push


def test_partial_sends_the_whole_set_first_then_only_what_changed() -> None:
    sub = partial(["a", "b", "c"])
    first = must(sub.next_push(ResourceSet([res("a"), res("b"), res("c")])))
    assert sent(first) == [("a", "1"), ("b", "1"), ("c", "1")]
    ack(sub, first)
    current = ResourceSet([res("a"), res("b", "2"), res("c")])
    change = must(sub.next_push(current))
    assert sent(change) == [("b", "2")]
    # Labelled as the whole set it completes, so ACKs and reconnects mean what they did.
    assert change.version == current.version == set_version(current.values())
    ack(sub, change)
    assert sub.acked_version == current.version and not sub.awaiting_ack
    assert sub.next_push(current) is None


def test_partial_compares_with_what_was_sent_even_before_it_is_acked() -> None:
    sub = partial(["a", "b"])
    first = must(sub.next_push(pool(res("a"), res("b"))))
    second = sub.next_push(pool(res("a", "2"), res("b")))
    third = sub.next_push(pool(res("a", "2"), res("b", "2")))
    assert sent(first) == [("a", "1"), ("b", "1")]
    assert sent(second) == [("a", "2")]
    assert sent(third) == [("b", "2")]


def test_partial_sends_newly_watched_names_alone_and_forgets_unwatched_ones() -> None:
    sub = partial(["a", "b"])
    everything = pool(res("a"), res("b"), res("c"))
    first = must(sub.next_push(everything))
    ack(sub, first)
    assert sub.handle(eds(["a", "b", "c"], nonce=first.nonce, version=first.version)).subscription_changed
    added = must(sub.next_push(everything))
    assert sent(added) == [("c", "1")]
    ack(sub, added)
    # b is no longer watched: nothing to send, but the version of the smaller set is.
    sub.handle(eds(["a", "c"], nonce=added.nonce, version=added.version))
    smaller = must(sub.next_push(everything))
    assert sent(smaller) == []
    assert smaller.version == set_version([res("a"), res("c")])
    ack(sub, smaller)
    # Watched again (Envoy dropped it with its cluster): sent again.
    sub.handle(eds(["a", "b", "c"], nonce=smaller.nonce, version=smaller.version))
    assert sent(sub.next_push(everything)) == [("b", "1")]


@pytest.mark.parametrize("kind", [pool, lambda *r: ResourceSet(r)], ids=["mapping", "resource_set"])
def test_partial_does_not_resend_a_resource_that_left_and_came_back_unchanged(kind: Any) -> None:
    """SotW EDS has no removal: Envoy keeps what it had, so the same version is not sent again."""
    sub = partial(["a", "b"])
    first = must(sub.next_push(kind(res("a"), res("b"))))
    ack(sub, first)
    gone = must(sub.next_push(kind(res("a"))))
    assert sent(gone) == []
    ack(sub, gone)
    back = must(sub.next_push(kind(res("a"), res("b"))))
    assert sent(back) == []
    ack(sub, back)
    assert sent(sub.next_push(kind(res("a"), res("b", "2")))) == [("b", "2")]


def test_partial_nack_resends_what_was_rejected_with_the_next_change_but_not_alone() -> None:
    sub = partial(["a", "b", "c"])
    first = must(sub.next_push(pool(res("a"), res("b"), res("c"))))
    ack(sub, first)
    bad = must(sub.next_push(pool(res("a", "bad"), res("b"), res("c"))))
    assert sent(bad) == [("a", "bad")]
    assert sub.handle(eds(["a", "b", "c"], nonce=bad.nonce, version=first.version, error="no")).kind is RequestKind.NACK
    assert sub.next_push(pool(res("a", "bad"), res("b"), res("c"))) is None  # not the rejected set again
    # The next change brings the node to the whole current state, rejected part included.
    after = must(sub.next_push(pool(res("a", "bad"), res("b", "2"), res("c"))))
    assert sent(after) == [("a", "bad"), ("b", "2")]
    ack(sub, after)
    assert sub.nack is None
    assert sub.next_push(pool(res("a", "bad"), res("b", "2"), res("c"))) is None


def test_partial_stale_nack_still_resends_what_the_rejected_response_carried() -> None:
    """A NACK of an older response arrives after a newer one was sent: the newer one leaves the
    rejected resource out, so an ACK of it would not mean the node holds it."""
    sub = partial(["a", "b"])
    first = must(sub.next_push(pool(res("a"), res("b"))))
    ack(sub, first)
    one = must(sub.next_push(pool(res("a", "2"), res("b"))))
    two = must(sub.next_push(pool(res("a", "2"), res("b", "2"))))
    assert sent(one) == [("a", "2")] and sent(two) == [("b", "2")]
    outcome = sub.handle(eds(["a", "b"], nonce=one.nonce, version=first.version, error="no"))
    assert outcome.kind is RequestKind.STALE
    ack(sub, two)
    again = must(sub.next_push(pool(res("a", "2"), res("b", "2"))))
    assert sent(again) == [("a", "2")] and again.version == two.version


def test_partial_reconnect_at_the_current_version_holds_the_set() -> None:
    current = ResourceSet([res("a"), res("b")])
    sub = SotwSubscription(EDS, wildcard_when_empty=False, partial=True)
    sub.handle(eds(["a", "b"], version=current.version))
    assert sub.next_push(current) is None
    assert sent(sub.next_push(ResourceSet([res("a", "2"), res("b")]))) == [("a", "2")]


def test_partial_reconnect_at_another_version_starts_from_the_whole_set() -> None:
    sub = SotwSubscription(EDS, wildcard_when_empty=False, partial=True)
    sub.handle(eds(["a", "b"], version="from-before"))
    assert sent(sub.next_push(ResourceSet([res("a", "2"), res("b")]))) == [("a", "2"), ("b", "1")]


def test_partial_resend_sends_those_names_alone() -> None:
    sub = partial(["a", "b"])
    current = ResourceSet([res("a"), res("b")])
    ack(sub, sub.next_push(current))
    sub.resend(["b", "not-watched"])
    again = must(sub.next_push(current))
    assert sent(again) == [("b", "1")] and again.version == current.version
    assert sub.next_push(current) is None


def test_partial_streams_making_the_same_move_share_one_tuple() -> None:
    """The cache hands every sidecar of a namespace the same sets: the change between them is
    computed once, and its bytes can be encoded once."""
    before = ResourceSet([res("a"), res("b"), res("c")])
    after = ResourceSet([res("a"), res("b", "2"), res("c")])
    pushes = []
    for _ in range(3):
        sub = partial(["a", "b", "c"])
        ack(sub, sub.next_push(before))
        pushes.append(must(sub.next_push(after)))
    assert all(p.resources is pushes[0].resources for p in pushes)
    assert sent(pushes[0]) == [("b", "2")]
    assert after.changed_since(before) is pushes[0].resources
    assert after.changed_since(ResourceSet([])) is after.ordered


def test_partial_nack_of_a_response_no_longer_tracked_forgets_everything() -> None:
    """A node that leaves many responses unanswered and then rejects one of the first: what it
    holds is unknown, so the next response is the whole set."""
    sub = partial(["a", "b"])
    first = must(sub.next_push(pool(res("a"), res("b"))))
    for i in range(100):
        must(sub.next_push(pool(res("a", str(i)), res("b"))))
    sub.handle(eds(["a", "b"], nonce=first.nonce, error="no"))
    assert sent(sub.next_push(pool(res("a", "99"), res("b")))) == [("a", "99"), ("b", "1")]
