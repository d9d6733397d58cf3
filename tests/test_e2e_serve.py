"""End to end: a real Envoy routes real HTTP with the config a `meshctl serve` process serves.

Every test runs the commands users run: `meshctl serve` as a subprocess on ports it picks, an
Envoy started from `meshctl bootstrap` output, and HTTP backends on their own loopback addresses
(127.0.0.x, as each VM has its own address) that name themselves in each answer. The client is a
sidecar with no WorkloadEntry of its own (`127.0.0.9`), so Envoy only has outbound listeners,
bound on 127.0.0.1:SERVICE_PORT as on a VM without iptables.

Nothing waits a fixed time: each step waits for the outcome it expects (traffic moving, a sync
state) with a generous deadline, so a slow machine makes the tests slower, never flaky.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, Failure, Reply, RequestLoop, send
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
]

NS = "e2e"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
#: How long a config change may take to reach traffic (debounce 50 ms, then one push per type).
CONVERGE = 10.0


# -- Istio YAML ---------------------------------------------------------------------------------


def service_entry(name: str, port: int, *, app: str | None = None) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
  namespace: {NS}
spec:
  hosts:
  - {name}.{NS}.mesh
  location: MESH_INTERNAL
  ports:
  - number: {port}
    name: http
    protocol: HTTP
  resolution: STATIC
  workloadSelector:
    labels:
      app: {app or name}
"""


