"""What health checking over HDS costs the server: 1,000 health-checked workloads reporting.

`meshctl serve` runs as a process on a generated mesh of SERVICES services with PER_SERVICE
WorkloadEntries each, every one annotated `proxy.istio.io/health-checks-enabled`. This process
opens one HDS stream per workload (as each VM's Envoy would) and reports HEALTHY at the interval
the server asks for, and one in-process ADS client stands for every other proxy. Measured:

- the server's CPU seconds per second at steady state (all reporting, nothing changing), read
  from /proc over a window;
- the time from a report that changes a workload's health to the client's EDS showing it (the
  server's share: Envoy itself takes up to periodSeconds x failureThreshold to see a failure,
  plus up to one report interval to report it).

Run: `.venv/bin/python bench/hds.py [--workloads 1000] [--window 30]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import health_check_pb2
from envoy.service.health.v3 import hds_pb2

from meshctl.testing.ads_client import AdsClient
from meshctl.testing.serve_process import ServeProcess
from meshctl.xds import types

NS = "bench"
METHOD = "/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck"
PER_SERVICE = 10


def write_mesh(root: Path, workloads: int) -> None:
    services = max(1, workloads // PER_SERVICE)
    docs = []
    for s in range(services):
        docs.append(
            f"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: svc{s}, namespace: {NS}}}\n"
            f"spec:\n  hosts: [svc{s}.{NS}.mesh]\n  location: MESH_INTERNAL\n  resolution: STATIC\n"
            f"  ports: [{{number: 80, name: http, protocol: HTTP, targetPort: 8080}}]\n"
            f"  workloadSelector: {{labels: {{app: svc{s}}}}}\n"
        )
        for w in range(PER_SERVICE):
            docs.append(
                f"apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: svc{s}-{w}\n"
                f'  namespace: {NS}\n  annotations: {{proxy.istio.io/health-checks-enabled: "true"}}\n'
                f"spec:\n  address: 10.{1 + s // 250}.{s % 250}.{w + 1}\n  labels: {{app: svc{s}}}\n"
            )
    (root / "mesh.yaml").write_text("---\n".join(docs))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Reporter:
    """One VM's Envoy on HDS: the node first, then a report every interval."""

    def __init__(self, channel: grpc.aio.Channel, service: int, index: int) -> None:
        self.cluster = f"health|svc{service}-{index}.{NS}"
        self.node = f"sidecar~10.{1 + service // 250}.{service % 250}.{index + 1}~svc{service}-{index}.{NS}~{NS}.svc"
        self.status = health_check_pb2.HEALTHY
        self.interval = 5.0
        self.sent = asyncio.Event()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        call = channel.stream_stream(
            METHOD,
            request_serializer=hds_pb2.HealthCheckRequestOrEndpointHealthResponse.SerializeToString,
            response_deserializer=hds_pb2.HealthCheckSpecifier.FromString,
        )
        self.call = call(self._requests())

    async def _requests(self) -> Any:
        first = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
        first.health_check_request.node.id = self.node
        yield first
        while True:
            yield await self._queue.get()

    def report(self) -> None:
        message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
        health = message.endpoint_health_response.cluster_endpoints_health.add(cluster_name=self.cluster)
        endpoint = health.locality_endpoints_health.add().endpoints_health.add(health_status=self.status)
        endpoint.endpoint.address.socket_address.address = "127.0.0.1"
        endpoint.endpoint.address.socket_address.port_value = 8080
        self._queue.put_nowait(message)

    async def run(self) -> None:
        spec = await self.call.read()
        self.interval = spec.interval.ToTimedelta().total_seconds() or 5.0
        await asyncio.sleep(self.interval * (hash(self.node) % 1000) / 1000)  # spread, as a fleet is
        while True:
            self.report()
            await asyncio.sleep(self.interval)


def eds_status(client: AdsClient, host: str, address: str) -> int | None:
    cla = client.resources[types.ENDPOINT].get(f"outbound|80||{host}")
    for group in getattr(cla, "endpoints", []):
        for e in group.lb_endpoints:
            if e.endpoint.address.socket_address.address == address:
                return int(e.health_status)
    return None


def healthy_count(client: AdsClient) -> int:
    return sum(
        1
        for cla in client.resources[types.ENDPOINT].values()
        for group in getattr(cla, "endpoints", [])
        for e in group.lb_endpoints
        if e.health_status == health_check_pb2.HEALTHY
    )


async def measure(server: ServeProcess, workloads: int, window: float) -> None:
    pid = server.pid
    assert pid is not None
    async with AdsClient(server.xds_address, f"sidecar~10.9.9.9~client.{NS}~{NS}.svc") as client:
        await client.wait_for(lambda c: c.complete(), timeout=120)
        channel = grpc.aio.insecure_channel(server.xds_address)
        reporters = [Reporter(channel, s, w) for s in range(workloads // PER_SERVICE) for w in range(PER_SERVICE)]
        tasks = [asyncio.create_task(r.run()) for r in reporters]
        start = time.monotonic()
        await client.wait_for(lambda c: healthy_count(c) >= len(reporters), timeout=300)
        print(f"all {len(reporters)} healthy in the client's EDS {time.monotonic() - start:.1f}s after streams opened")
        await asyncio.sleep(reporters[0].interval * 2)
        before, at = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(window)
        used = (cpu_seconds(pid) - before) / (time.monotonic() - at)
        reports = len(reporters) / reporters[0].interval
        print(f"steady state: {used:.3f} CPU s/s for {reports:.0f} reports/s (interval {reporters[0].interval}s)")

        delays = []
        target = reporters[len(reporters) // 2]
        service, index = target.cluster.split("|")[1].split(".")[0].removeprefix("svc").split("-")
        host, address = f"svc{service}.{NS}.mesh", f"10.{1 + int(service) // 250}.{int(service) % 250}.{int(index) + 1}"
        for round_ in range(10):
            want = health_check_pb2.UNHEALTHY if round_ % 2 == 0 else health_check_pb2.HEALTHY
            target.status = want
            sent = time.monotonic()
            target.report()
            await client.wait_for(lambda c, w=want: eds_status(c, host, address) == w, timeout=30)
            delays.append(time.monotonic() - sent)
            await asyncio.sleep(0.5)
        print(
            f"report -> client's EDS: median {statistics.median(delays) * 1000:.0f} ms, "
            f"max {max(delays) * 1000:.0f} ms over {len(delays)} changes"
        )
        for task in tasks:
            task.cancel()
        await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_mesh(root, args.workloads)
        with ServeProcess([root], debounce=0.1) as server:
            asyncio.run(measure(server, args.workloads, args.window))


if __name__ == "__main__":
    main()
