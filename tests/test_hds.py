"""The Health Discovery Service on the real server, driven by a gRPC client speaking as Envoy does.

An HDS stream opens with the node; the server answers with that node's workload's check; the
client then sends reports. What a user relies on: a node hears of its own workload only, its
reports on any other workload change nothing, a checked workload is unhealthy until its Envoy
reports, a report reaches the other proxies as an EDS push alone, and a stream gone longer than
the grace period makes the workload unhealthy.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.service.health.v3 import hds_pb2

from meshctl.registry.model import Health
from meshctl.server.app import Server
from meshctl.server.auth import XdsTls
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

NS = "shop"
HOST = f"api.{NS}.mesh"
CLUSTER = f"outbound|8080||{HOST}"
CLIENT = f"sidecar~10.0.0.9~client.{NS}~{NS}.svc.cluster.local"
METHOD = "/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck"


def node_of(name: str, ip: str) -> str:
    return f"sidecar~{ip}~{name}.{NS}~{NS}.svc.cluster.local"


def entry(name: str, ip: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: {NS}
  annotations: {{proxy.istio.io/health-checks-enabled: "true"}}
spec:
  address: {ip}
  labels: {{app: api}}
"""


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    (tmp_path / "api.yaml").write_text(
        f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8080, name: http, protocol: HTTP, targetPort: 9080}}]
  workloadSelector: {{labels: {{app: api}}}}
