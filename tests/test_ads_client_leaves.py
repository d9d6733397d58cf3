"""A client that leaves while a push is being written: the stream ends quietly, with nothing
left behind for the event loop to complain about."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow

METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
NODE = "sidecar~10.40.0.9~client.shop~shop.svc.cluster.local"


def big_mesh(root: Path, services: int = 1500) -> Path:
    """Enough services that one CDS response is megabytes, more than HTTP/2 lets a client that
    does not read take in: the server's write waits on flow control when the client leaves."""
    docs = [
        f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc-{i}, namespace: shop}}
spec:
  hosts: [svc-{i}.shop.mesh]
  location: MESH_INTERNAL
  ports: [{{number: 8080, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 10.1.{i // 250}.{i % 250 + 1}}}]
"""
        for i in range(services)
    ]
    (root / "services.yaml").write_text("---\n".join(docs))
    return root


def test_a_client_leaving_mid_push_leaves_no_unretrieved_task(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mesh = big_mesh(tmp_path)

    async def test() -> None:
        async with serving(mesh) as server:
            for _ in range(5):
                # No window growth from bandwidth probes: HTTP/2 flow control stops the server's write
                # once the client's window is full, as with a proxy that stopped reading.
                options = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 1 << 30)]
                async with grpc.aio.insecure_channel(f"127.0.0.1:{server.xds_port}", options=options) as channel:
                    call = channel.stream_stream(
                        METHOD,
                        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                        response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
                    )()
                    for type_url in (types.CLUSTER, types.LISTENER):
                        request = discovery_pb2.DiscoveryRequest(type_url=type_url)
                        request.node.id = NODE
                        await call.write(request)
                    await asyncio.sleep(1.0)  # the push is written and waits: this client never reads
                    call.cancel()
                await asyncio.sleep(0.2)
            gc.collect()
            await asyncio.sleep(0.1)

    with caplog.at_level(logging.ERROR):
        run(test)
        gc.collect()
    complaints = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert complaints == []
