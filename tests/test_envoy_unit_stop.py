"""systemd/envoy-sidecar@.service stops Envoy as Istio's agent does: fail health checks, drain the
listeners, wait the termination drain period, and only then let systemd send SIGTERM.

Istio's pilot-agent on SIGTERM (pkg/envoy/agent.go `terminate`, admin.go `DrainListeners`) POSTs
`/drain_listeners?graceful` to Envoy's admin API (with `&inboundonly` for a sidecar), waits
`terminationDrainDuration` (5 s) and then kills Envoy. The unit's ExecStop= does the same, with
`/healthcheck/fail` first (a VM's load balancer learns of the stop from the health port, where a
Kubernetes Service drops a terminating pod by itself).

The ExecStop= line is taken from the unit file and run as systemd runs it (specifiers expanded,
`$MAINPID` set): against a stand-in admin API that records what it is asked, and against a real
Envoy started by the unit's own ExecStartPre= and ExecStart= lines from `meshctl serve`, with 20
slow requests in flight through a gateway listener, every one of which completes. Without the
stop sequence (SIGTERM at once) the same requests fail, so the test shows what the sequence buys.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ENVOY_UNIT,
    INSTANCE,
    NODE_ID,
    command_line,
    envoy_start,
    expand_specifiers,
    needs_envoy,
    one,
    run_start_pre,
    wait_for,
)
from ruamel.yaml import YAML

from meshctl.bootstrap import BootstrapOptions, build_bootstrap
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.backends import Backend, Reply, send
from meshctl.testing.builders import gateway_mesh_yaml
from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="the unit's stop needs curl")


# -- running ExecStop= ----------------------------------------------------------------------------


def stop_command(runtime: Path, environ: Mapping[str, str], instance: str = INSTANCE) -> subprocess.Popen[str]:
    """ExecStop= as systemd starts it: `%t` is `runtime`, `environ` the unit's environment plus
    MAINPID."""
    argv = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStop"), runtime, instance), environ)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_stop(runtime: Path, environ: Mapping[str, str]) -> tuple[int, str, float]:
    """Run ExecStop= to its end: (exit status, stderr, seconds it took)."""
    started = time.monotonic()
    proc = stop_command(runtime, environ)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr, time.monotonic() - started


# -- a stand-in admin API -------------------------------------------------------------------------


class FakeAdmin:
    """An HTTP server that records each request's method and path and answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, str]] = []
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                admin.requests.append((self.command, self.path))
                self.send_response(status)
                self.send_header("Content-Length", "3")
                self.end_headers()
                self.wfile.write(b"OK\n")

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def admin() -> Iterator[FakeAdmin]:
    server = FakeAdmin()
    yield server
    server.close()


def runtime_dir(tmp_path: Path, admin_address: str, node_id: str, *, as_json: bool = False) -> Path:
    """What the unit's start leaves in its runtime directory: the bootstrap (as `meshctl
    bootstrap` writes it, YAML by default) and the admin address Envoy wrote."""
    directory = tmp_path / f"envoy-{INSTANCE}"
    directory.mkdir()
    config = build_bootstrap(parse_node_id(node_id), BootstrapOptions("10.10.0.1", 15010))
    if as_json:  # `meshctl bootstrap -o json` in MESHCTL_BOOTSTRAP_ARGS
        (directory / "envoy.yaml").write_text(json.dumps(config, indent=2))
    else:
        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        with (directory / "envoy.yaml").open("w") as out:
            yaml.dump(config, out)
    (directory / "admin.address").write_text(admin_address)
    return tmp_path


ROUTER_ID = NODE_ID.replace("sidecar~", "router~")
LIVE = {"MAINPID": str(os.getpid()), "MESHCTL_TERMINATION_DRAIN_DURATION": "0"}


