"""Proxies as an attacker writes them: odd node ids and metadata, floods of subscriptions, NACK
storms and streams that never read. The real server on loopback must stay up, end what abuses it,
log it in bounded, escaped lines, and keep serving a well-behaved Envoy at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import PRODUCTPAGE, examples_copy
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.server.subscription import MAX_NAMES
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return examples_copy(tmp_path_factory.mktemp("abuse"))


@dataclass
class Abuser:
    """One hostile stream: the requests it sends, and whether it ever reads a response."""

    delta: bool
    requests: list[Any] = field(default_factory=list)
    reads: bool = False


async def streams_left(server: Any, count: int, within: float = 5.0) -> None:
    """Wait until the server holds `count` streams, and fail if it still holds others `within`
    seconds later."""
    deadline = asyncio.get_running_loop().time() + within
    while len(server.ads.streams) != count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert len(server.ads.streams) == count, list(server.ads.streams)


async def abuse(address: str, abuser: Abuser, hold: float = 0.3) -> grpc.StatusCode | None:
    """Send the abuser's requests and hold the stream open up to `hold` seconds; the status it
    ended with, None when the server left it open."""
    async with grpc.aio.insecure_channel(address) as channel:
        if abuser.delta:
            method = channel.stream_stream(
                METHOD + "DeltaAggregatedResources",
                request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString,
            )
        else:
            method = channel.stream_stream(
                METHOD + "StreamAggregatedResources",
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
            )
        call = method()
        drain = asyncio.create_task(_drain(call)) if abuser.reads else None
        try:
            for request in abuser.requests:
                await call.write(request)
            return await asyncio.wait_for(call.code(), hold)
        except TimeoutError:
            return None
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        except asyncio.InvalidStateError:  # the server ended the call before every write was sent
            code: grpc.StatusCode = await call.code()
            return code
        finally:
            call.cancel()
            if drain is not None:
                drain.cancel()


async def _drain(call: Any) -> None:
    """Read every response, as Envoy does (a client that does not read never sees the status:
    the server's last responses stay queued behind HTTP/2 flow control, the status after them)."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
        async for _ in call:
            pass


# -- the strategies -----------------------------------------------------------------------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=40))
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20,
)
_node_ids = st.one_of(
    st.text(max_size=3000),
    st.builds(
        lambda kind, ip, name, domain: f"{kind}~{ip}~{name}~{domain}",
        st.sampled_from(["sidecar", "router", "gateway", ""]),
        st.sampled_from(["10.10.0.11", "10.10.0.41", "", "::1", "not-an-ip"]),
        st.one_of(st.text(max_size=60), st.just("productpage-v1-vm.bookinfo")),
        st.text(max_size=60),
    ),
)
_metadata = st.dictionaries(
    st.sampled_from(["NAMESPACE", "LABELS", "INTERCEPTION_MODE", "ISTIO_VERSION", "x"]), _json, max_size=4
)
_type_urls = st.one_of(st.sampled_from(list(types.PUSH_ORDER)), st.text(max_size=100))
_names = st.lists(st.text(max_size=80), max_size=30)


@st.composite
def abusers(draw: st.DrawFn) -> Abuser:
    delta = draw(st.booleans())
    abuser = Abuser(delta, reads=draw(st.booleans()))
    for index in range(draw(st.integers(1, 6))):
        type_url = draw(_type_urls)
        names = draw(_names)
        nonce = draw(st.one_of(st.just(""), st.text(max_size=10)))
        if delta:
            request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce)
            request.resource_names_subscribe.extend(names)
            request.resource_names_unsubscribe.extend(draw(_names))
            request.initial_resource_versions.update(dict.fromkeys(draw(_names), "v"))
        else:
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url, response_nonce=nonce, resource_names=names, version_info=draw(st.text(max_size=20))
            )
        if draw(st.booleans()):
            request.error_detail.CopyFrom(status_pb2.Status(code=13, message=draw(st.text(max_size=500))))
        if index == 0 and draw(st.integers(0, 9)) > 0:
            request.node.id = draw(_node_ids)
            meta = struct_pb2.Struct()
            meta.update(draw(_metadata))
            request.node.metadata.CopyFrom(meta)
        abuser.requests.append(request)
    return abuser


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile=st.lists(abusers(), min_size=1, max_size=6), delta=st.booleans())
def test_good_proxies_converge_whatever_other_streams_send(mesh: Path, hostile: list[Abuser], delta: bool) -> None:
    """Whatever the hostile streams send, a well-behaved proxy converges, and the server logs no
    error of its own (a traceback would mean the input reached code that did not expect it)."""
    errors = _ServerErrors()
    logging.getLogger("meshctl").addHandler(errors)

    async def test() -> None:
        async with serving(mesh) as server:
            address = f"127.0.0.1:{server.xds_port}"
            bad = [asyncio.create_task(abuse(address, a)) for a in hostile]
            async with AdsClient(address, PRODUCTPAGE, delta=delta) as good:
                await good.wait_for(lambda c: c.complete(), timeout=20)
                assert "outbound|9080|v1|reviews.bookinfo.mesh" in good.names(types.CLUSTER)
            await asyncio.gather(*bad)

    try:
        run(test)
    finally:
        logging.getLogger("meshctl").removeHandler(errors)
    assert errors.records == [], errors.records[0].getMessage()


