"""End to end: a VM without iptables and without /etc/hosts reaches mesh services by name.

`meshctl serve` on a directory, and an Envoy started from `meshctl bootstrap --dns-port P` output
(INTERCEPTION_MODE NONE, the VM default). The app's side is played by a real DNS client
(dnspython) asking the Envoy's DNS listener on 127.0.0.1:P, then a plain TCP connection to the
address it got:

- two TCP ServiceEntries on port 5432, each with its own echo backend, are both reached by name:
  each host has a loopback address of its own, where the Envoy listens on 5432;
- a name the mesh does not have is NXDOMAIN (`--no-dns-forward`), or, from an Envoy that
  forwards (the default), answered as the VM's own resolution answers it;
- a ServiceEntry written to the directory later resolves (and connects) without a restart.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest
from conftest import needs_envoy, wait_for

from meshctl.testing.backends import TcpEcho, tcp_exchange
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e-names"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
PG_PORT = 5432


def database(name: str, backend: TcpEcho) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {NS}}}
spec:
  hosts: [{name}.{NS}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {PG_PORT}, name: tcp-pg, protocol: TCP, targetPort: {backend.port}}}]
  endpoints: [{{address: {backend.host}}}]
"""


@dataclass
class Vm:
    directory: Path
    server: ServeProcess
    envoy: EnvoyProcess
    dns_port: int

    def lookup(self, name: str) -> tuple[str, list[str]]:
        """(rcode, A answers) from the Envoy's DNS listener; ("unanswered", []) when nothing answers."""
        query = dns.message.make_query(name, dns.rdatatype.A)
        try:
            reply = dns.query.udp(query, "127.0.0.1", port=self.dns_port, timeout=5)
        except (OSError, dns.exception.Timeout):
            return "unanswered", []
        addresses = [item.address for rrset in reply.answer for item in rrset if rrset.rdtype == dns.rdatatype.A]
        return dns.rcode.to_text(reply.rcode()), addresses

    def connect_by_name(self, name: str) -> bytes:
        """What an app gets connecting to `name`:5432 after asking the Envoy for its address."""
        rcode, addresses = self.lookup(name)
        if rcode != "NOERROR" or not addresses:
            return b""
        return tcp_exchange(addresses[0], PG_PORT)


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    directory = tmp_path_factory.mktemp("mesh")
    host_a, host_b, host_c = "127.77.0.1", "127.77.0.2", "127.77.0.3"
    with (
        TcpEcho("pg-a", host_a, free_port(host_a)) as pg_a,
        TcpEcho("pg-b", host_b, free_port(host_b)) as pg_b,
        TcpEcho("pg-c", host_c, free_port(host_c)) as pg_c,
    ):
        (directory / "pg-a.yaml").write_text(database("pg-a", pg_a))
        (directory / "pg-b.yaml").write_text(database("pg-b", pg_b))
        # Written into the directory by the test that adds it.
        (directory.parent / f"{directory.name}-pg-c.yaml").write_text(database("pg-c", pg_c))
        with ServeProcess([directory]) as server:
            try:
                dns_port = free_port()
                config = server.bootstrap(CLIENT, extra_args=["--dns-port", str(dns_port), "--no-dns-forward"])
                with EnvoyProcess(config) as envoy:
                    yield Vm(directory, server, envoy, dns_port)
            finally:
                print(f"--- meshctl serve log:\n{server.log()[-4000:]}")


def test_two_tcp_services_on_one_port_are_both_reached_by_name(vm: Vm) -> None:
    wait_for(lambda: vm.connect_by_name(f"pg-a.{NS}.mesh") == b"pg-a:hello", "pg-a reached by name", vm.envoy.log)
    assert vm.connect_by_name(f"pg-b.{NS}.mesh") == b"pg-b:hello"
    (a,), (b,) = vm.lookup(f"pg-a.{NS}.mesh")[1], vm.lookup(f"pg-b.{NS}.mesh")[1]
    assert a != b
    assert a.startswith("127.") and b.startswith("127.") and "127.0.0.1" not in (a, b)
    # Nothing on 127.0.0.1:5432: the port is the services', each on its own address.
    assert tcp_exchange("127.0.0.1", PG_PORT, timeout=2) == b""


def test_a_name_outside_the_mesh_is_nxdomain_when_not_forwarded(vm: Vm) -> None:
    wait_for(lambda: vm.lookup(f"pg-a.{NS}.mesh")[1], "the DNS table", vm.envoy.log)
    assert vm.lookup(f"nothing-here.{NS}.mesh") == ("NXDOMAIN", [])
    assert vm.lookup("www.example.org") == ("NXDOMAIN", [])


def test_a_service_added_by_a_file_edit_resolves_without_a_restart(vm: Vm) -> None:
    wait_for(lambda: vm.lookup(f"pg-a.{NS}.mesh")[1], "the DNS table", vm.envoy.log)
    assert vm.lookup(f"pg-c.{NS}.mesh") == ("NXDOMAIN", [])
    (vm.directory.parent / f"{vm.directory.name}-pg-c.yaml").rename(vm.directory / "pg-c.yaml")
    wait_for(lambda: vm.connect_by_name(f"pg-c.{NS}.mesh") == b"pg-c:hello", "pg-c reached by name", vm.envoy.log)
    assert vm.envoy.running()


def vm_answer(name: str) -> list[str]:
    """The IPv4 addresses the VM's own resolution gives `name` (/etc/hosts, then the resolvers
    of /etc/resolv.conf: what Envoy's default resolver reads too); [] when it gives none."""
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in found})


def test_a_forwarding_envoy_answers_other_names_as_the_vm_does(vm: Vm) -> None:
    """`meshctl bootstrap` forwards by default: a name outside the mesh (`localhost`) gets the
    answer the VM's own resolution gives it; the Envoy run with --no-dns-forward says NXDOMAIN."""
    expected = vm_answer("localhost")
    if not expected:
        pytest.skip("this machine does not resolve localhost")
    dns_port = free_port()
    config = vm.server.bootstrap(CLIENT, extra_args=["--dns-port", str(dns_port)])
    with EnvoyProcess(config) as envoy:
        forwarding = Vm(vm.directory, vm.server, envoy, dns_port)
        wait_for(lambda: forwarding.lookup(f"pg-a.{NS}.mesh")[1], "the DNS table", envoy.log)
        rcode, addresses = forwarding.lookup("localhost")
        assert rcode == "NOERROR" and sorted(addresses) == expected
    assert vm.lookup("localhost") == ("NXDOMAIN", [])
