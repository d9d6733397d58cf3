"""Three `meshctl serve` replicas and two real Envoys with traffic, fed from git and from Consul KV.

This is docs/replicas.md run on loopback, from each config source it offers:

- **git**: a repository, the shipped `systemd/meshctl-git-sync` script keeping one directory at its
  newest commit by a symlink swap, and three replicas serving that directory;
- **kv**: `meshctl kv push` writing the tree into the fake Consul's KV, and three replicas serving
  the prefix with `--config-consul-kv`.

Two Envoys (two client VMs: each bootstrap names all three replicas) send requests the whole time.
The replica one of them is on is killed: neither loses a request, the moved one is back on a live
replica within seconds, and neither holds a new version of anything, nor drained a listener. Then
a change is published (a commit synced, or a `kv push`) while the two Envoys are on different
replicas, and traffic through both moves.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import needs_envoy
from test_e2e_serve import (
    CLIENT,
    NS,
    destination_rule,
    dynamic_versions,
    envoy_stats,
    service_entry,
    virtual_service,
    wait_for,
    workload_entry,
)
from test_replica_failover import GIT_SYNC, git

from meshctl.testing.backends import Backend, RequestLoop, send
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]
pytest_plugins = ["test_consul_registry"]  # its session-wide `consul_agent` fixture

#: The second client VM: another namespace, whose Sidecar binds its outbound listener on its
#: own loopback address (two Envoys on one host cannot both bind 127.0.0.1:PORT).
OTHER_NS = "e2e-other"
OTHER_IP = "127.0.0.8"
OTHER_CLIENT = f"sidecar~{OTHER_IP}~client.{OTHER_NS}~{OTHER_NS}.svc.cluster.local"
HOST = f"web.{NS}.mesh"
PREFIX = "meshctl/mesh"
#: Listener churn Envoy counts: none of it may move when a proxy changes replica.
CHURN = (
    "listener_manager.listener_added",
    "listener_manager.listener_modified",
    "listener_manager.listener_removed",
    "listener_manager.total_listeners_draining",
    "cluster_manager.cluster_modified",
    "cluster_manager.cluster_removed",
)


def other_sidecar(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: default
  namespace: {OTHER_NS}
spec:
  egress:
  - port:
      number: {port}
      protocol: HTTP
      name: http
    bind: {OTHER_IP}
    hosts:
    - "{NS}/*"
"""


