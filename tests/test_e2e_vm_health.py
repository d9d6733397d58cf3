"""End to end: VM health checked by each VM's own Envoy over HDS, seen in every proxy's EDS.

Three real Envoys from `meshctl bootstrap` (which gives each an `hds_config`) against `meshctl
serve` (one server, or two replicas sharing a fake Consul): a client VM without a workload of its
own, and two server VMs of one service, `api` v1 and v2, each a WorkloadEntry in a file with
health checks enabled, in a WorkloadGroup whose probe connects to its app every second. Each
app listens on loopback at its own port, where its VM's Envoy probes it; the server VMs'
Sidecars call nothing, so only the client binds the service's outbound port.

What a user sees is asserted: the client Envoy's `/clusters` (the `health_flags` of each host)
and a request loop through it. Nothing waits a fixed time; each step waits for its outcome with
a generous deadline, and the time each transition took is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, RequestLoop
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"api.{NS}.mesh"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
PERIOD, FAILURES = 1, 2
GRACE = 2.0
SESSION_TTL = 1.0


def node_of(version: str) -> str:
    return f"sidecar~127.0.0.1~api-{version}.{NS}~{NS}.svc.cluster.local"


def group_yaml(version: str, port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {{name: api-{version}, namespace: {NS}}}
spec:
  metadata: {{labels: {{app: api, version: {version}}}}}
  template: {{ports: {{http: {port}}}}}
  probe:
    periodSeconds: {PERIOD}
    timeoutSeconds: 1
    failureThreshold: {FAILURES}
    tcpSocket: {{port: {port}}}
"""


def mesh_yaml(service_port: int, app_ports: dict[str, int], groups: dict[str, int]) -> str:
    docs = [
        f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {service_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: api}}}}
""",
        f"""apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: api, namespace: {NS}}}
spec:
  workloadSelector: {{labels: {{app: api}}}}
  egress:
  - hosts: [./nothing.{NS}.mesh]
""",
    ]
    docs.extend(group_yaml(version, port) for version, port in groups.items())
    for version, port in app_ports.items():
        docs.append(group_yaml(version, port))
        docs.append(f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: api-{version}
  namespace: {NS}
  annotations:
    istio.io/autoRegistrationGroup: api-{version}
    proxy.istio.io/health-checks-enabled: "true"
spec:
  address: 127.0.0.1
""")
    return "---\n".join(docs)


def host_flags(envoy: EnvoyProcess, cluster: str) -> dict[str, str]:
    """`/clusters` of `envoy`: each host of `cluster` and its health flags."""
    out: dict[str, str] = {}
    for line in envoy.admin("clusters").splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == cluster and parts[2] == "health_flags":
            out[parts[1]] = parts[3]
    return out


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


class VmMesh:
    """The mesh of the module docstring. With `consul`, two replicas share it: the VMs' Envoys
    (`server`) on replica A, the client's on replica B (`client_server`)."""

    def __init__(self, root: Path, stack: ExitStack, consul: FakeConsul | None = None) -> None:
        self.stack = stack
        self.consul = consul
        self.service_port = free_port()
        self.ports = {"v1": free_port(), "v2": free_port()}
        #: A group without WorkloadEntries: its VM registers itself (`meshctl bootstrap --group`).
        self.group_port = free_port()
        self.cluster = f"outbound|{self.service_port}||{HOST}"
        config = root / "mesh"
        config.mkdir()
        (config / "mesh.yaml").write_text(mesh_yaml(self.service_port, self.ports, {"v3": self.group_port}))
        self.backends = {v: stack.enter_context(Backend(f"api-{v}", "127.0.0.1", p)) for v, p in self.ports.items()}
        args = ["--health-grace", str(GRACE)]
        if consul is not None:  # Consul may drop a dead replica's session after 2 TTLs: 2 s
            args += ["--health-session-ttl", str(SESSION_TTL)]
        address = consul.address if consul is not None else None
        self.server = ServeProcess([config], consul=address, extra_args=args)
        stack.enter_context(self.server)
        stack.callback(lambda: print(f"--- meshctl serve log:\n{self.server.log()[-8000:]}"))
        self.client_server = self.server
        if consul is not None:
            self.client_server = ServeProcess([config], consul=address, extra_args=args)
            stack.enter_context(self.client_server)
            stack.callback(lambda: print(f"--- replica B log:\n{self.client_server.log()[-8000:]}"))
        self.client = self.envoy(CLIENT, server=self.client_server)
        self.vms = {v: self.envoy(node_of(v)) for v in self.ports}

    def envoy(self, node_id: str, *extra_args: str, server: ServeProcess | None = None) -> EnvoyProcess:
        envoy = EnvoyProcess((server or self.server).bootstrap(node_id, extra_args=extra_args))
        self.stack.enter_context(envoy)
        self.stack.callback(lambda: print(f"--- envoy {node_id} log:\n{envoy.log()[-3000:]}"))
        return envoy

    def host(self, version: str) -> str:
        return f"127.0.0.1:{self.ports[version]}"

    def healthy(self, version: str) -> bool:
        return host_flags(self.client, self.cluster).get(self.host(version)) == "healthy"

    def unhealthy(self, version: str) -> bool:
        return "failed_eds_health" in host_flags(self.client, self.cluster).get(self.host(version), "")