def workload_entry(name: str, address: str, app: str, version: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: {NS}
spec:
  address: {address}
  labels:
    app: {app}
    version: {version}
"""


def destination_rule(service: str, versions: list[str], *, traffic_policy: str = "") -> str:
    subsets = "".join(f"  - name: {v}\n    labels:\n      version: {v}\n" for v in versions)
    return f"""apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: {service}
  namespace: {NS}
spec:
  host: {service}.{NS}.mesh
{traffic_policy}  subsets:
{subsets}"""


def weighted_route(service: str, weights: dict[str, int]) -> str:
    """One `route:` block sending `weights` (subset -> percent) of the traffic."""
    out = "    route:\n"
    for subset, weight in weights.items():
        out += f"    - destination:\n        host: {service}.{NS}.mesh\n        subset: {subset}\n"
        out += f"      weight: {weight}\n"
    return out


def virtual_service(service: str, weights: dict[str, int], *, header_subset: str | None = None) -> str:
    """Routes `service` by `weights`; with `header_subset`, `x-canary: yes` goes to that subset."""
    http = ""
    if header_subset is not None:
        http += '  - name: canary\n    match:\n    - headers:\n        x-canary:\n          exact: "yes"\n'
        http += weighted_route(service, {header_subset: 100})
    http += "  - name: default\n" + weighted_route(service, weights)
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: {service}
  namespace: {NS}
spec:
  hosts:
  - {service}.{NS}.mesh
  http:
{http}"""


# -- the harness --------------------------------------------------------------------------------


class Mesh:
    """One test's mesh: its config directory, backends, `meshctl serve` and Envoys, all torn down
    (logs printed first, so a failing test shows them) when the test ends."""

    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.dir = root / "mesh"
        self.dir.mkdir()
        self._stack = stack

    def write(self, name: str, *documents: str) -> Path:
        """Write a file as editors do: a temporary file renamed over the old one."""
        path = self.dir / name
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text("---\n".join(documents))
        os.replace(tmp, path)
        return path

    def remove(self, name: str) -> None:
        (self.dir / name).unlink()

    def backend(self, name: str, address: str, port: int) -> Backend:
        return self._stack.enter_context(Backend(name, address, port))

    def consul(self) -> FakeConsul:
        return self._stack.enter_context(FakeConsul())

    def serve(self, *, consul: str | None = None, extra_args: Sequence[str] = ()) -> ServeProcess:
        server = ServeProcess([self.dir], consul=consul, extra_args=extra_args)
        self._stack.enter_context(server)
        self._stack.callback(lambda: print(f"--- meshctl serve log:\n{server.log()[-6000:]}"))
        return server

    def envoy(self, server: ServeProcess, *, delta: bool = False, node_id: str = CLIENT) -> EnvoyProcess:
        envoy = EnvoyProcess(server.bootstrap(node_id, delta=delta))
        self._stack.enter_context(envoy)
        self._stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        return envoy


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with ExitStack() as stack:
        yield Mesh(tmp_path, stack)


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> float:
    """Poll `condition` until it is true; returns the seconds it took, fails the test with `what`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def answers(port: int, host: str, count: int, headers: dict[str, str] | None = None) -> Counter[str]:
    """Who answered `count` requests; a failed request counts as `error:STATUS:REASON`."""
    out: Counter[str] = Counter()
    for _ in range(count):
        reply = send(port, host, headers=headers)
        out[reply.backend if reply.ok else f"error:{reply.status}:{reply.error}"] += 1
    return out


def served_by(port: int, host: str, backends: set[str], headers: dict[str, str] | None = None) -> Callable[[], bool]:
    """A condition: a batch of requests all succeeded and exactly `backends` answered them."""
    batch = 10 if len(backends) == 1 else 30

    def condition() -> bool:
        return set(answers(port, host, batch, headers)) == backends

    return condition


def proxy_status(server: ServeProcess) -> dict[str, dict[str, str]]:
    """`meshctl proxy-status -o json`, by proxy."""
    proc = subprocess.run(
        [*meshctl_command(), "proxy-status", "--admin", server.admin_address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: a proxy shows ERROR or STALE
    return {row["proxy"]: row for row in json.loads(proc.stdout)}


def synced(server: ServeProcess, node_id: str = CLIENT) -> bool:
    row = proxy_status(server).get(node_id)
    return row is not None and all(row[t] == "SYNCED" for t in ("CDS", "EDS", "LDS", "RDS"))


def settled(server: ServeProcess, node_id: str = CLIENT) -> bool:
    """The node is connected with all four types, and has ACKed everything it was sent (after a
    delta reconnect the server may rightly send nothing: the node already holds every version)."""
    entry = next((e for e in server.admin_json("/debug/syncz") if e["proxy"] == node_id), None)
    if entry is None or set(entry["types"]) != {"CDS", "EDS", "LDS", "RDS"}:
        return False
    return all(not t["nack"] and t["acked"] == t["sent"] for t in entry["types"].values())


def metric(server: ServeProcess, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (`labels` as printed: `type="cds"`), 0 when absent."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in server.admin("/metrics").splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    return 0.0


def envoy_stats(envoy: EnvoyProcess, *names: str) -> dict[str, int]:
    stats = dict(line.split(": ", 1) for line in envoy.admin("stats").splitlines() if ": " in line)
    return {name: int(stats.get(name, "0")) for name in names}


def dynamic_versions(envoy: EnvoyProcess) -> dict[str, tuple[str, str]]:
    """Every xDS resource Envoy holds, as `TYPE/name` -> (version_info, last_updated)."""
    dump = json.loads(envoy.admin("config_dump?include_eds"))
    out: dict[str, tuple[str, str]] = {}
    for config in dump["configs"]:
        kind = config["@type"].rsplit(".", 1)[-1]
        if kind == "ClustersConfigDump":
            for c in config.get("dynamic_active_clusters", []):
                out[f"CDS/{c['cluster']['name']}"] = (c.get("version_info", ""), c.get("last_updated", ""))
        elif kind == "ListenersConfigDump":
            for listener in config.get("dynamic_listeners", []):
                state = listener.get("active_state", {})
                out[f"LDS/{listener['name']}"] = (state.get("version_info", ""), state.get("last_updated", ""))
        elif kind == "RoutesConfigDump":
            for r in config.get("dynamic_route_configs", []):
                out[f"RDS/{r['route_config']['name']}"] = (r.get("version_info", ""), r.get("last_updated", ""))
        elif kind == "EndpointsConfigDump":
            for e in config.get("dynamic_endpoint_configs", []):
                out[f"EDS/{e['endpoint_config']['cluster_name']}"] = (
                    e.get("version_info", ""),
                    e.get("last_updated", ""),
                )
    return out


def envoy_hosts(envoy: EnvoyProcess, cluster: str) -> set[str]:
    """The endpoint addresses Envoy holds for `cluster` (admin /clusters)."""
    hosts = set()
    for line in envoy.admin("clusters").splitlines():
        name, _, rest = line.partition("::")
        if name == cluster and rest.count("::") >= 2:
            address = rest.split("::", 1)[0]
            if address[0].isdigit():
                hosts.add(address.rsplit(":", 1)[0])
    return hosts


# -- tests --------------------------------------------------------------------------------------


def test_traffic_follows_header_match_and_weights(mesh: Mesh) -> None:
    port = free_port()
    mesh.backend("web-v1", "127.0.0.21", port)
    mesh.backend("web-v2", "127.0.0.22", port)
    mesh.write(
        "web.yaml",
        service_entry("web", port),
        workload_entry("web-v1", "127.0.0.21", "web", "v1"),
        workload_entry("web-v2", "127.0.0.22", "web", "v2"),
        destination_rule("web", ["v1", "v2"]),
        virtual_service("web", {"v1": 50, "v2": 50}, header_subset="v2"),
    )
    server = mesh.serve()
    mesh.envoy(server)
    host = f"web.{NS}.mesh"
    wait_for(lambda: send(port, host).ok, "Envoy routes the first request")

    assert answers(port, host, 30, {"x-canary": "yes"}) == Counter({"web-v2": 30})
    # 300 requests at 50/50: each side gets 150 on average (sigma 8.7); 85 is 7.5 sigma away.
    split = answers(port, host, 300)
    assert set(split) == {"web-v1", "web-v2"}, split
    assert min(split.values()) >= 85, split
    wait_for(lambda: synced(server), "proxy-status SYNCED")


def test_editing_the_yaml_moves_traffic_within_seconds(mesh: Mesh) -> None:
    port = free_port()
    mesh.backend("web-v1", "127.0.0.21", port)
    mesh.backend("web-v2", "127.0.0.22", port)
    mesh.write(
        "web.yaml",
        service_entry("web", port),
        workload_entry("web-v1", "127.0.0.21", "web", "v1"),
        workload_entry("web-v2", "127.0.0.22", "web", "v2"),
        destination_rule("web", ["v1", "v2"]),
    )
    mesh.write("web-vs.yaml", virtual_service("web", {"v1": 100}))
    server = mesh.serve()
    mesh.envoy(server)
    host = f"web.{NS}.mesh"
    wait_for(served_by(port, host, {"web-v1"}), "all traffic on v1")

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        mark = loop.mark()
        mesh.write("web-vs.yaml", virtual_service("web", {"v2": 100}))
        wait_for(lambda: loop.settled_on("web-v2", mark), "traffic moves to v2 after the edit", CONVERGE)
        mark = loop.mark()
        mesh.write("web-vs.yaml", virtual_service("web", {"v1": 100}, header_subset="v2"))
        wait_for(lambda: loop.settled_on("web-v1", mark), "traffic back on v1 after the second edit", CONVERGE)
        # Deleting the file deletes the VirtualService: the service's default route balances both.
        mesh.remove("web-vs.yaml")
        wait_for(served_by(port, host, {"web-v1", "web-v2"}), "both versions serve without a VirtualService", CONVERGE)
    assert loop.failures == []


def test_retries_and_timeouts_follow_the_virtual_service(mesh: Mesh) -> None:
    port = free_port()
    backend = mesh.backend("flaky", "127.0.0.81", port)
    policy = "    retries:\n      attempts: 3\n      retryOn: 5xx\n    timeout: 1s\n"
    mesh.write(
        "flaky.yaml",
        service_entry("flaky", port),
        workload_entry("flaky", "127.0.0.81", "flaky", "v1"),
        f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: flaky
  namespace: {NS}
spec:
  hosts:
  - flaky.{NS}.mesh
  http:
  - route:
    - destination:
        host: flaky.{NS}.mesh
{policy}""",
    )
    server = mesh.serve()
    mesh.envoy(server)
    host = f"flaky.{NS}.mesh"
    wait_for(served_by(port, host, {"flaky"}), "flaky serves")

    # Three failures are absorbed by three retries: the fourth attempt answers.
    backend.fail_next(3)
    served = backend.served
    assert send(port, host) == Reply(200, "flaky")
    assert backend.served - served == 4
    # A fourth failure is one too many: the client sees the last attempt's 503.
    backend.fail_next(10)
    served = backend.served
    assert send(port, host).status == 503
    assert backend.served - served == 4
    backend.fail_next(0)
    # An answer slower than the route's timeout becomes Envoy's 504.
    backend.delay = 3.0
    reply = send(port, host)
    assert (reply.status, reply.error) == (504, "upstream request timeout")
    backend.delay = 0.0
    assert send(port, host) == Reply(200, "flaky")