@needs_curl
@pytest.mark.parametrize(
    ("node_id", "as_json", "drain"),
    [
        (NODE_ID, False, "/drain_listeners?inboundonly&graceful"),
        (ROUTER_ID, False, "/drain_listeners?graceful"),
        (ROUTER_ID, True, "/drain_listeners?graceful"),
        (NODE_ID, True, "/drain_listeners?inboundonly&graceful"),
    ],
)
def test_stop_fails_health_checks_then_drains_as_istios_agent(
    tmp_path: Path, admin: FakeAdmin, node_id: str, as_json: bool, drain: str
) -> None:
    """A sidecar drains its inbound listeners only (its app may still call out while it finishes
    its requests), a router every listener (Istio: `Drain` with inboundonly = proxy is a sidecar)."""
    status, stderr, _ = run_stop(runtime_dir(tmp_path, admin.address, node_id, as_json=as_json), LIVE)
    assert status == 0, stderr
    assert admin.requests == [("POST", "/healthcheck/fail"), ("POST", drain)]


@needs_curl
def test_stop_waits_the_termination_drain_duration(tmp_path: Path, admin: FakeAdmin) -> None:
    runtime = runtime_dir(tmp_path, admin.address, NODE_ID)
    status, stderr, took = run_stop(runtime, {**LIVE, "MESHCTL_TERMINATION_DRAIN_DURATION": "2"})
    assert status == 0, stderr
    assert took >= 2


@needs_curl
@pytest.mark.parametrize("mainpid", ["", "dead"])
def test_stop_without_a_running_envoy_does_nothing(tmp_path: Path, admin: FakeAdmin, mainpid: str) -> None:
    """systemd runs ExecStop= after an Envoy that exited on its own too, with MAINPID unset."""
    environ: dict[str, str] = {"MESHCTL_TERMINATION_DRAIN_DURATION": "30"}
    if mainpid == "dead":
        proc = subprocess.Popen(["/bin/true"])
        proc.wait()
        environ["MAINPID"] = str(proc.pid)
    status, stderr, took = run_stop(runtime_dir(tmp_path, admin.address, NODE_ID), environ)
    assert (status, admin.requests) == (0, []), stderr
    assert took < 10


@needs_curl
def test_stop_that_cannot_drain_fails_at_once(tmp_path: Path) -> None:
    """An admin API that refuses the drain: the stop says so (systemd logs it) and does not wait;
    systemd's SIGTERM follows."""
    refusing = FakeAdmin(status=503)
    try:
        runtime = runtime_dir(tmp_path, refusing.address, NODE_ID)
        status, stderr, took = run_stop(runtime, {**LIVE, "MESHCTL_TERMINATION_DRAIN_DURATION": "30"})
    finally:
        refusing.close()
    assert status != 0
    assert "503" in stderr
    assert took < 10


# -- a real Envoy, started and stopped by the unit ------------------------------------------------

NS = "stop"
GATEWAY_IP = "127.0.0.71"
BACKEND_IP = "127.0.0.72"
HOST = "slow.example.com"
GATEWAY_INSTANCE = f"ingress.{NS}"
#: How long the backend takes to answer, and the drain period the stop waits (both short enough
#: for a test, the second long enough for the first).
SLOW_SECONDS = 2.0
TERMINATION_DRAIN = 4
IN_FLIGHT = 20


def mesh_yaml(service_port: int, gateway_port: int) -> str:
    return gateway_mesh_yaml(
        namespace=NS,
        service="slow",
        backend_ip=BACKEND_IP,
        gateway="ingress",
        gateway_ip=GATEWAY_IP,
        selector="stop-gateway",
        host=HOST,
        service_port=service_port,
        gateway_port=gateway_port,
    )


@dataclass
class Mesh:
    server: ServeProcess
    backend: Backend
    gateway_port: int


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    directory = tmp_path_factory.mktemp("mesh")
    service_port, gateway_port = free_port(BACKEND_IP), free_port()
    (directory / "mesh.yaml").write_text(mesh_yaml(service_port, gateway_port))
    with Backend("slow", BACKEND_IP, service_port) as backend, ServeProcess([directory]) as server:
        try:
            yield Mesh(server, backend, gateway_port)
        finally:
            print(f"--- meshctl serve log:\n{server.log()[-4000:]}")


