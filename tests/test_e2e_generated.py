"""End to end without the server: the config `generate` produces, run by a real Envoy, routes real HTTP.

One mesh holds every feature under its own host, all on one HTTP service port, so a single Envoy
started from a static bootstrap (snapshot_from_yaml -> proxy_for -> generate -> bootstrap, the
same generators the server runs) serves the whole file. The client is a sidecar with no
WorkloadEntry of its own (`127.0.0.9`), so Envoy has only outbound listeners, bound on
127.0.0.1:PORT as on a VM without iptables, and every request names its service in `Host`.

Backends (meshctl.testing.backends) are small HTTP servers on their own loopback addresses
(127.0.0.x, as each VM has its own) on ports the kernel picks, wired in through WorkloadEntry
`ports`; each names itself in an `x-backend` header, counts what it is sent, and can be told to
fail or to answer slowly. DNS services name their endpoint `localhost`, for Envoy to resolve.
gRPC timeouts need a gRPC backend and a GRPC service port, so two gRPC services share a second
port.

Nothing sleeps a fixed time: Envoy is waited for with a deadline, and the split is checked
against binomial bounds that a correct config misses about once in a billion runs.
"""

from __future__ import annotations

import http.client
import math
import re
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

import grpc
import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy, wait_for

from meshctl.testing import backends
from meshctl.testing.backends import BACKEND_HEADER, Backend, Reply
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

NS = "e2e"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
#: The VirtualService timeout of `slow`, and how long its backend takes (long enough to be sure).
TIMEOUT_SECONDS = 0.5
SLOW_SECONDS = 5.0


# -- backends -----------------------------------------------------------------------------------


class GrpcBackend:
    """A gRPC server on `address` (a port the kernel picks) whose one method sleeps for the
    seconds it is sent, then answers with the deadline it was given: `deadline SECONDS`, or
    `none` without one."""

    METHOD = "/e2e.Sleeper/Sleep"

    def __init__(self, address: str) -> None:
        self.address = address
        self._server = grpc.server(ThreadPoolExecutor(4))
        handler = grpc.unary_unary_rpc_method_handler(self._sleep)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("e2e.Sleeper", {"Sleep": handler})])
        self.port: int = self._server.add_insecure_port(f"{address}:0")

    @staticmethod
    def _sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        time.sleep(float(request.decode()))
        # Without a deadline grpcio reports one about 292 years away.
        return b"none" if remaining is None or remaining > 1e6 else f"deadline {remaining:.1f}".encode()

    def __enter__(self) -> GrpcBackend:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0)


def grpc_call(port: int, host: str, seconds: float, deadline: float | None = None) -> tuple[str, float]:
    """One unary call through Envoy's listener on `port`, authority `host`: the answer, or the
    status code's name, and how long it took."""
    options = [("grpc.default_authority", host)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        start = time.monotonic()
        try:
            answer = channel.unary_unary(GrpcBackend.METHOD)(str(seconds).encode(), timeout=deadline).decode()
        except grpc.RpcError as exc:
            answer = exc.code().name
        return answer, time.monotonic() - start


def send(
    port: int, host: str, path: str = "/", headers: dict[str, str] | None = None, address: str = "127.0.0.1"
) -> Reply:
    """One GET through Envoy's outbound listener on its own connection, `Host` naming the service,
    waited for as long as anything in these tests."""
    return backends.send(port, host, path=path, headers=headers, address=address, timeout=DEADLINE)


# -- the mesh -----------------------------------------------------------------------------------

#: name -> (address, version label, seconds each answer takes)
BACKENDS = {
    "split-v1": ("127.0.0.21", "v1", 0.0),
    "split-v2": ("127.0.0.22", "v2", 0.0),
    "plain": ("127.0.0.23", "v1", 0.0),
    "retry": ("127.0.0.24", "v1", 0.0),
    "noretry": ("127.0.0.25", "v1", 0.0),
    "slow": ("127.0.0.26", "v1", SLOW_SECONDS),
    "dns": ("127.0.0.1", "v1", 0.0),
    "norules": ("127.0.0.28", "v1", 0.0),
    "routed": ("127.0.0.29", "v1", 0.0),
}
#: service -> the backends that are its endpoints (`app` label = service name)
SERVICES = {
    "split": ["split-v1", "split-v2"],
    "redirect": ["plain"],
    "fault": ["plain"],
    "retry": ["retry"],
    "noretry": ["noretry"],
    "slow": ["slow"],
    # No VirtualService: the default route (BuildDefaultHTTPOutboundRoute).
    "norules": ["norules"],
    # A VirtualService route without `retries`.
    "routed": ["routed"],
}


#: DNS services (resolution -> service), their one endpoint named `localhost`: the `dns` backend
DNS_SERVICES = {"DNS": "strict-dns", "DNS_ROUND_ROBIN": "logical-dns"}
#: gRPC services, all served by one gRPC backend on GRPC_ADDRESS: service -> VirtualService timeout
GRPC_SERVICES = {"grpc": None, "grpc-timeout": TIMEOUT_SECONDS}
GRPC_ADDRESS = "127.0.0.27"


def host(service: str) -> str:
    return f"{service}.{NS}.mesh"


def grpc_yaml(port: int, backend: GrpcBackend) -> list[str]:
    docs = []
    for service, timeout in GRPC_SERVICES.items():
        docs.append(f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {service}, namespace: {NS}}}