def test_workload_entries_added_and_removed_reach_envoy(mesh: Mesh) -> None:
    port = free_port()
    mesh.backend("api-a", "127.0.0.41", port)
    mesh.backend("api-b", "127.0.0.42", port)
    mesh.write("api.yaml", service_entry("api", port))
    mesh.write("api-a.yaml", workload_entry("api-a", "127.0.0.41", "api", "v1"))
    server = mesh.serve()
    envoy = mesh.envoy(server)
    host = f"api.{NS}.mesh"
    cluster = f"outbound|{port}||{host}"
    wait_for(served_by(port, host, {"api-a"}), "api-a serves")
    wait_for(lambda: synced(server), "proxy-status SYNCED")
    # An endpoint change is pushed as EDS alone: Envoy's clusters and listeners are not touched.
    untouched = ("cluster_manager.cds.update_success", "listener_manager.lds.update_success")
    before = envoy_stats(envoy, *untouched)

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        mesh.write("api-b.yaml", workload_entry("api-b", "127.0.0.42", "api", "v1"))
        wait_for(lambda: envoy_hosts(envoy, cluster) == {"127.0.0.41", "127.0.0.42"}, "Envoy gets api-b", CONVERGE)
        wait_for(served_by(port, host, {"api-a", "api-b"}), "both endpoints serve")
        mesh.remove("api-a.yaml")
        wait_for(lambda: envoy_hosts(envoy, cluster) == {"127.0.0.42"}, "Envoy drops api-a", CONVERGE)
        assert answers(port, host, 20) == Counter({"api-b": 20})
    assert loop.failures == []
    assert loop.since(0)["api-b"] > 0
    assert envoy_stats(envoy, *untouched) == before