def settled_mark(loop: RequestLoop) -> int:
    """A mark in `loop`'s answers from which an endpoint Envoy now shows unhealthy gets none:
    the request in flight when it changed was sent before, and may still come back from it."""
    loop.wait_for_answers(1)
    return loop.mark()


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[VmMesh]:
    with ExitStack() as stack:
        yield VmMesh(tmp_path, stack)


def test_failing_app_and_gone_envoy_leave_every_proxys_load_balancing(mesh: VmMesh) -> None:
    wait_for(lambda: mesh.healthy("v1") and mesh.healthy("v2"), "both VMs healthy in the client's EDS")
    with RequestLoop(mesh.service_port, HOST) as loop:
        loop.wait_for_answers(20)
        assert set(loop.since(0)) == {"api-v1", "api-v2"}

        # The app of v1 stops: its own Envoy's probe fails, and every proxy stops sending it traffic.
        mesh.backends["v1"].stop()
        took = wait_for(lambda: mesh.unhealthy("v1"), "v1 unhealthy in the client's EDS after its app stopped")
        print(f"app stopped -> unhealthy in the client's EDS: {took:.2f}s (budget {PERIOD * FAILURES + 2}s)")
        assert not mesh.unhealthy("v2")
        flagged = time.monotonic()
        mark = settled_mark(loop)
        loop.wait_for_answers(50)
        assert [f for f in loop.failures if f.at > flagged] == []
        assert set(loop.since(mark)) == {"api-v2"}

        # The app comes back: so does its endpoint.
        mesh.stack.enter_context(Backend("api-v1", "127.0.0.1", mesh.ports["v1"]))
        took = wait_for(lambda: mesh.healthy("v1"), "v1 healthy again after its app restarted")
        print(f"app restarted -> healthy in the client's EDS: {took:.2f}s")
        mark = loop.mark()
        wait_for(lambda: "api-v1" in loop.since(mark), "traffic to v1 again")

        # The VM's Envoy dies (the app still answers, but nothing checks it): out after the grace.
        killed = time.monotonic()
        mesh.vms["v1"].stop(check=False)
        wait_for(lambda: mesh.unhealthy("v1"), "v1 unhealthy after its Envoy went away")
        took = time.monotonic() - killed
        print(f"VM's Envoy gone -> unhealthy in the client's EDS: {took:.2f}s (budget {GRACE + 2}s)")
        assert took >= GRACE * 0.9  # within the grace, the last report stands
        mark = settled_mark(loop)
        loop.wait_for_answers(30)
        assert set(loop.since(mark)) == {"api-v2"}

        # It comes back, reports, and is healthy again.
        mesh.vms["v1"] = mesh.envoy(node_of("v1"))
        wait_for(lambda: mesh.healthy("v1"), "v1 healthy again once its Envoy reported")
    log = mesh.server.log()
    assert "workload e2e/api-v1 is UNHEALTHY" in log and "workload e2e/api-v1 is HEALTHY" in log


