"""A GRPCRoute through a real Envoy gateway, against the same routing as an Istio
VirtualService: a method match sends SayHello to greeter-v2, the rest of the service to
greeter-v1; gRPC clients get the same answers from both gateways."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import grpc
import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy

from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

NS = "edge"
HOST = "grpc.example.com"
ROUTER = f"router~127.0.0.30~ingress-vm.{NS}~{NS}.svc.cluster.local"
SERVICE = "helloworld.Greeter"


def greeter(name: str, address: str) -> tuple[grpc.Server, int]:
    """A gRPC server of `helloworld.Greeter` whose every method answers `NAME:METHOD`."""

    def answer(method: str) -> Callable[[bytes, Any], bytes]:
        return lambda request, context: f"{name}:{method}".encode()

    handlers = {m: grpc.unary_unary_rpc_method_handler(answer(m)) for m in ("SayHello", "SayBye")}
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(f"{address}:0")
    server.start()
    return server, port


def services(v1: int, v2: int) -> str:
    def entry(name: str, address: str, port: int) -> str:
        return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {NS}}}
spec:
  hosts: [{name}.{NS}.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 50051, name: grpc, protocol: GRPC}}]
  endpoints: [{{address: {address}, ports: {{grpc: {port}}}}}]
---
"""

    return (
        entry("greeter-v1", "127.0.0.41", v1)
        + entry("greeter-v2", "127.0.0.42", v2)
        + f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: ingress-vm, namespace: {NS}}}
spec:
  address: 127.0.0.30
  labels: {{gateway.networking.k8s.io/gateway-name: ingress}}
---
"""
    )


def gateway_api(port: int) -> str:
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  gatewayClassName: istio
  listeners: [{{name: grpc, port: {port}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: greeter, namespace: {NS}}}
spec:
  parentRefs: [{{name: ingress}}]
  hostnames: [{HOST}]
  rules:
  - matches: [{{method: {{service: {SERVICE}, method: SayHello}}}}]
    backendRefs: [{{name: greeter-v2, port: 50051}}]
  - matches: [{{method: {{service: {SERVICE}}}}}]
    backendRefs: [{{name: greeter-v1, port: 50051}}]
"""


def istio(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  selector: {{gateway.networking.k8s.io/gateway-name: ingress}}
  servers: [{{port: {{number: {port}, name: grpc, protocol: HTTP}}, hosts: ["{NS}/*"]}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: greeter, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  gateways: [ingress]
  http:
  - match: [{{uri: {{exact: /{SERVICE}/SayHello}}}}]
    route: [{{destination: {{host: greeter-v2.{NS}.svc.cluster.local, port: {{number: 50051}}}}}}]
  - match: [{{uri: {{prefix: /{SERVICE}/}}}}]
    route: [{{destination: {{host: greeter-v1.{NS}.svc.cluster.local, port: {{number: 50051}}}}}}]
"""


def call(port: int, method: str) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.default_authority", HOST)]) as channel:
        stub = channel.unary_unary(f"/{SERVICE}/{method}")
        reply: bytes = stub(b"", timeout=DEADLINE, wait_for_ready=True)
        return reply.decode()


@pytest.fixture(scope="module")
def gateways() -> Iterator[tuple[int, int]]:
    with ExitStack() as stack:
        ports = []
        for name, address in (("greeter-v1", "127.0.0.41"), ("greeter-v2", "127.0.0.42")):
            server, port = greeter(name, address)
            stack.callback(server.stop, None)
            ports.append(port)
        listen = []
        for make in (gateway_api, istio):
            port = free_port()
            snapshot = snapshot_from_yaml(services(*ports) + make(port), namespace=NS)
            resources = generate(snapshot, proxy_for(snapshot, ROUTER))
            stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=ROUTER)))
            listen.append(port)
        yield listen[0], listen[1]


def test_a_grpc_route_sends_each_method_where_the_virtual_service_does(gateways: tuple[int, int]) -> None:
    gateway_api_port, istio_port = gateways
    assert call(gateway_api_port, "SayHello") == "greeter-v2:SayHello"
    assert call(gateway_api_port, "SayBye") == "greeter-v1:SayBye"
    for method in ("SayHello", "SayBye"):
        assert call(gateway_api_port, method) == call(istio_port, method)