def cluster_stats(envoy: EnvoyProcess, clusters: list[str], stat: str) -> dict[str, int]:
    """One of Envoy's per-cluster stats, by cluster (`update_attempt`: the EDS updates a cluster
    was given, one per response that carried its assignment). Stats are named `cluster.NAME;.`
    as Istio names them (`alt_stat_name`)."""
    names = [f"cluster.{c};.{stat}" for c in clusters]
    return dict(zip(clusters, envoy_stats(envoy, *names).values(), strict=True))


def test_an_endpoint_change_sends_envoy_that_assignment_alone_and_it_keeps_the_others(mesh: Mesh) -> None:
    """State-of-the-world EDS carries only the assignments that changed; Envoy keeps every
    assignment a response leaves out, so the other services keep their endpoints and traffic."""
    names = ["alpha", "beta", "gamma"]
    ports = {name: free_port() for name in names}
    for i, name in enumerate(names):
        mesh.backend(f"{name}-1", f"127.0.0.{101 + i}", ports[name])
        mesh.write(
            f"{name}.yaml",
            service_entry(name, ports[name]),
            workload_entry(f"{name}-1", f"127.0.0.{101 + i}", name, "v1"),
        )
    mesh.backend("alpha-2", "127.0.0.111", ports["alpha"])
    server = mesh.serve()
    envoy = mesh.envoy(server)
    hosts = {name: f"{name}.{NS}.mesh" for name in names}
    clusters = {name: f"outbound|{ports[name]}||{hosts[name]}" for name in names}
    for name in names:
        wait_for(served_by(ports[name], hosts[name], {f"{name}-1"}), f"{name}-1 serves")
    wait_for(lambda: synced(server), "proxy-status SYNCED")
    updates_before = cluster_stats(envoy, list(clusters.values()), "update_attempt")
    untouched = ("cluster_manager.cds.update_success", "listener_manager.lds.update_success")
    stats_before = envoy_stats(envoy, *untouched)

    with RequestLoop(ports["beta"], hosts["beta"]) as loop:
        loop.wait_for_answers(5)
        mesh.write("alpha-2.yaml", workload_entry("alpha-2", "127.0.0.111", "alpha", "v1"))
        wait_for(
            lambda: envoy_hosts(envoy, clusters["alpha"]) == {"127.0.0.101", "127.0.0.111"},
            "Envoy gets alpha-2",
            CONVERGE,
        )
        wait_for(lambda: synced(server), "proxy-status SYNCED after the change")
        wait_for(served_by(ports["alpha"], hosts["alpha"], {"alpha-1", "alpha-2"}), "both alpha endpoints serve")
        mark = loop.mark()
        loop.wait_for_answers(5)
        assert loop.since(mark) == Counter({"beta-1": loop.since(mark).total()})
    assert loop.failures == []

    # The response carried alpha's assignment alone: only alpha's cluster was updated...
    updates = cluster_stats(envoy, list(clusters.values()), "update_attempt")
    assert updates[clusters["alpha"]] > updates_before[clusters["alpha"]]
    assert {c: updates[c] for c in (clusters["beta"], clusters["gamma"])} == {
        c: updates_before[c] for c in (clusters["beta"], clusters["gamma"])
    }
    # ...and the others kept their endpoints and serve as before.
    assert envoy_hosts(envoy, clusters["beta"]) == {"127.0.0.102"}
    assert envoy_hosts(envoy, clusters["gamma"]) == {"127.0.0.103"}
    assert answers(ports["gamma"], hosts["gamma"], 10) == Counter({"gamma-1": 10})
    assert envoy_stats(envoy, *untouched) == stats_before