spec:
  hosts: [{host(service)}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: grpc, protocol: GRPC}}]
  workloadSelector: {{labels: {{app: {service}}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {service}, namespace: {NS}}}
spec:
  address: {backend.address}
  ports: {{grpc: {backend.port}}}
  labels: {{app: {service}}}
""")
        if timeout is not None:
            docs.append(f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {service}, namespace: {NS}}}
spec:
  hosts: [{host(service)}]
  http:
  - timeout: {int(timeout * 1000)}ms
    route: [{{destination: {{host: {host(service)}}}}}]
""")
    return docs


def mesh_yaml(port: int, backends: dict[str, Backend], grpc_port: int, grpc_backend: GrpcBackend) -> str:
    """Every HTTP service on `port` and gRPC service on `grpc_port`, their endpoints, and one
    VirtualService per feature."""
    docs = grpc_yaml(grpc_port, grpc_backend)
    for resolution, service in DNS_SERVICES.items():
        docs.append(f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {service}, namespace: {NS}}}
spec:
  hosts: [{host(service)}]
  location: MESH_EXTERNAL
  resolution: {resolution}
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  endpoints: [{{address: localhost, ports: {{http: {backends["dns"].port}}}}}]
""")
    for service, members in SERVICES.items():
        docs.append(f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {service}, namespace: {NS}}}
spec:
  hosts: [{host(service)}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: {service}}}}}
""")
        for member in members:
            b = backends[member]
            version = BACKENDS[member][1]
            docs.append(f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {service}-{member}, namespace: {NS}}}
spec:
  address: {b.host}
  ports: {{http: {b.port}}}
  labels: {{app: {service}, version: {version}}}
""")
    docs.append(f"""apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: split, namespace: {NS}}}
spec:
  host: {host("split")}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: split, namespace: {NS}}}
spec:
  hosts: [{host("split")}]
  http:
  - name: canary
    match: [{{headers: {{x-canary: {{exact: "yes"}}}}}}]
    route: [{{destination: {{host: {host("split")}, subset: v2}}}}]
  - name: split
    route:
    - {{destination: {{host: {host("split")}, subset: v1}}, weight: 80}}
    - {{destination: {{host: {host("split")}, subset: v2}}, weight: 20}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: redirect, namespace: {NS}}}