class Source:
    """Where the three replicas read their config from, and how a change is published there."""

    def __init__(self, root: Path, *, consul: str | None = None) -> None:
        self.root = root
        self.tree = root / "tree"  # what CI would hold: the repository's working tree
        self.tree.mkdir()
        #: the Consul whose KV holds the config; None: a git repository
        self.consul = consul
        if consul is None:
            git(self.tree, "init", "--quiet", "--initial-branch", "main")

    def write(self, files: dict[str, str]) -> None:
        """Replace the tree with `files` and publish it."""
        for old in self.tree.glob("*.yaml"):
            old.unlink()
        for name, text in files.items():
            (self.tree / name).write_text(text)
        if self.consul is not None:
            command = [*meshctl_command(), "kv", "push", str(self.tree), "--prefix", PREFIX]
            proc = subprocess.run(
                [*command, "--consul", self.consul], capture_output=True, text=True, timeout=60, check=False
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return
        git(self.tree, "add", "-A")
        git(self.tree, "commit", "--quiet", "-m", f"{len(files)} files")
        env = {
            "PATH": os.environ["PATH"],
            "MESHCTL_GIT_URL": str(self.tree),
            "MESHCTL_GIT_STATE": str(self.root / "sync"),
        }
        proc = subprocess.run(["/bin/sh", str(GIT_SYNC)], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr

    def replica(self, state: Path) -> ServeProcess:
        extra = ["--state-dir", str(state)]
        if self.consul is not None:
            return ServeProcess([], consul=self.consul, extra_args=[*extra, "--config-consul-kv", PREFIX])
        return ServeProcess([self.root / "sync" / "current"], extra_args=extra)


class Replicas:
    """The running replicas, and which one holds a proxy's stream (their `/debug/syncz`)."""

    def __init__(self, servers: list[ServeProcess]) -> None:
        self.servers = servers

    def live(self) -> list[ServeProcess]:
        return [s for s in self.servers if s.pid is not None]

    def holder(self, node: str) -> ServeProcess | None:
        """The one live replica that holds `node` with every type ACKed; None while it moves."""
        held = []
        for server in self.live():
            for entry in server.admin_json("/debug/syncz"):
                if entry["proxy"] == node:
                    types = entry["types"]
                    if set(types) >= {"CDS", "EDS", "LDS", "RDS"} and all(
                        not t["nack"] and t["acked"] == t["sent"] for t in types.values()
                    ):
                        held.append(server)
        return held[0] if len(held) == 1 else None


def held(replicas: Replicas, node: str) -> ServeProcess:
    wait_for(lambda: replicas.holder(node) is not None, f"one replica holds {node} with all it sent ACKed")
    server = replicas.holder(node)
    assert server is not None
    return server


@pytest.fixture(params=["git", "kv", "kv-agent"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Source, ExitStack]]:
    """The config source: git, the fake Consul's KV, or a real `consul agent -dev` when the
    binary is on PATH (skipped otherwise)."""
    with ExitStack() as stack:
        if request.param == "git":
            if shutil.which("git") is None:
                pytest.skip("needs git")
            yield Source(tmp_path), stack
        elif request.param == "kv":
            yield Source(tmp_path, consul=stack.enter_context(FakeConsul()).address), stack
        else:
            # The session's agent is shared: a prefix of this test's own would be needed
            # if another test wrote under PREFIX; none does.
            yield Source(tmp_path, consul=request.getfixturevalue("consul_agent")), stack


def test_three_replicas_two_envoys_lose_nothing_when_one_dies_and_a_change_reaches_both(
    source: tuple[Source, ExitStack], tmp_path: Path
) -> None:
    config, stack = source
    port = free_port()
    for name, address in (("web-v1", "127.0.0.21"), ("web-v2", "127.0.0.22")):
        stack.enter_context(Backend(name, address, port))
    web = (
        service_entry("web", port),
        workload_entry("web-v1", "127.0.0.21", "web", "v1"),
        workload_entry("web-v2", "127.0.0.22", "web", "v2"),
        destination_rule("web", ["v1", "v2"]),
    )
    files = {"web.yaml": "---\n".join(web), "routes.yaml": virtual_service("web", {"v1": 100})}
    files["other.yaml"] = other_sidecar(port)
    config.write(files)

    # One CA for all: the root is made once (`meshctl ca root`: a replica refuses to make one of
    # its own), and every replica starts from a copy of that state directory (docs/replicas.md).
    made = subprocess.run(
        [*meshctl_command(), "ca", "root", "--state-dir", str(tmp_path / "state-0")], capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    servers = [config.replica(tmp_path / "state-0")]
    stack.enter_context(servers[0])
    for i in (1, 2):
        shutil.copytree(tmp_path / "state-0", tmp_path / f"state-{i}")
        servers.append(stack.enter_context(config.replica(tmp_path / f"state-{i}")))
    for server in servers:
        stack.callback(lambda s=server: print(f"--- serve {s.xds_address}:\n{s.log()[-4000:]}"))
    replicas = Replicas(servers)
    addresses = [f for s in servers[1:] for f in ("--xds-address", s.xds_address)]
    bootstraps = {node: servers[0].bootstrap(node, extra_args=addresses) for node in (CLIENT, OTHER_CLIENT)}
    envoys: dict[str, EnvoyProcess] = {}

    def start_envoy(node: str) -> EnvoyProcess:
        envoy = EnvoyProcess(bootstraps[node])
        envoy.start()
        stack.callback(envoy.stop)
        stack.callback(lambda: print(f"--- envoy {node} log:\n{envoy.log()[-3000:]}"))
        envoys[node] = envoy
        return envoy

    start_envoy(CLIENT)
    first = held(replicas, CLIENT)
    start_envoy(OTHER_CLIENT)
    # Envoy picks a replica at random: start the second one again until it is on another
    # replica than the first, so the kill below leaves one Envoy where it was.
    for _ in range(12):
        if held(replicas, OTHER_CLIENT) is not first:
            break
        envoys[OTHER_CLIENT].stop()
        start_envoy(OTHER_CLIENT)
    assert held(replicas, OTHER_CLIENT) is not first

    loops = {
        CLIENT: RequestLoop(port, HOST),
        OTHER_CLIENT: RequestLoop(port, HOST, address=OTHER_IP),
    }
    for loop in loops.values():
        stack.enter_context(loop)
    for loop in loops.values():
        loop.wait_for_answers(5)
    before = {node: config_versions(envoy) for node, envoy in envoys.items()}
    churn = {node: envoy_stats(envoy, *CHURN) for node, envoy in envoys.items()}
    assert all(before.values())

    # Kill the replica the first Envoy is on, as a host dies: no goodbye.
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    moved = held(Replicas([s for s in servers if s is not first]), CLIENT)
    took = time.monotonic() - killed
    first.stop()  # reaps the process; the others no longer count it
    marks = {node: loop.mark() for node, loop in loops.items()}
    for node, loop in loops.items():
        wait_for(lambda loop=loop, node=node: loop.mark() >= marks[node] + 10, f"requests keep flowing via {node}")
    assert took < 10, took
    for node, envoy in envoys.items():
        assert config_versions(envoy) == before[node], f"{node} was sent new versions after the failover"
        assert envoy_stats(envoy, *CHURN) == churn[node], f"{node} changed or drained a listener or cluster"
    assert {node: loop.failures for node, loop in loops.items()} == {CLIENT: [], OTHER_CLIENT: []}

    # The change goes out while the two Envoys are on different replicas.
    if moved is held(replicas, OTHER_CLIENT):
        loops[OTHER_CLIENT].stop()
        for _ in range(12):
            envoys[OTHER_CLIENT].stop()
            start_envoy(OTHER_CLIENT)
            if held(replicas, OTHER_CLIENT) is not moved:
                break
        loops[OTHER_CLIENT].start()
    holders = {node: held(replicas, node) for node in envoys}
    assert holders[CLIENT] is not holders[OTHER_CLIENT]

    # A route change, and a new service: its cluster is new to Envoys whose streams were
    # resumed with nothing sent, and they must be sent its endpoints when they ask.
    marks = {node: loop.mark() for node, loop in loops.items()}
    stack.enter_context(Backend("shop-v1", "127.0.0.23", port))
    shop = (service_entry("shop", port), workload_entry("shop-v1", "127.0.0.23", "shop", "v1"))
    config.write({**files, "routes.yaml": virtual_service("web", {"v2": 100}), "shop.yaml": "---\n".join(shop)})
    for node, loop in loops.items():
        wait_for(lambda loop=loop, node=node: loop.settled_on("web-v2", marks[node]), f"the change reaches {node}")
        address = OTHER_IP if node == OTHER_CLIENT else "127.0.0.1"
        wait_for(
            lambda address=address: send(port, f"shop.{NS}.mesh", address=address).backend == "shop-v1",
            f"the new service is reached through {node}",
        )
        assert held(replicas, node) is holders[node]  # and through the replica it was on
    for node, loop in loops.items():
        assert loop.failures == [], node


def config_versions(envoy: EnvoyProcess) -> dict[str, tuple[str, str]]:
    """Every listener, cluster and route configuration Envoy holds, with its version and the time
    it was last updated: anything sent again with a new version shows here."""
    return {k: v for k, v in dynamic_versions(envoy).items() if not k.startswith("EDS/")}