@pytest.mark.consul
def test_consul_instances_registered_and_deregistered_reach_envoy(mesh: Mesh) -> None:
    port = free_port()
    mesh.backend("orders-1", "127.0.0.51", port)
    mesh.backend("orders-2", "127.0.0.52", port)

    def instance(node: str, address: str, service_id: str) -> dict[str, Any]:
        # The `protocol` meta makes the port HTTP, so the client gets an HTTP route by hostname.
        return {
            "Node": node,
            "Address": address,
            "Service": {"ID": service_id, "Service": "orders", "Port": port, "Meta": {"protocol": "http"}},
        }

    consul = mesh.consul()
    consul.register(instance("vm-1", "127.0.0.51", "orders-1"))
    server = mesh.serve(consul=consul.address)
    envoy = mesh.envoy(server)
    host = "orders.service.consul"
    cluster = f"outbound|{port}||{host}"
    wait_for(served_by(port, host, {"orders-1"}), "the Consul instance serves")

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        consul.register(instance("vm-2", "127.0.0.52", "orders-2"))
        wait_for(lambda: envoy_hosts(envoy, cluster) == {"127.0.0.51", "127.0.0.52"}, "Envoy gets vm-2", CONVERGE)
        wait_for(served_by(port, host, {"orders-1", "orders-2"}), "both instances serve")
        consul.deregister({"Node": "vm-1", "ServiceID": "orders-1"})
        wait_for(lambda: envoy_hosts(envoy, cluster) == {"127.0.0.52"}, "Envoy drops vm-1", CONVERGE)
        assert answers(port, host, 20) == Counter({"orders-2": 20})
    assert loop.failures == []