spec:
  hosts: [{host("redirect")}]
  http:
  - name: moved
    match: [{{uri: {{exact: /old}}}}]
    redirect: {{uri: /new, authority: www.example.com, redirectCode: 302}}
  - route: [{{destination: {{host: {host("redirect")}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: fault, namespace: {NS}}}
spec:
  hosts: [{host("fault")}]
  http:
  - fault: {{abort: {{httpStatus: 418, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: {host("fault")}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: retry, namespace: {NS}}}
spec:
  hosts: [{host("retry")}]
  http:
  - retries: {{attempts: 3, retryOn: 5xx}}
    route: [{{destination: {{host: {host("retry")}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: noretry, namespace: {NS}}}
spec:
  hosts: [{host("noretry")}]
  http:
  - retries: {{attempts: 0}}
    route: [{{destination: {{host: {host("noretry")}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: slow, namespace: {NS}}}
spec:
  hosts: [{host("slow")}]
  http:
  - timeout: {int(TIMEOUT_SECONDS * 1000)}ms
    route: [{{destination: {{host: {host("slow")}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: routed, namespace: {NS}}}
spec:
  hosts: [{host("routed")}]
  http:
  - route: [{{destination: {{host: {host("routed")}}}}}]
""")
    return "---\n".join(docs)


@dataclass
class Mesh:
    port: int
    envoy: EnvoyProcess
    backends: dict[str, Backend]
    grpc_port: int

    def grpc(self, service: str, seconds: float, deadline: float | None = None) -> tuple[str, float]:
        return grpc_call(self.grpc_port, host(service), seconds, deadline)

    def send(self, service: str, path: str = "/", headers: dict[str, str] | None = None) -> Reply:
        return send(self.port, host(service), path, headers)

    def answers(self, service: str, count: int, headers: dict[str, str] | None = None) -> Counter[str]:
        """Who answered `count` requests; a failed one counts as `status:NNN`."""
        out: Counter[str] = Counter()
        for _ in range(count):
            reply = self.send(service, headers=headers)
            out[reply.backend if reply.status == 200 else f"status:{reply.status}"] += 1
        return out


def wait_until_routing(port: int, service: str, address: str = "127.0.0.1") -> None:
    """Envoy reports LIVE before its listener takes connections on a loaded machine; wait for a 200."""
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        reply = send(port, host(service), address=address)
        if reply.status == 200:
            return
        last = reply
        time.sleep(0.05)
    raise AssertionError(f"Envoy did not route to {service} within {DEADLINE:.0f}s: {last!r}")


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    with ExitStack() as stack:
        backends = {
            name: stack.enter_context(Backend(name, address, delay=delay))
            for name, (address, _, delay) in BACKENDS.items()
        }
        grpc_backend = stack.enter_context(GrpcBackend(GRPC_ADDRESS))
        port, grpc_port = free_port(), free_port()
        snapshot = snapshot_from_yaml(mesh_yaml(port, backends, grpc_port, grpc_backend), namespace=NS)
        resources = generate(snapshot, proxy_for(snapshot, CLIENT))
        envoy = stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=CLIENT)))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        wait_until_routing(port, "redirect")
        yield Mesh(port, envoy, backends, grpc_port)


# -- the tests ----------------------------------------------------------------------------------


def test_header_match_routes_to_the_subset(mesh: Mesh) -> None:
    assert mesh.answers("split", 30, {"x-canary": "yes"}) == Counter({"split-v2": 30})
    # The header's value must match exactly; anything else falls through to the split.
    assert set(mesh.answers("split", 30, {"x-canary": "no"})) <= {"split-v1", "split-v2"}


def binomial_bounds(n: int, p: float, sigmas: float = 6.0) -> tuple[int, int]:
    """Counts a correct split of n requests at probability p stays within, but for about one run
    in a billion (six standard deviations of the normal approximation)."""
    spread = sigmas * math.sqrt(n * p * (1 - p))
    return math.floor(n * p - spread), math.ceil(n * p + spread)


def test_weighted_split_is_within_binomial_bounds(mesh: Mesh) -> None:
    n = 400
    counts = mesh.answers("split", n)
    assert set(counts) <= {"split-v1", "split-v2"}, counts
    low, high = binomial_bounds(n, 0.2)
    # 80 expected; 6 sigma is 48: a 50/50 or 100/0 split is far outside, a 20/80 one too.
    assert low <= counts["split-v2"] <= high, (counts, (low, high))
    assert counts["split-v1"] + counts["split-v2"] == n


def test_redirect(mesh: Mesh) -> None:
    reply = mesh.send("redirect", "/old")
    assert reply.status == 302
    assert reply.headers["location"] == "http://www.example.com/new"
    assert reply.backend == ""
    # Other paths reach the backend.
    assert mesh.send("redirect", "/other").backend == "plain"


def test_fault_abort(mesh: Mesh) -> None:
    replies = [mesh.send("fault") for _ in range(20)]
    assert [r.status for r in replies] == [418] * 20
    assert all(r.backend == "" for r in replies)


def test_retry_on_503_reaches_the_client_as_200(mesh: Mesh) -> None:
    """retry.ConvertPolicy: `retries: {attempts: 3, retryOn: 5xx}` retries the backend's 503."""
    backend = mesh.backends["retry"]
    backend.reset()
    backend.fail_next(1)
    reply = mesh.send("retry")
    assert (reply.status, reply.backend) == (200, "retry")
    assert backend.served == 2


def test_attempts_zero_disables_retries(mesh: Mesh) -> None:
    backend = mesh.backends["noretry"]
    backend.reset()
    backend.fail_next(1)
    reply = mesh.send("noretry")
    assert (reply.status, reply.backend) == (503, "noretry")
    assert backend.served == 1
    # The failure was the backend's own, once: the next request succeeds.
    assert mesh.send("noretry").status == 200


@pytest.mark.parametrize("service", ["norules", "routed"])
def test_a_503_without_retries_reaches_the_caller(mesh: Mesh, service: str) -> None:
    """retry.DefaultPolicy retries connection failures only (EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY):
    a backend's 503, on the default route (BuildDefaultHTTPOutboundRoute) or a VirtualService
    route without `retries`, is the caller's answer and the backend is asked once."""
    backend = mesh.backends[service]
    backend.reset()
    backend.fail_next(1)
    reply = mesh.send(service)
    assert (reply.status, reply.backend) == (503, service)
    assert backend.served == 1
    assert mesh.send(service).status == 200


def test_host_header_with_any_port_routes(mesh: Mesh) -> None:
    """buildSidecarOutboundHTTPRouteConfig sets IgnorePortInHostMatching: a Host naming another
    port (gRPC clients always send one; a client may reach the service on another port) and the
    absolute FQDN (EnableAbsoluteFqdnVhostDomain) reach the service's virtual host."""
    for authority in (f"{host('norules')}:12345", f"{host('norules')}:{mesh.port}", f"{host('norules')}."):
        reply = send(mesh.port, authority)
        assert (reply.status, reply.backend) == (200, "norules"), authority
    # A VirtualService host too.
    assert send(mesh.port, f"{host('split')}:12345", headers={"x-canary": "yes"}).backend == "split-v2"


def test_expect_100_continue_reaches_the_upstream(mesh: Mesh) -> None:
    """Istio's HCM sets proxy_100_continue (features.Enable100ContinueHeaders): the upstream gets
    `Expect: 100-continue` and answers it, where Envoy would answer 100 itself and strip it."""
    backend = mesh.backends["norules"]
    backend.reset()
    conn = http.client.HTTPConnection("127.0.0.1", mesh.port, timeout=DEADLINE)
    try:
        body = b"hello"
        conn.request(
            "POST",
            "/upload",
            body=body,
            headers={"Host": host("norules"), "Expect": "100-continue", "Content-Length": str(len(body))},
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()
    assert backend.last_headers.get("expect") == "100-continue"


def test_timeout(mesh: Mesh) -> None:
    backend = mesh.backends["slow"]
    backend.reset()
    reply = mesh.send("slow")
    # Envoy's own answer (the backend would have said 200 with its name): the route timed out.
    assert (reply.status, reply.backend) == (504, "")
    assert reply.body.strip() == "upstream request timeout"
    # The request did reach the backend, once: Istio's default retries do not retry a timeout.
    wait_for(lambda: backend.served > 0, "the slow backend to see the request")
    assert backend.served == 1


@pytest.mark.parametrize("service", DNS_SERVICES.values())
def test_dns_services_resolve_their_endpoints(mesh: Mesh, service: str) -> None:
    """STRICT_DNS and LOGICAL_DNS clusters, on Envoy's DNS cluster extension, resolve names."""
    wait_for(lambda: mesh.send(service).status == 200, f"{service} to resolve localhost")
    assert mesh.send(service).backend == "dns"


def test_grpc_timeout(mesh: Mesh) -> None:
    """A VirtualService timeout ends gRPC calls too, whether or not the caller set a longer
    deadline (the route's own `timeout`; a `max_stream_duration` on the route would switch it
    off for every request); a caller's shorter deadline ends the call first."""
    for deadline in (None, DEADLINE):
        answer, took = mesh.grpc("grpc-timeout", SLOW_SECONDS, deadline)
        # Envoy's "upstream request timeout" is UNAVAILABLE; a server told of the timeout in its
        # `grpc-timeout` (as Istio's deprecated max_grpc_timeout did) answers DEADLINE_EXCEEDED.
        assert answer in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), deadline
        assert TIMEOUT_SECONDS * 0.9 <= took < SLOW_SECONDS, deadline
    answer, took = mesh.grpc("grpc-timeout", SLOW_SECONDS, TIMEOUT_SECONDS / 5)
    assert answer == "DEADLINE_EXCEEDED" and took < TIMEOUT_SECONDS


def test_grpc_without_a_timeout_passes_the_callers_deadline_on(mesh: Mesh) -> None:
    """No VirtualService timeout: none from Envoy either, and the caller's `grpc-timeout` reaches
    the server unchanged (Istio's `max_grpc_timeout: 0s`)."""
    assert mesh.grpc("grpc", 0.0)[0] == "none"
    answer, _ = mesh.grpc("grpc", 0.0, DEADLINE)
    # The header carries the deadline in whole units, so it may round up by a little.
    assert answer.startswith("deadline ") and DEADLINE - 5 < float(answer.split()[1]) < DEADLINE + 1
    answer, took = mesh.grpc("grpc", 2 * TIMEOUT_SECONDS, 4 * TIMEOUT_SECONDS)
    assert answer.startswith("deadline ") and took >= 2 * TIMEOUT_SECONDS


# -- protocol sniffing: a service port without a protocol -----------------------------------------

SNIFFED_BACKENDS = {"sniffed-v1": ("127.0.0.31", "v1"), "sniffed-v2": ("127.0.0.32", "v2")}
HTTP_REQUEST_LINE = re.compile(rb"^[A-Z]+ \S+ HTTP/1\.[01]\r?\n$")


class LineOrHttpBackend:
    """A TCP server on `address` that answers an HTTP/1.1 request with its name (in `x-backend`
    and the body) and echoes any other line back as is; `http_requests` and `echoed` count each."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address
        self.http_requests = 0
        self.echoed = 0
        backend = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while line := self.rfile.readline():
                    if not HTTP_REQUEST_LINE.match(line):
                        backend.echoed += 1
                        self.wfile.write(line)
                        continue
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # headers; Envoy sends GETs without a body
                    backend.http_requests += 1
                    body = f"{backend.name}\n".encode()
                    head = f"HTTP/1.1 200 OK\r\n{BACKEND_HEADER}: {backend.name}\r\nContent-Length: {len(body)}\r\n\r\n"
                    self.wfile.write(head.encode() + body)

        self._server = socketserver.ThreadingTCPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"backend-{name}", daemon=True
        )

    def __enter__(self) -> LineOrHttpBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def sniffed_yaml(port: int, backends: dict[str, LineOrHttpBackend]) -> str:
    """`sniffed` on `port` named `web` with no protocol: Istio sniffs HTTP on it."""
    docs = [
        f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: sniffed, namespace: {NS}}}
spec:
  hosts: [{host("sniffed")}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: web}}]
  workloadSelector: {{labels: {{app: sniffed}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: sniffed, namespace: {NS}}}
spec:
  host: {host("sniffed")}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: sniffed, namespace: {NS}}}
spec:
  hosts: [{host("sniffed")}]
  http:
  - match: [{{headers: {{x-canary: {{exact: "yes"}}}}}}]
    route: [{{destination: {{host: {host("sniffed")}, subset: v2}}}}]
  - route: [{{destination: {{host: {host("sniffed")}, subset: v1}}}}]
"""
    ]
    for name, (_, version) in SNIFFED_BACKENDS.items():
        docs.append(f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: {NS}}}
spec:
  address: {backends[name].address}
  ports: {{web: {backends[name].port}}}
  labels: {{app: sniffed, version: {version}}}
""")
    return "---\n".join(docs)


@dataclass
class SniffedMesh:
    port: int
    backends: dict[str, LineOrHttpBackend]
    #: The host's own loopback address, where the proxy listens for it (a TCP-level port)
    address: str


@pytest.fixture(scope="module")
def sniffed() -> Iterator[SniffedMesh]:
    with ExitStack() as stack:
        backends = {
            name: stack.enter_context(LineOrHttpBackend(name, address))
            for name, (address, _) in SNIFFED_BACKENDS.items()
        }
        port = free_port()
        snapshot = snapshot_from_yaml(sniffed_yaml(port, backends), namespace=NS)
        resources = generate(snapshot, proxy_for(snapshot, CLIENT))
        envoy = stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=CLIENT)))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        address = snapshot.index.loopback[host("sniffed")]
        wait_until_routing(port, "sniffed", address)
        yield SniffedMesh(port, backends, address)


def test_sniffed_port_applies_http_rules(sniffed: SniffedMesh) -> None:
    """HTTP on a port without a protocol goes through the HCM: the VirtualService's header match
    picks v2, its default route v1 (a plain TCP proxy would spread both over the two)."""
    for _ in range(10):
        canary = send(sniffed.port, host("sniffed"), headers={"x-canary": "yes"}, address=sniffed.address)
        assert canary.backend == "sniffed-v2"
        assert send(sniffed.port, host("sniffed"), address=sniffed.address).backend == "sniffed-v1"


def test_sniffed_port_still_carries_raw_tcp(sniffed: SniffedMesh) -> None:
    """Bytes the HTTP inspector does not take for HTTP go to the tcp_proxy chain, to either
    endpoint, and come back echoed; a second line on the same connection too."""
    before = sum(b.echoed for b in sniffed.backends.values())
    with socket.create_connection((sniffed.address, sniffed.port), timeout=DEADLINE) as conn:
        reader = conn.makefile("rb")
        for text in (b"hello through a sniffed port\n", b"and another line\n"):
            conn.sendall(text)
            assert reader.readline() == text
    assert sum(b.echoed for b in sniffed.backends.values()) == before + 2