def test_a_checked_workload_whose_envoy_never_reported_is_unhealthy(mesh: VmMesh) -> None:
    wait_for(lambda: mesh.healthy("v1") and mesh.healthy("v2"), "both VMs healthy in the client's EDS")
    # A server restart forgets every report; v2's Envoy stays away, so v2 is not ready.
    mesh.vms["v2"].stop(check=False)
    mesh.server.restart()
    wait_for(lambda: mesh.healthy("v1") and mesh.unhealthy("v2"), "v2 unhealthy: its Envoy has not reported")
    registryz = mesh.server.admin_json("/debug/registryz")
    endpoints = {
        ep["workload"]: ep for svc in registryz["services"] if svc["hostname"] == HOST for ep in svc["endpoints"]
    }
    assert endpoints[f"{NS}/api-v2"]["health"] == "UNHEALTHY"
    assert "not reported" in endpoints[f"{NS}/api-v2"]["healthReason"]
    assert endpoints[f"{NS}/api-v1"]["health"] == "HEALTHY"

    # `meshctl services --admin` says the same, and why; metrics count the checked endpoints.
    proc = subprocess.run(
        [*meshctl_command(), "services", "--admin", mesh.server.admin_address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (service,) = [s for s in json.loads(proc.stdout)["services"] if s["hostname"] == HOST]
    listed = {ep["name"]: (ep["health"], ep["healthReason"]) for ep in service["endpoints"]}
    assert listed["api-v2"][0] == "UNHEALTHY" and "not reported" in listed["api-v2"][1]
    assert listed["api-v1"] == ("HEALTHY", "tcp probe passing")

    def hds_column() -> dict[str, str]:
        # Exit 1 while a proxy is STALE (just reconnected): the rows are read either way.
        proc = subprocess.run(
            [*meshctl_command(), "proxy-status", "--admin", mesh.server.admin_address, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode in (0, 1), proc.stderr
        return {row["proxy"]: row["HDS"] for row in json.loads(proc.stdout)}

    # v1's Envoy reports over its health stream, and its ADS stream comes back on its own backoff:
    # the row is there once that stream is.
    wait_for(lambda: node_of("v1") in hds_column(), "v1's proxy back on its ADS stream")
    assert hds_column() == {CLIENT: "CONNECTED", node_of("v1"): "HEALTHY"}
    metrics = mesh.server.admin("/metrics")
    assert 'meshctl_health_checked_endpoints{health="healthy"} 1' in metrics
    assert 'meshctl_health_checked_endpoints{health="unhealthy"} 1' in metrics


def test_a_vm_registers_into_its_group_and_leaves_after_the_grace(mesh: VmMesh) -> None:
    """Registered from its bootstrap, kept across a restart of the server, removed after the grace."""
    wait_for(lambda: mesh.healthy("v1") and mesh.healthy("v2"), "both VMs healthy in the client's EDS")
    host = f"127.0.0.1:{mesh.group_port}"
    mesh.stack.enter_context(Backend("api-v3", "127.0.0.1", mesh.group_port))
    vm = mesh.envoy("", "--group", f"api-v3.{NS}", "--ip", "127.0.0.1")
    wait_for(lambda: host_flags(mesh.client, mesh.cluster).get(host) == "healthy", "the registered VM healthy")
    with RequestLoop(mesh.service_port, HOST) as loop:
        wait_for(lambda: "api-v3" in loop.since(0), "traffic to the registered VM")
    proc = subprocess.run(
        [*meshctl_command(), "services", "--admin", mesh.server.admin_address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (service,) = [s for s in json.loads(proc.stdout)["services"] if s["hostname"] == HOST]
    (entry,) = [ep for ep in service["endpoints"] if ep["name"] == "api-v3-127.0.0.1"]
    assert entry["labels"] == {"app": "api", "version": "v3"}
    assert entry["health"] == "HEALTHY"

    # Its Envoy stops, and the server restarts: without Consul the registration was kept in
    # --state-dir, so it is back after the restart, and removed once the grace has passed.
    vm.stop(check=False)
    stopped = time.monotonic()
    mesh.server.restart()
    assert "took back 1 registered workloads" in mesh.server.log().split("--- run 2:", 1)[1]
    wait_for(lambda: host not in host_flags(mesh.client, mesh.cluster), "the VM's endpoint removed")
    took = time.monotonic() - stopped
    print(f"registered VM's Envoy gone (and the server restarted) -> endpoint removed: {took:.2f}s")
    assert took >= GRACE * 0.9
    assert endpoint_of(mesh.server, "api-v3-127.0.0.1") is None
    log = mesh.server.log().split("--- run 2:", 1)[1]
    assert f"removed workload {NS}/api-v3-127.0.0.1: its Envoy has been gone for {GRACE:g}s" in log


def ready_body(server: ServeProcess) -> str:
    """`/ready`'s body, whatever its status (503 while not ready)."""
    try:
        return server.admin("/ready")
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def endpoint_of(server: ServeProcess, workload: str) -> dict[str, str] | None:
    """The endpoint of `workload` in `server`'s /debug/registryz, if it has one."""
    registryz = server.admin_json("/debug/registryz")
    found = [ep for svc in registryz["services"] if svc["hostname"] == HOST for ep in svc["endpoints"]]
    return next((ep for ep in found if ep["workload"] == f"{NS}/{workload}"), None)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[VmMesh]:
    with ExitStack() as stack:
        consul = stack.enter_context(FakeConsul(session_ttl_min=SESSION_TTL))
        yield VmMesh(tmp_path, stack, consul)


def test_replicas_share_health_and_registrations_through_consul(replicas: VmMesh) -> None:
    """The VMs' Envoys on replica A, the client's on replica B: B's EDS follows what A hears."""
    mesh, a, b = replicas, replicas.server, replicas.client_server
    wait_for(lambda: mesh.healthy("v1") and mesh.healthy("v2"), "both VMs healthy in the EDS of B's client")
    wait_for(
        lambda: a.admin_json("/version")["snapshot"] == b.admin_json("/version")["snapshot"],
        "both replicas serving the same snapshot version",
    )
    # A VM registered on A is an endpoint on B, with its group's labels.
    mesh.stack.enter_context(Backend("api-v3", "127.0.0.1", mesh.group_port))
    mesh.envoy("", "--group", f"api-v3.{NS}", "--ip", "127.0.0.1")
    v3 = f"127.0.0.1:{mesh.group_port}"
    wait_for(lambda: host_flags(mesh.client, mesh.cluster).get(v3) == "healthy", "the VM registered on A, on B")
    registered = endpoint_of(b, "api-v3-127.0.0.1")
    assert registered is not None and registered["labels"] == {"app": "api", "version": "v3"}

    with RequestLoop(mesh.service_port, HOST) as loop:
        loop.wait_for_answers(20)
        # v1's app stops: its Envoy tells A, and B's client stops sending it requests.
        mesh.backends["v1"].stop()
        took = wait_for(lambda: mesh.unhealthy("v1"), "v1 unhealthy in B's client after its app stopped")
        print(f"app stopped (reported to A) -> unhealthy in B's client: {took:.2f}s")
        flagged = time.monotonic()
        mark = settled_mark(loop)
        loop.wait_for_answers(30)
        assert [f for f in loop.failures if f.at > flagged] == []
        assert "api-v1" not in loop.since(mark)
        mesh.stack.enter_context(Backend("api-v1", "127.0.0.1", mesh.ports["v1"]))
        wait_for(lambda: mesh.healthy("v1"), "v1 healthy again in B's client after its app restarted")

    # Consul goes away: A keeps serving the last known state and says so on /ready beside its
    # status; the note goes once Consul answers again.
    assert mesh.consul is not None
    mesh.consul.stop()
    wait_for(lambda: "shared health in consul KV failing since" in ready_body(a), "A's /ready naming the outage")
    mesh.consul.start()
    wait_for(lambda: "shared health" not in ready_body(a), "A's /ready without the note once Consul is back")
    wait_for(lambda: mesh.healthy("v1") and mesh.healthy("v2"), "both VMs healthy on B after the outage")

    # Replica A dies without a word: its session's keys go after one to two TTLs, then B applies
    # the grace to the workloads whose streams were there, and removes the VM registered there.
    killed = time.monotonic()
    assert a.pid is not None
    os.kill(a.pid, signal.SIGKILL)
    wait_for(lambda: mesh.unhealthy("v1") and mesh.unhealthy("v2"), "v1 and v2 unhealthy on B after A died")
    took = time.monotonic() - killed
    print(f"replica A killed -> its VMs unhealthy in B's client: {took:.2f}s (TTL {SESSION_TTL}s, grace {GRACE}s)")
    assert took >= SESSION_TTL + GRACE * 0.9  # Consul keeps a session its TTL at least; then the grace
    gone = endpoint_of(b, "api-v1")
    assert gone is not None and "stream gone since" in gone["healthReason"]
    wait_for(lambda: endpoint_of(b, "api-v3-127.0.0.1") is None, "the VM registered on A removed from B")