def test_a_restart_while_consul_is_down_keeps_envoys_consul_clusters_until_consul_returns(mesh: Mesh) -> None:
    """Restarted during a Consul outage, the server refuses Envoy's reconnects (UNAVAILABLE, as
    istiod does) instead of sending it a mesh without Consul's services; Envoy keeps serving
    what it had, and gets the whole mesh once Consul is back."""
    port = free_port()
    mesh.backend("billing-1", "127.0.0.61", port)
    consul = mesh.consul()
    consul.register(
        {
            "Node": "vm-1",
            "Address": "127.0.0.61",
            "Service": {"ID": "billing-1", "Service": "billing", "Port": port, "Meta": {"protocol": "http"}},
        }
    )
    server = mesh.serve(consul=consul.address, extra_args=["--registry-sync-timeout", "120"])
    envoy = mesh.envoy(server)
    host, cluster = "billing.service.consul", f"outbound|{port}||billing.service.consul"
    wait_for(served_by(port, host, {"billing-1"}), "the Consul instance serves")

    consul.stop()
    server.restart(ready=False)
    time.sleep(3)  # Envoy retries meanwhile; each retry is refused
    assert not server.ready()
    assert envoy_stats(envoy, "control_plane.connected_state") == {"control_plane.connected_state": 0}
    assert envoy_hosts(envoy, cluster) == {"127.0.0.61"}
    assert answers(port, host, 5) == Counter({"billing-1": 5})

    consul.start()
    wait_for(server.ready, "the server ready once Consul synced", CONVERGE)
    # Envoy backs off between refused reconnects (up to 30 s by default), so its next try may
    # come a while after the server is ready again.
    wait_for(lambda: synced(server), "Envoy back in sync", 45)
    assert envoy_hosts(envoy, cluster) == {"127.0.0.61"}
    assert answers(port, host, 5) == Counter({"billing-1": 5})


def test_a_config_envoy_rejects_is_an_error_and_the_last_good_config_keeps_serving(mesh: Mesh) -> None:
    port = free_port()
    mesh.backend("pay-v1", "127.0.0.31", port)
    mesh.write("pay.yaml", service_entry("pay", port), workload_entry("pay-v1", "127.0.0.31", "pay", "v1"))
    mesh.write("pay-dr.yaml", destination_rule("pay", ["v1"]))
    server = mesh.serve()
    envoy = mesh.envoy(server)
    host = f"pay.{NS}.mesh"
    wait_for(served_by(port, host, {"pay-v1"}), "pay-v1 serves")
    wait_for(lambda: synced(server), "proxy-status SYNCED")
    rejects_before = metric(server, "pilot_total_xds_rejects", 'type="cds"')

    # Valid Istio (meshctl validate agrees), but Envoy reads the CA file when it builds the
    # cluster and refuses the cluster when the file does not exist.
    missing_ca = mesh.dir.parent / "no-such-dir" / "ca.pem"
    tls = f"  trafficPolicy:\n    tls:\n      mode: SIMPLE\n      caCertificates: {missing_ca}\n"
    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        mesh.write("pay-dr.yaml", destination_rule("pay", ["v1"], traffic_policy=tls))
        validate = subprocess.run(
            [*meshctl_command(), "validate", str(mesh.dir)], capture_output=True, text=True, timeout=60, check=False
        )
        assert validate.returncode == 0, validate.stdout + validate.stderr

        wait_for(lambda: proxy_status(server)[CLIENT]["CDS"] == "ERROR", "proxy-status shows CDS ERROR", CONVERGE)
        nack = next(e for e in server.admin_json("/debug/syncz") if e["proxy"] == CLIENT)["types"]["CDS"]["nack"]
        assert str(missing_ca) in nack, nack
        assert metric(server, "pilot_total_xds_rejects", 'type="cds"') > rejects_before
        assert envoy_stats(envoy, "cluster_manager.cds.update_rejected")["cluster_manager.cds.update_rejected"] > 0
        # Envoy kept the cluster it had: plaintext to pay-v1 still works.
        mark = loop.mark()
        loop.wait_for_answers(20)
        assert loop.since(mark) == Counter({"pay-v1": loop.since(mark).total()})

        # Fixing the file clears the error, and traffic never stopped.
        mesh.write("pay-dr.yaml", destination_rule("pay", ["v1"]))
        wait_for(lambda: synced(server), "proxy-status SYNCED again after the fix", CONVERGE)
        loop.wait_for_answers(5)
    assert loop.failures == []


