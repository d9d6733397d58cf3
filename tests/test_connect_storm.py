"""A fleet connecting at once while the server's loop is busy: gRPC core holds the streams the
server has not accepted yet, and must hand every one over once the loop is free. Its default
cancels them at random past 1,000 waiting, which Envoys see as CANCELLED streams that never
reached the server (they re-dial, but only after their backoff)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from meshctl.testing.server import run, serving

METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
NS = "storm"
MESH = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ratings, namespace: {NS}}}
spec:
  hosts: [ratings.{NS}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.1.0.2}}]
"""
#: Streams opened while the loop is blocked: half again gRPC core's default soft bound (1,000),
#: past which it used to cancel about one stream in eight.
STREAMS = 1500
CHANNELS = 30


#: The fleet, in its own process so that it connects while the server's loop is blocked.
FLEET = """
import asyncio, collections, json, sys, grpc
from envoy.service.discovery.v3 import discovery_pb2
address, streams, channels, ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

async def first_response(channel, i):
    request = discovery_pb2.DiscoveryRequest(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster")
    request.node.id = f"sidecar~10.2.{i // 250}.{i % 250}~app-{i}.{ns}~{ns}.svc.cluster.local"
    call = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
    )()
    try:
        await call.write(request)
        await call.read()
        return "OK"
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    finally:
        call.cancel()

async def main():
    options = [("grpc.use_local_subchannel_pool", 1)]
    chans = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]
    for c in chans:
        await asyncio.wait_for(c.channel_ready(), 10)
    print("ready", flush=True)
    codes = await asyncio.gather(*(first_response(chans[i % channels], i) for i in range(streams)))
    print(json.dumps(collections.Counter(codes)), flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_streams_opened_while_the_server_is_busy_are_all_accepted(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH)

    async def body() -> None:
        async with serving(tmp_path) as server:
            fleet = await asyncio.create_subprocess_exec(
                sys.executable, "-c", FLEET, f"127.0.0.1:{server.xds_port}", str(STREAMS), str(CHANNELS), NS,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert fleet.stdout is not None
            assert await fleet.stdout.readline() == b"ready\n"
            # The loop blocked, as by a large generation, while the fleet opens its streams; each
            # sends Envoy's first request and waits for the first response.
            time.sleep(3.0)
            out, _ = await fleet.communicate()
            codes = json.loads(out)
            # Before: {'OK': 1431, 'INTERNAL': 48, 'CANCELLED': 21} (INTERNAL: cancelled while the
            # client was still writing its first request).
            assert codes == {"OK": STREAMS}, codes

    run(body, timeout=120)