---
{entry("api-a", "10.0.0.1")}---
{entry("api-b", "10.0.0.2")}"""
    )
    return tmp_path


class HdsStream:
    """One HDS stream as Envoy opens it: the node first, then reports when told to."""

    def __init__(
        self, server: Server, node_id: str, *, channel: grpc.aio.Channel | None = None, group: str = ""
    ) -> None:
        self._channel = channel or grpc.aio.insecure_channel(f"127.0.0.1:{server.xds_port}")
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        request = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
        request.health_check_request.node.id = node_id
        if group:
            request.health_check_request.node.metadata.update({"AUTO_REGISTER_GROUP": group})
        self._outbox.put_nowait(request)
        call = self._channel.stream_stream(
            METHOD,
            request_serializer=hds_pb2.HealthCheckRequestOrEndpointHealthResponse.SerializeToString,
            response_deserializer=hds_pb2.HealthCheckSpecifier.FromString,
        )
        self.call = call(self._requests())

    async def _requests(self) -> AsyncIterator[Any]:
        while True:
            yield await self._outbox.get()

    async def specifier(self) -> hds_pb2.HealthCheckSpecifier:
        return await asyncio.wait_for(self.call.read(), 10)

    def report(self, cluster: str, port: int, status: int) -> None:
        message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
        health = message.endpoint_health_response.cluster_endpoints_health.add(cluster_name=cluster)
        endpoint = health.locality_endpoints_health.add().endpoints_health.add(health_status=status)
        endpoint.endpoint.address.socket_address.address = "127.0.0.1"
        endpoint.endpoint.address.socket_address.port_value = port
        self._outbox.put_nowait(message)

    async def close(self) -> None:
        self.call.cancel()
        await self._channel.close()


def health_of(server: Server) -> dict[str, tuple[Health, str]]:
    snapshot = server.discovery.snapshot
    assert snapshot is not None
    return {ep.name: (ep.health, ep.health_reason) for ep in snapshot.services.endpoints_of(HOST)}


def eds_health(client: AdsClient) -> dict[str, int]:
    cla = client.resources[types.ENDPOINT].get(CLUSTER)
    return {
        e.endpoint.address.socket_address.address: e.health_status
        for group in getattr(cla, "endpoints", [])
        for e in group.lb_endpoints
    }


async def until(condition: Any, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


def test_a_node_hears_of_and_reports_on_its_own_workload_only(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", CLIENT) as client:
            await client.wait_for(lambda c: c.complete() and CLUSTER in c.names(types.ENDPOINT))
            # Checked, not reported yet: unhealthy, in the registry and in EDS, as Istio has a
            # health-checked WorkloadEntry before its first probe passes.
            assert health_of(server)["api-a"][0] is Health.UNHEALTHY
            assert "not reported" in health_of(server)["api-a"][1]
            assert set(eds_health(client).values()) == {health_check_pb2.UNHEALTHY}

            hds = HdsStream(server, node_of("api-a", "10.0.0.1"))
            try:
                spec = await hds.specifier()
                (check,) = spec.cluster_health_checks
                assert check.cluster_name == f"health|api-a.{NS}"
                (endpoint,) = check.locality_endpoints[0].endpoints
                assert (endpoint.address.socket_address.address, endpoint.address.socket_address.port_value) == (
                    "127.0.0.1",
                    9080,
                )
                (hc,) = check.health_checks
                assert hc.HasField("tcp_health_check")
                assert (hc.interval.seconds, hc.timeout.seconds, hc.unhealthy_threshold.value) == (10, 1, 3)
                assert hc.no_traffic_interval == hc.interval

                # A report on another workload's cluster changes nothing; one on its own does.
                seen = len(client.log)
                hds.report(f"health|api-b.{NS}", 9080, health_check_pb2.HEALTHY)
                hds.report(f"health|api-a.{NS}", 9080, health_check_pb2.HEALTHY)
                await until(lambda: health_of(server)["api-a"][0] is Health.HEALTHY, "api-a healthy")
                await client.wait_for(lambda c: eds_health(c).get("10.0.0.1") == health_check_pb2.HEALTHY)
                assert health_of(server)["api-b"][0] is Health.UNHEALTHY
                assert eds_health(client)["10.0.0.2"] == health_check_pb2.UNHEALTHY
                await asyncio.sleep(0.3)
                assert {r.type_url for r in client.log[seen:]} == {types.ENDPOINT}

                hds.report(f"health|api-a.{NS}", 9080, health_check_pb2.TIMEOUT)
                await until(lambda: health_of(server)["api-a"][0] is Health.UNHEALTHY, "api-a unhealthy")
                assert "9080 timing out" in health_of(server)["api-a"][1]
            finally:
                await hds.close()

    run(test)


def test_a_stream_gone_longer_than_the_grace_makes_its_workload_unhealthy(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh, health_grace=0.5) as server:
            hds = HdsStream(server, node_of("api-a", "10.0.0.1"))
            await hds.specifier()
            hds.report(f"health|api-a.{NS}", 9080, health_check_pb2.HEALTHY)
            await until(lambda: health_of(server)["api-a"][0] is Health.HEALTHY, "api-a healthy")
            await hds.close()
            await until(lambda: health_of(server)["api-a"][0] is Health.UNHEALTHY, "api-a unhealthy after the grace")
            assert "stream gone since" in health_of(server)["api-a"][1]

            # Back, it stays unhealthy until it reports again.
            hds = HdsStream(server, node_of("api-a", "10.0.0.1"))
            try:
                await hds.specifier()
                await asyncio.sleep(0.3)
                assert health_of(server)["api-a"][0] is Health.UNHEALTHY
                hds.report(f"health|api-a.{NS}", 9080, health_check_pb2.HEALTHY)
                await until(lambda: health_of(server)["api-a"][0] is Health.HEALTHY, "api-a healthy again")
            finally:
                await hds.close()

    run(test)


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _issue(directory: Path, name: str, sans: str) -> tuple[Path, Path]:
    """A leaf certificate signed by the directory's `ca`, with `sans` as openssl writes them."""
    cert, key, csr, ext = (directory / f"{name}.{x}" for x in ("pem", "key", "csr", "ext"))
    ext.write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", directory / "ca.pem", "-CAkey", directory / "ca.key",
             "-out", cert, "-days", "2", "-set_serial", "7", "-extfile", ext)  # fmt: skip
    return cert, key


