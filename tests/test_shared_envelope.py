"""One response's bytes for every stream sent it: the streams share its nonce (`SharedNonces`),
each stream's nonces stay its own, and the servicer hands every stream's write the very same
bytes object; in state of the world, and in delta for the streams making the same move."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from test_ads_client_leaves import big_mesh
from test_subscription import CDS, EDS, ack, delta, eds, must, res, sent, sotw

from meshctl.server.app import Server
from meshctl.server.encode import BlockCache, encode_delta, encode_sotw
from meshctl.server.settings import DebounceSettings, ServeSettings
from meshctl.server.subscription import DeltaSubscription, RequestKind, SotwSubscription
from meshctl.server.subscription_common import SharedNonces
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run
from meshctl.xds import types
from meshctl.xds.resources import ResourceSet


def _cds(shared: SharedNonces | None) -> SotwSubscription:
    sub = SotwSubscription(CDS, wildcard_when_empty=True, nonce_prefix="c", shared=shared)
    assert sub.handle(sotw()).kind is RequestKind.INITIAL
    return sub


def test_streams_sent_the_same_set_get_one_nonce_and_one_bytes_object() -> None:
    shared = SharedNonces()
    current = ResourceSet([res("a"), res("b")])
    one, two = must(_cds(shared).next_push(current)), must(_cds(shared).next_push(current))
    assert one.nonce == two.nonce and one.shared and two.shared
    blocks = BlockCache()
    assert encode_sotw(one, blocks=blocks) is encode_sotw(two, blocks=blocks)
    # The very bytes a response of its own under that nonce would be.
    assert encode_sotw(one, blocks=blocks) == encode_sotw(dataclasses.replace(one, shared=False))
    # Another set (another namespace's) is another response: another nonce.
    other = must(_cds(shared).next_push(ResourceSet([res("a"), res("c")])))
    assert other.nonce != one.nonce
    # Without the registry, each stream numbers its own, as it always did.
    alone = [must(_cds(None).next_push(current)) for _ in range(2)]
    assert alone[0].nonce == alone[1].nonce == "c1" and not alone[0].shared
    assert encode_sotw(alone[0], blocks=blocks) is not encode_sotw(alone[1], blocks=blocks)


def test_the_same_response_again_on_one_stream_gets_a_nonce_of_its_own() -> None:
    shared = SharedNonces()
    first_set, second_set = ResourceSet([res("a")]), ResourceSet([res("a", "2")])
    sub = _cds(shared)
    first = must(sub.next_push(first_set))
    sub.resend(["a"])  # a cluster warming: the same set is sent again
    again = must(sub.next_push(first_set))
    assert again.nonce != first.nonce and not again.shared
    # The set changes and changes back: the old response is kept, but this stream took it.
    assert sub.handle(sotw(nonce=again.nonce, version=again.version)).kind is RequestKind.ACK
    second = must(sub.next_push(second_set))
    back = must(sub.next_push(first_set))
    nonces = [first.nonce, again.nonce, second.nonce, back.nonce]
    assert len(set(nonces)) == 4, nonces
    assert second.shared and not back.shared
    # Another stream sent the old set for the first time shares its nonce still.
    assert must(_cds(shared).next_push(first_set)).nonce == first.nonce


def test_an_ack_or_nack_of_the_shared_nonce_is_matched_on_each_stream() -> None:
    shared = SharedNonces()
    current = ResourceSet([res("a")])
    one, two = _cds(shared), _cds(shared)
    push = must(one.next_push(current))
    assert must(two.next_push(current)).nonce == push.nonce
    assert one.handle(sotw(nonce=push.nonce, version=push.version)).kind is RequestKind.ACK
    assert one.acked_version == push.version
    nack = two.handle(sotw(nonce=push.nonce, error="bad cluster"))
    assert nack.kind is RequestKind.NACK and two.nack is not None and two.nack.nonce == push.nonce
    assert two.next_push(current) is None  # the version rejected is not sent again
    newer = must(one.next_push(ResourceSet([res("a", "2")])))
    assert one.handle(sotw(nonce=push.nonce, version=push.version)).kind is RequestKind.STALE
    assert one.handle(sotw(nonce=newer.nonce, version=newer.version)).kind is RequestKind.ACK


def test_partial_streams_share_the_nonce_and_a_nack_of_it_forgets_what_it_carried() -> None:
    shared = SharedNonces()
    before = ResourceSet([res("a"), res("b")])
    after = ResourceSet([res("a", "2"), res("b")])
    subs = []
    for _ in range(2):
        sub = SotwSubscription(EDS, wildcard_when_empty=False, partial=True, shared=shared)
        sub.handle(eds(["a", "b"]))
        subs.append(sub)
    firsts = [ack(sub, sub.next_push(before)) for sub in subs]
    moves = [must(sub.next_push(after)) for sub in subs]
    assert firsts[0].nonce == firsts[1].nonce and moves[0].nonce == moves[1].nonce != firsts[0].nonce
    assert sent(moves[0]) == [("a", "2")]
    # One stream rejects the move, a newer response goes out, and then the other's ACK comes:
    # the NACK is stale, but still forgets "a" at version 2 (`_unanswered`, by the shared nonce).
    one, two = subs
    newer = ResourceSet([res("a", "2"), res("b", "3")])
    three = must(one.next_push(newer))
    assert sent(three) == [("b", "3")]
    outcome = one.handle(eds(["a", "b"], nonce=moves[0].nonce, version=firsts[0].version, error="no"))
    assert outcome.kind is RequestKind.STALE
    ack(one, three)
    assert sent(one.next_push(newer)) == [("a", "2")]
    # The other stream's ACK of the very same nonce holds what it carried.
    ack(two, moves[1])
    assert sent(two.next_push(newer)) == [("b", "3")]


def _delta_eds(shared: SharedNonces | None) -> DeltaSubscription:
    sub = DeltaSubscription(EDS, wildcard_when_empty=False, nonce_prefix="e", shared=shared)
    sub.handle(delta(sub=["a", "b", "c"]))
    return sub


def test_delta_streams_making_the_same_move_get_one_nonce_and_one_bytes_object() -> None:
    shared = SharedNonces()
    before = ResourceSet([res("a"), res("b"), res("c")])
    after = ResourceSet([res("a", "2"), res("b"), res("c")])
    subs = [_delta_eds(shared) for _ in range(2)]
    firsts = [must(sub.next_push(before)) for sub in subs]
    assert firsts[0].nonce == firsts[1].nonce and firsts[0].shared
    for sub, first in zip(subs, firsts, strict=True):
        assert sub.handle(delta(nonce=first.nonce)).kind is RequestKind.ACK
    moves = [must(sub.next_push(after)) for sub in subs]
    assert moves[0].nonce == moves[1].nonce != firsts[0].nonce and moves[0].shared
    assert sent(moves[0]) == [("a", "2")]
    blocks = BlockCache()
    assert encode_delta(moves[0], blocks=blocks) is encode_delta(moves[1], blocks=blocks)
    assert encode_delta(moves[0], blocks=blocks) == encode_delta(dataclasses.replace(moves[0], shared=False))
    # Each stream's ACK of the shared nonce is its own.
    one, two = subs
    assert one.handle(delta(nonce=moves[0].nonce)).kind is RequestKind.ACK
    assert two.handle(delta(nonce=moves[1].nonce, error="bad assignment")).kind is RequestKind.NACK
    # A response that removes names is the stream's own: what each stream is told gone differs.
    removal = must(one.next_push(ResourceSet([res("a", "2"), res("b")])))
    assert removal.removed == ("c",) and not removal.shared and removal.nonce == "e1"
    # The same response again on one stream (the node asked again) takes a nonce of its own.
    one.resend(["a"])
    again = must(one.next_push(after))
    assert again.nonce not in {moves[0].nonce, removal.nonce} and not again.shared
    # Without the registry, each stream numbers its own, as it always did.
    alone = [must(_delta_eds(None).next_push(before)) for _ in range(2)]
    assert alone[0].nonce == alone[1].nonce == "e1" and not alone[0].shared


def _services(client: AdsClient) -> int:
    return sum(name.startswith("outbound|") for name in client.resources[types.CLUSTER])


async def _recorded(server: Server, writes: list[tuple[int, bytes]], *, delta: bool) -> None:
    """Every response the servicer writes, with the stream it goes to: the servicer's own
    handler, given the gRPC context with its `write` observed."""
    serve = server.ads.stream_delta if delta else server.ads.stream_sotw

    class Observed:
        def __init__(self, context: Any) -> None:
            self._context = context

        def __getattr__(self, name: str) -> Any:
            return getattr(self._context, name)

        async def write(self, data: bytes) -> None:
            writes.append((id(self._context), data))
            await self._context.write(data)

    async def observed(requests: AsyncIterator[Any], context: Any) -> None:
        await serve(requests, Observed(context))

    if delta:
        server.ads.stream_delta = observed  # type: ignore[method-assign]
    else:
        server.ads.stream_sotw = observed  # type: ignore[method-assign]


@pytest.mark.slow
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_the_servicer_writes_one_bytes_object_to_every_stream_sent_the_same_response(
    tmp_path: Path, delta: bool
) -> None:
    mesh = big_mesh(tmp_path, services=300)

    async def test() -> None:
        writes: list[tuple[int, bytes]] = []
        settings = ServeSettings(
            config_dirs=(mesh,),
            xds_address="127.0.0.1:0",
            admin_address="127.0.0.1:0",
            debounce=DebounceSettings(0.05, 5.0),
            drain_seconds=0.2,
        )
        server = Server(settings)
        await _recorded(server, writes, delta=delta)
        await server.start()
        clients = [
            AdsClient(
                f"127.0.0.1:{server.xds_port}",
                f"sidecar~10.40.3.{i}~client-{i}.shop~shop.svc.cluster.local",
                delta=delta,
            )
            for i in range(6)
        ]
        try:
            for client in clients:
                await client.start()
            for client in clients:
                await client.wait_for(lambda c: c.complete() and _services(c) == 300, timeout=60)
            del writes[:]
            big_mesh(tmp_path, services=301)
            for client in clients:
                await client.wait_for(lambda c: c.complete() and _services(c) == 301, timeout=60)
            by_type: dict[str, list[tuple[int, bytes]]] = {}
            for stream, data in writes:
                response = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
                by_type.setdefault(response.FromString(data).type_url, []).append((stream, data))
            clusters = by_type[types.CLUSTER]
            assert len({stream for stream, _ in clusters}) == 6, "not every stream was sent the change"
            assert len({id(data) for _, data in clusters}) == 1, "each stream was written bytes of its own"
        finally:
            for client in clients:
                await client.close()
            await server.stop()

    run(test, timeout=120)
