"""A state-of-the-world subscription asked again for the very set it found nothing to send from
(a change that left its type alone: an endpoint change leaves clusters, listeners and routes)
answers without reading it, and still sends what a request or a `resend` makes due."""

from __future__ import annotations

from collections.abc import Iterator

from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from meshctl.server.subscription import RequestKind, SotwSubscription
from meshctl.xds.resources import Resource

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


class Offered(dict[str, Resource]):
    """The resources a stream is offered, counting how often a subscription reads them."""

    reads = 0

    def __iter__(self) -> Iterator[str]:
        self.reads += 1
        return super().__iter__()

    def __getitem__(self, name: str) -> Resource:
        self.reads += 1
        return super().__getitem__(name)


def _offered(*names: str, version: str = "1") -> Offered:
    return Offered({n: Resource(n, version, f"{n}@{version}".encode()) for n in names})


def _request(
    type_url: str, names: list[str], nonce: str = "", version: str = "", error: str = ""
) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(
        type_url=type_url, resource_names=names, response_nonce=nonce, version_info=version
    )
    if error:
        request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return request


def test_the_same_set_again_is_not_read_again_and_a_resend_still_sends() -> None:
    sub = SotwSubscription(CDS, wildcard_when_empty=True)
    sub.handle(_request(CDS, []))
    offered = _offered("a", "b")
    push = sub.next_push(offered)
    assert push is not None
    assert sub.handle(_request(CDS, [], push.nonce, push.version)).kind is RequestKind.ACK
    assert sub.next_push(offered) is None  # read once: the node holds it
    reads = offered.reads
    assert sub.next_push(offered) is None and sub.next_push(offered) is None
    assert offered.reads == reads
    # An updated cluster's endpoints are sent again even when unchanged (`Connection.pushes`).
    sub.resend(["a"])
    again = sub.next_push(offered)
    assert again is not None and [r.name for r in again.resources] == ["a", "b"]


def test_a_request_makes_the_same_set_read_again() -> None:
    sub = SotwSubscription(EDS, wildcard_when_empty=False, partial=True)
    sub.handle(_request(EDS, ["a", "b"]))
    offered = _offered("a", "b", "c")
    push = sub.next_push(offered)
    assert push is not None and {r.name for r in push.resources} == {"a", "b"}
    sub.handle(_request(EDS, ["a", "b"], push.nonce, push.version))
    assert sub.next_push(offered) is None
    reads = offered.reads
    assert sub.next_push(offered) is None and offered.reads == reads
    # The node watches one more cluster: the same set now has something for it.
    sub.handle(_request(EDS, ["a", "b", "c"], push.nonce, push.version))
    more = sub.next_push(offered)
    assert more is not None and [r.name for r in more.resources] == ["c"]
    # It rejects that response: what it carried is sent again with the next change.
    sub.handle(_request(EDS, ["a", "b", "c"], more.nonce, push.version, error="bad c"))
    assert sub.next_push(offered) is None  # the version it rejected is not sent again unchanged
    moved = _offered("a", "b", "c", version="2")
    resent = sub.next_push(moved)
    assert resent is not None and [r.name for r in resent.resources] == ["a", "b", "c"]