class _ServerErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def flood(delta: bool, count: int, per_request: int = 20_000) -> list[Any]:
    """Requests subscribing `count` endpoint names in chunks, the first naming a good node."""
    out: list[Any] = []
    for start in range(0, count, per_request):
        names = [f"outbound|80||flood-{i}.example" for i in range(start, min(count, start + per_request))]
        if delta:
            request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=types.ENDPOINT)
            request.resource_names_subscribe.extend(names)
        else:
            request = discovery_pb2.DiscoveryRequest(type_url=types.ENDPOINT, resource_names=names)
        if not out:
            request.node.id = PRODUCTPAGE
        out.append(request)
    return out


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_a_subscription_flood_ends_that_stream_and_no_other(
    mesh: Path, delta: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def test() -> None:
        async with serving(mesh) as server:
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, PRODUCTPAGE, delta=delta) as good:
                await good.wait_for(lambda c: c.complete(), timeout=20)
                requests = flood(delta, MAX_NAMES + 1) if delta else flood(False, MAX_NAMES + 1, MAX_NAMES + 1)
                code = await abuse(address, Abuser(delta, requests, reads=True), hold=20)
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
                # One that stops reading cannot hold its stream open by blocking the writes.
                await abuse(address, Abuser(delta, requests), hold=5)
                # The client sees the status before the server's handler has run its cleanup:
                # the stream is gone once that has (a few loop turns, never seconds).
                await streams_left(server, 1)
                # The good stream is untouched and still gets pushes.
                (mesh / "bookinfo" / "extra.yaml").write_text(
                    "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\n"
                    f"metadata: {{name: extra-{int(delta)}, namespace: bookinfo}}\n"
                    f"spec: {{hosts: [extra{int(delta)}.example.com], resolution: DNS, location: MESH_EXTERNAL,"
                    " ports: [{number: 80, name: http, protocol: HTTP}]}\n"
                )
                try:
                    cluster = f"outbound|80||extra{int(delta)}.example.com"
                    await good.wait_for(lambda c: cluster in c.names(types.CLUSTER), timeout=20)
                finally:
                    (mesh / "bookinfo" / "extra.yaml").unlink()
                assert len(server.ads.streams) == 1

    with caplog.at_level(logging.WARNING, logger="meshctl.server.ads"):
        run(test)
    ended = [r.getMessage() for r in caplog.records if "ended the stream" in r.getMessage()]
    assert len(ended) == 2 and str(MAX_NAMES) in ended[0].replace(",", "")


def test_a_nack_storm_is_logged_once_and_node_ids_are_escaped(mesh: Path, caplog: pytest.LogCaptureFixture) -> None:
    hostile_id = "sidecar~10.10.0.11~productpage-v1-vm.bookinfo~bookinfo.svc.cluster.local\n\x1b[31mFAKE LINE"

    async def test() -> None:
        async with serving(mesh) as server:
            address = f"127.0.0.1:{server.xds_port}"
            first = discovery_pb2.DiscoveryRequest(type_url=types.CLUSTER)
            first.node.id = PRODUCTPAGE
            storm = [first]
            async with grpc.aio.insecure_channel(address) as channel:
                call = channel.stream_stream(
                    METHOD + "StreamAggregatedResources",
                    request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
                )()
                await call.write(storm[0])
                response = await call.read()
                nack = discovery_pb2.DiscoveryRequest(type_url=types.CLUSTER, response_nonce=response.nonce)
                nack.error_detail.CopyFrom(status_pb2.Status(code=13, message="bad\ncluster\x1b[0m" * 100))
                for _ in range(200):
                    await call.write(nack)
                await asyncio.sleep(0.5)
                call.cancel()
            await abuse(address, Abuser(False, [_with_node(hostile_id)]))
            assert 'pilot_total_xds_rejects{type="cds"} 1\n' in server.metrics.render()

    with caplog.at_level(logging.INFO, logger="meshctl.server.ads"):
        run(test)
    lines = [r.getMessage() for r in caplog.records if r.name == "meshctl.server.ads"]
    rejected = [m for m in lines if "rejected CDS" in m]
    assert len(rejected) == 1, rejected
    assert all("\n" not in m and "\x1b" not in m for m in lines)
    assert any("\\x1b[31mFAKE LINE" in m for m in lines)


def _with_node(node_id: str) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(type_url=types.CLUSTER)
    request.node.id = node_id
    return request