class UnitEnvoy:
    """The gateway's Envoy as the unit starts it (ExecStartPre=, then ExecStart=), in `tmp_path`
    as its `%t`; a context manager that kills it at the end if a test did not stop it."""

    def __init__(self, tmp_path: Path, mesh: Mesh) -> None:
        self.runtime = tmp_path
        self.health_port = free_port()
        self.environ = {
            "MESHCTL_VM_IP": GATEWAY_IP,
            "MESHCTL_XDS_ADDRESS": mesh.server.xds_address,
            "MESHCTL_BOOTSTRAP_ARGS": f"--router --admin-port {free_port()} --stats-port {free_port()} "
            f"--health-port {self.health_port}",
            "ENVOY_ARGS": "--concurrency 1 --log-level info",
            "MESHCTL_TERMINATION_DRAIN_DURATION": str(TERMINATION_DRAIN),
        }
        self.log_path = tmp_path / "envoy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> UnitEnvoy:
        pre = run_start_pre(self.runtime, self.environ, instance=GATEWAY_INSTANCE)
        assert pre.returncode == 0, pre.stderr
        argv = envoy_start(self.runtime, self.environ, instance=GATEWAY_INSTANCE)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.environ}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        print(f"--- envoy log:\n{self.log()[-4000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def health(self) -> int:
        """The health port's answer to GET /healthz/ready (0: no answer)."""
        return get(self.health_port, "/healthz/ready")[0]

    def sigterm(self) -> int:
        """What systemd does once ExecStop= is done (KillSignal=SIGTERM); Envoy's exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def stop(self) -> subprocess.Popen[str]:
        """ExecStop= started as systemd starts it, MAINPID set."""
        return stop_command(self.runtime, {**self.environ, "MAINPID": str(self.pid)}, GATEWAY_INSTANCE)


def get(port: int, path: str, host: str = "localhost") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("connection") or ""
    except (OSError, http.client.HTTPException):
        return 0, ""
    finally:
        conn.close()


def requests_in_flight(mesh: Mesh, pool: ThreadPoolExecutor) -> list[Future[Reply]]:
    """`IN_FLIGHT` slow requests through the gateway, returned once the backend has them all."""
    before = mesh.backend.served
    mesh.backend.delay = SLOW_SECONDS
    futures = [pool.submit(send, mesh.gateway_port, HOST, timeout=30) for _ in range(IN_FLIGHT)]
    wait_for(lambda: mesh.backend.served - before >= IN_FLIGHT, f"{IN_FLIGHT} requests at the backend")
    return futures


def started(envoy: UnitEnvoy, mesh: Mesh) -> None:
    mesh.backend.delay = 0
    wait_for(lambda: envoy.health() == 200, "the health port answering 200", envoy.log)
    wait_for(lambda: send(mesh.gateway_port, HOST).ok, "the gateway routing", envoy.log)


@needs_curl
@needs_envoy
@pytest.mark.e2e
@pytest.mark.slow
def test_the_units_stop_lets_requests_in_flight_finish(tmp_path: Path, mesh: Mesh) -> None:
    with UnitEnvoy(tmp_path, mesh) as envoy, ThreadPoolExecutor(IN_FLIGHT) as pool:
        started(envoy, mesh)
        futures = requests_in_flight(mesh, pool)
        begun = time.monotonic()
        stop = envoy.stop()
        # Load balancers hear of the stop at once; a request that still comes is answered, and
        # told to close its connection (--drain-strategy immediate).
        wait_for(lambda: envoy.health() == 503, "the health port answering 503", envoy.log)
        mesh.backend.delay = 0
        status, connection = get(mesh.gateway_port, "/", HOST)
        assert (status, connection) == (200, "close")
        _, stderr = stop.communicate(timeout=60)
        assert stop.returncode == 0, stderr
        assert time.monotonic() - begun >= TERMINATION_DRAIN
        assert envoy.sigterm() == 0
        replies = [future.result(timeout=30) for future in futures]
    assert [r for r in replies if not r.ok] == []
    assert len(replies) == IN_FLIGHT


@needs_envoy
@pytest.mark.e2e
@pytest.mark.slow
def test_without_the_stop_sequence_requests_in_flight_fail(tmp_path: Path, mesh: Mesh) -> None:
    """What systemd does without ExecStop=: SIGTERM at once. Envoy exits and cuts them off."""
    with UnitEnvoy(tmp_path, mesh) as envoy, ThreadPoolExecutor(IN_FLIGHT) as pool:
        started(envoy, mesh)
        futures = requests_in_flight(mesh, pool)
        assert envoy.sigterm() == 0
        replies = [future.result(timeout=30) for future in futures]
    assert all(not r.ok for r in replies), replies