def test_a_vm_registers_into_its_group_only_with_the_groups_service_account(mesh: Path, tmp_path: Path) -> None:
    """With client certificates, a VM registering into a group must present the group's service
    account in its namespace; once registered its entry is an endpoint with the group's labels,
    and it is removed once its stream has been gone for the grace period."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make certificates")
    (mesh / "group.yaml").write_text(
        f"apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {{name: api-vm, namespace: {NS}}}\n"
        "spec:\n  metadata: {labels: {app: api, track: vm}}\n  template: {serviceAccount: api}\n"
    )
    pki = tmp_path / "pki"
    pki.mkdir()
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", pki / "ca.key", "-out", pki / "ca.pem", "-days", "2", "-subj", "/CN=ca",
             "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    server_pair = _issue(pki, "server", "IP:127.0.0.1")
    right = _issue(pki, "right", f"URI:spiffe://cluster.local/ns/{NS}/sa/api")
    wrong = _issue(pki, "wrong", f"URI:spiffe://cluster.local/ns/{NS}/sa/billing")
    node = node_of("api-vm", "10.0.0.7")

    def channel(server: Server, pair: tuple[Path, Path]) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(), pair[1].read_bytes(), pair[0].read_bytes()
        )
        return grpc.aio.secure_channel(f"127.0.0.1:{server.xds_port}", credentials)

    def registered(server: Server) -> dict[str, Any]:
        snapshot = server.discovery.snapshot
        assert snapshot is not None
        return {ep.name: dict(ep.labels) for ep in snapshot.services.endpoints_of(HOST)}

    async def test() -> None:
        tls = XdsTls(server_pair[0], server_pair[1], pki / "ca.pem")
        async with serving(mesh, tls=tls, health_grace=0.5) as server:
            refused = HdsStream(server, node, channel=channel(server, wrong), group="api-vm")
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused.specifier()
            assert error.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "sa/api" in (error.value.details() or "")
            await refused.close()
            assert "api-vm-10.0.0.7" not in registered(server)

            hds = HdsStream(server, node, channel=channel(server, right), group="api-vm")
            try:
                await hds.specifier()
                await until(lambda: "api-vm-10.0.0.7" in registered(server), "the VM registered")
                assert registered(server)["api-vm-10.0.0.7"] == {"app": "api", "track": "vm"}
            finally:
                await hds.close()
            await until(lambda: "api-vm-10.0.0.7" not in registered(server), "the VM removed after the grace")

    run(test)


def _host_address() -> str | None:
    """An IPv4 address of this host other than loopback (none in a bare sandbox)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the kernel picks the source
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_vm_that_gives_no_ip_registers_at_the_address_it_connects_from(mesh: Path) -> None:
    """`meshctl bootstrap --group` without `--ip` (0.0.0.0 in the node id): the VM is registered
    at the peer address of its health stream, and its ADS stream binds to that entry; from
    loopback, which names no VM, it is refused with a line saying to give --ip."""
    (mesh / "group.yaml").write_text(
        f"apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {{name: api-vm, namespace: {NS}}}\n"
        "spec:\n  metadata: {labels: {app: api, track: vm}}\n  template: {serviceAccount: api}\n"
    )
    node = node_of("api-vm", "0.0.0.0")

    async def test() -> None:
        async with serving(mesh, xds_address="0.0.0.0:0", health_grace=0.5) as server:
            refused = HdsStream(server, node, group="api-vm")
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused.specifier()
            assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "connects from 127.0.0.1, which is no VM's address: give --ip" in (error.value.details() or "")
            await refused.close()

            address = _host_address()
            if address is None:
                pytest.skip("this host has no address beyond loopback to connect from")
            name = f"api-vm-{address}"
            channel = grpc.aio.insecure_channel(f"{address}:{server.xds_port}")
            hds = HdsStream(server, node, channel=channel, group="api-vm")
            try:
                await hds.specifier()
                await until(lambda: name in health_of(server), "the VM registered at its peer address")
                snapshot = server.discovery.snapshot
                assert snapshot is not None
                (ep,) = [e for e in snapshot.services.endpoints_of(HOST) if e.name == name]
                assert ep.address == address
                target = f"{address}:{server.xds_port}"
                async with AdsClient(target, node, metadata={"AUTO_REGISTER_GROUP": "api-vm"}) as ads:
                    await ads.wait_for(lambda c: bool(c.resources[types.CLUSTER]))
                    (stream,) = [s for s in server.ads.streams.values() if s.connection.node_id == node]
                    assert stream.proxy is not None and stream.proxy.workload == f"{NS}/{name}"
            finally:
                await hds.close()

    run(test)