class Steps:
    """What a test changed and when, to name the change behind each failed request."""

    def __init__(self) -> None:
        self._steps: list[tuple[float, str]] = [(0.0, "start")]

    def __call__(self, what: str) -> None:
        self._steps.append((time.monotonic(), what))

    def explain(self, failures: list[Failure]) -> str:
        lines = []
        for f in failures:
            step = max((s for s in self._steps if s[0] <= f.at), key=lambda s: s[0])
            lines.append(f"  {f.status} {f.error!r} {f.at - step[0]:.3f}s after: {step[1]}")
        return "\n".join(lines)


def traffic(versions: list[str], weights: dict[str, int]) -> str:
    """The cart's DestinationRule and VirtualService in one file, so one change carries both."""
    return destination_rule("cart", versions) + "---\n" + virtual_service("cart", weights)


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_route_flips_and_cluster_churn_lose_no_request(mesh: Mesh, delta: bool) -> None:
    port = free_port()
    other_port = free_port()
    mesh.backend("cart-v1", "127.0.0.61", port)
    mesh.backend("cart-v2", "127.0.0.62", port)
    mesh.backend("cart-v3", "127.0.0.63", port)
    mesh.backend("extra", "127.0.0.64", other_port)
    mesh.write(
        "cart.yaml",
        service_entry("cart", port),
        workload_entry("cart-v1", "127.0.0.61", "cart", "v1"),
        workload_entry("cart-v2", "127.0.0.62", "cart", "v2"),
        workload_entry("cart-v3", "127.0.0.63", "cart", "v3"),
        workload_entry("extra", "127.0.0.64", "extra", "v1"),
    )
    mesh.write("cart-traffic.yaml", traffic(["v1", "v2"], {"v1": 100, "v2": 0}))
    server = mesh.serve()
    envoy = mesh.envoy(server, delta=delta)
    host = f"cart.{NS}.mesh"
    wait_for(served_by(port, host, {"cart-v1"}), "cart-v1 serves")

    step = Steps()
    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        for flip in range(20):
            target = "v2" if flip % 2 == 0 else "v1"
            mark = loop.mark()
            weights = {"v1": 0, "v2": 100} if target == "v2" else {"v1": 100, "v2": 0}
            step(f"flip {flip} to {target}")
            mesh.write("cart-traffic.yaml", traffic(["v1", "v2"], weights))
            wait_for(lambda t=target, m=mark: loop.settled_on(f"cart-{t}", m), f"flip {flip} to {target}", CONVERGE)

        # Eight rounds: a route that names a cluster before its endpoints reach Envoy fails only
        # the requests of that instant, so one round could pass by luck.
        for round_ in range(8):
            # A new subset (a new cluster) and the route to it in one change...
            mark = loop.mark()
            step(f"round {round_}: add subset v3 and route to it")
            mesh.write("cart-traffic.yaml", traffic(["v1", "v2", "v3"], {"v3": 100}))
            wait_for(lambda m=mark: loop.settled_on("cart-v3", m), f"round {round_}: traffic on v3", CONVERGE)
            # ...then the route away from it and the cluster's removal in one change: the
            # cluster must outlive the route that named it.
            mark = loop.mark()
            step(f"round {round_}: route to v1 and remove subset v3")
            mesh.write("cart-traffic.yaml", traffic(["v1", "v2"], {"v1": 100}))
            wait_for(lambda m=mark: loop.settled_on("cart-v1", m), f"round {round_}: traffic back on v1", CONVERGE)
            wait_for(
                lambda: f"CDS/outbound|{port}|v3|{host}" not in dynamic_versions(envoy),
                f"round {round_}: the v3 cluster is removed",
                CONVERGE,
            )
            if round_ >= 2:
                continue
            # A whole ServiceEntry on its own port (a listener, a route config, a cluster) comes
            # and goes.
            step(f"round {round_}: add ServiceEntry extra")
            mesh.write("extra.yaml", service_entry("extra", other_port))
            wait_for(served_by(other_port, f"extra.{NS}.mesh", {"extra"}), f"round {round_}: extra serves", CONVERGE)
            step(f"round {round_}: remove ServiceEntry extra")
            mesh.remove("extra.yaml")
            wait_for(
                lambda: f"CDS/outbound|{other_port}||extra.{NS}.mesh" not in dynamic_versions(envoy),
                f"round {round_}: the extra cluster is removed",
                CONVERGE,
            )
        step("done")
        loop.wait_for_answers(5)
    failures = loop.failures
    assert failures == [], f"{len(failures)} of {loop.succeeded + len(failures)} failed:\n{step.explain(failures)}"
    assert loop.succeeded > 100
    assert envoy_stats(envoy, "cluster_manager.cds.update_rejected")["cluster_manager.cds.update_rejected"] == 0
    wait_for(lambda: synced(server), "proxy-status SYNCED at the end")


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_restarting_serve_on_the_same_ports_loses_no_request_and_changes_nothing(mesh: Mesh, delta: bool) -> None:
    port = free_port()
    mesh.backend("shop-v1", "127.0.0.71", port)
    mesh.backend("shop-v2", "127.0.0.72", port)
    shop = (
        service_entry("shop", port),
        workload_entry("shop-v1", "127.0.0.71", "shop", "v1"),
        workload_entry("shop-v2", "127.0.0.72", "shop", "v2"),
        destination_rule("shop", ["v1", "v2"]),
        virtual_service("shop", {"v1": 50, "v2": 50}, header_subset="v2"),
    )
    mesh.write("shop.yaml", *shop)
    server = mesh.serve()
    envoy = mesh.envoy(server, delta=delta)
    host = f"shop.{NS}.mesh"
    wait_for(served_by(port, host, {"shop-v1", "shop-v2"}), "both versions serve")
    wait_for(lambda: synced(server), "proxy-status SYNCED")
    churn = (
        "cluster_manager.cluster_added",
        "cluster_manager.cluster_modified",
        "cluster_manager.cluster_removed",
        "listener_manager.listener_added",
        "listener_manager.listener_modified",
        "listener_manager.listener_removed",
    )
    before_versions = dynamic_versions(envoy)
    before_churn = envoy_stats(envoy, *churn)
    assert any(k.startswith("RDS/") for k in before_versions) and any(k.startswith("EDS/") for k in before_versions)

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        xds_port, admin_port = server.xds_port, server.admin_port
        server.stop()
        wait_for(
            lambda: envoy_stats(envoy, "control_plane.connected_state")["control_plane.connected_state"] == 0,
            "Envoy notices the server is gone",
        )
        loop.wait_for_answers(20)  # Envoy serves on its last config meanwhile
        server.start()
        assert (server.xds_port, server.admin_port) == (xds_port, admin_port)
        wait_for(lambda: settled(server), "Envoy reconnects to the new process and holds all it was sent")
        loop.wait_for_answers(20)
        after_versions = dynamic_versions(envoy)
        after_churn = envoy_stats(envoy, *churn)
        status_after_reconnect = proxy_status(server)[CLIENT]
        # The new stream carries changes as the old one did.
        mark = loop.mark()
        mesh.write("shop.yaml", *shop[:-1], virtual_service("shop", {"v2": 100}))
        wait_for(lambda: loop.settled_on("shop-v2", mark), "a change after the restart moves traffic", CONVERGE)
    assert loop.failures == []
    assert after_versions == before_versions
    assert after_churn == before_churn
    # An operator looking right after the restart sees the proxy in sync, not "NOT SENT".
    assert {t: status_after_reconnect[t] for t in ("CDS", "EDS", "LDS", "RDS")} == dict.fromkeys(
        ("CDS", "EDS", "LDS", "RDS"), "SYNCED"
    )
