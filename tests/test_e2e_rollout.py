"""End to end: staged rollout, rollback and the push history, with three real Envoys.

One `meshctl serve` (its config directory a git checkout) and three client VMs, each in its own
namespace with its outbound listener on its own loopback address, calling `web` (two backends,
v1 and v2, chosen by a VirtualService). The canary VM's Envoy runs with a lower RE2 program size
limit in its runtime layer, as an older or hardened fleet would: a VirtualService regex the
others accept is one it refuses.

- A change the canary refuses: the canary NACKs, the two others are never sent the version,
  `rollout status` and `proxy-status` say so, and all three still route on the previous one.
  A good change then reaches the canary first and the others only after the soak, by the
  history's own timestamps.
- Two good versions, then `rollout rollback` to the first under a request loop through every
  Envoy: each one's config dump shows the first version's versions again, no request fails.
- The history survives a restart of `serve`, keeps `--history-size` versions, and names the
  commit of the checkout (dirty when the tree is).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import DEADLINE, needs_envoy, runner
from test_e2e_serve import destination_rule, dynamic_versions, service_entry, wait_for, workload_entry

from meshctl.cli.app import app
from meshctl.testing.backends import Backend, RequestLoop
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"web.{NS}.mesh"
#: Works under Istio's RE2 limit (program size 1336), refused under the canary's.
REGEX = "^/(alpha|beta|gamma|delta|epsilon){20,40}/[a-z0-9]{1,64}$"
CANARY_RE2_LIMIT = 1000
SOAK = 3.0
#: The client VMs: namespace -> loopback address; the first is the canary.
CLIENTS = {"c-a": "127.0.0.61", "c-b": "127.0.0.62", "c-c": "127.0.0.63"}
CANARY = "c-a"


def node(namespace: str) -> str:
    return f"sidecar~{CLIENTS[namespace]}~client.{namespace}~{namespace}.svc.cluster.local"


def client(namespace: str, port: int) -> str:
    """A client VM: its WorkloadEntry (the canary's labelled `track: canary`) and a Sidecar that
    binds its outbound listener on its own address (three Envoys on one host)."""
    track = "\n    track: canary" if namespace == CANARY else ""
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client, namespace: {namespace}}}
spec:
  address: {CLIENTS[namespace]}
  labels:
    app: client{track}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {namespace}}}
spec:
  egress:
  - port: {{number: {port}, protocol: HTTP, name: http}}
    bind: {CLIENTS[namespace]}
    hosts: ["{NS}/*"]
"""


def routes(subset: str, *, regex: bool = False) -> str:
    """Every request to `subset`; with `regex`, also a route matching REGEX (to v2)."""
    match = ""
    if regex:
        match = f"""  - name: regex
    match:
    - uri: {{regex: "{REGEX}"}}
    route:
    - destination: {{host: {HOST}, subset: v2}}
"""
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  http:
{match}  - name: default
    route:
    - destination: {{host: {HOST}, subset: {subset}}}
"""


def git(tree: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


class Fleet:
    """The config checkout, the backends, `meshctl serve`, three Envoys and a request loop each.

    With `consul`, the checkout is pushed to its KV (`meshctl kv push`) and served by two
    replicas following the prefix: the canary's Envoy on the first, the others on the second."""

    def __init__(self, root: Path, stack: ExitStack, serve_args: list[str], consul: FakeConsul | None = None) -> None:
        self.root = root
        self.consul = consul
        self.dir = root / "mesh"
        self.dir.mkdir()
        git(self.dir, "init", "--quiet", "--initial-branch", "main")
        self.port = port = free_port()
        for name, address in (("web-v1", "127.0.0.21"), ("web-v2", "127.0.0.22")):
            stack.enter_context(Backend(name, address, port))
        web = (
            service_entry("web", port),
            workload_entry("web-v1", "127.0.0.21", "web", "v1"),
            workload_entry("web-v2", "127.0.0.22", "web", "v2"),
            destination_rule("web", ["v1", "v2"]),
        )
        (self.dir / "web.yaml").write_text("---\n".join(web))
        for namespace in CLIENTS:
            (self.dir / f"{namespace}.yaml").write_text(client(namespace, port))
        self.commit("routes.yaml", routes("v1"))
        self.token = root / "admin-token"
        self.token.write_text("s3cret\n")
        self.servers: list[ServeProcess] = []
        if consul is not None:
            # Replicas share one CA: the root is made once and each replica starts from a copy of
            # that state directory (a replica refuses to make a root of its own; docs/replicas.md).
            made = subprocess.run(
                [*meshctl_command(), "ca", "root", "--state-dir", str(root / "state-0")],
                capture_output=True,
                check=False,
            )
            assert made.returncode == 0, made.stderr
            shutil.copytree(root / "state-0", root / "state-1")
        for i in range(1 if consul is None else 2):
            args = ["--state-dir", str(root / f"state-{i}"), "--admin-token-file", str(self.token), *serve_args]
            if consul is None:
                server = ServeProcess([self.dir], extra_args=args)
            else:
                args += ["--config-consul-kv", "meshctl/mesh", "--registry-sync-timeout", "1"]
                server = ServeProcess([], consul=consul.address, extra_args=args)
            self.servers.append(stack.enter_context(server))
            stack.callback(lambda s=server, i=i: print(f"--- meshctl serve {i} log:\n{s.log()[-8000:]}"))
        self.server = self.servers[0]
        #: the replica each client's Envoy is on
        self.on = {ns: self.servers[0 if ns == CANARY else -1] for ns in CLIENTS}
        self.envoys: dict[str, EnvoyProcess] = {}
        for namespace in CLIENTS:
            config = self.on[namespace].bootstrap(node(namespace))
            if namespace == CANARY:
                layer = config["layered_runtime"]["layers"][0]["static_layer"]
                layer["re2.max_program_size.error_level"] = CANARY_RE2_LIMIT
            envoy = self.envoys[namespace] = EnvoyProcess(config)
            stack.enter_context(envoy)
            stack.callback(lambda e=envoy, n=namespace: print(f"--- envoy {n} log:\n{e.log()[-3000:]}"))
        self.loops = {ns: stack.enter_context(RequestLoop(port, HOST, address=ip)) for ns, ip in CLIENTS.items()}

    def commit(self, name: str, text: str) -> str:
        """Write a file (a temporary file renamed over it, as editors do) and commit it."""
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)
        git(self.dir, "add", "-A")
        git(self.dir, "commit", "--quiet", "-m", f"{name}")
        if self.consul is not None:
            where = ["--prefix", "meshctl/mesh", "--consul", self.consul.address]
            pushed = runner.invoke(app, ["kv", "push", str(self.dir), *where])
            assert pushed.exit_code == 0, pushed.output
        return git(self.dir, "rev-parse", "HEAD")

    def cli(self, *args: str, code: int | None = 0, on: ServeProcess | None = None) -> Any:
        """A meshctl command against a server's admin address with its token; its JSON output."""
        flag = "--admin" if args[0] == "proxy-status" else "--server"
        full = [*args, flag, (on or self.server).admin_address, "--admin-token-file", str(self.token)]
        result = runner.invoke(app, full)
        if code is not None:
            assert result.exit_code == code, (full, result.output)
        return json.loads(result.stdout) if "-o" in args and result.stdout.strip() else result

    def all_on(self, backend: str) -> bool:
        marks = {ns: loop.mark() for ns, loop in self.loops.items()}
        time.sleep(0.3)
        return all(loop.settled_on(backend, marks[ns], count=3) for ns, loop in self.loops.items())

    def latest(self, on: ServeProcess | None = None) -> str:
        return str(self.cli("rollout", "status", "-o", "json", code=None, on=on)["latest"])

    def entry(self, version: str, on: ServeProcess | None = None) -> dict[str, Any]:
        found: dict[str, Any] = self.cli("history", version, "-o", "json", on=on)
        return found

    def proxy_versions(self) -> dict[str, str]:
        out = {}
        for server in self.servers:
            rows = self.cli("proxy-status", "-o", "json", code=None, on=server)
            out |= {row["proxy"]: row["version"] for row in rows}
        return out


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    args, replicas = request.param if isinstance(request.param, tuple) else (request.param, False)
    with ExitStack() as stack:
        consul = stack.enter_context(FakeConsul()) if replicas else None
        yield Fleet(tmp_path, stack, list(args), consul)


def xds_versions(envoy: EnvoyProcess) -> dict[str, str]:
    """The version each listener, cluster and route configuration in Envoy came with."""
    return {k: v for k, (v, _) in dynamic_versions(envoy).items() if not k.startswith("EDS/")}


CANARY_ARGS = ["--canary", "track=canary", "--canary-soak", f"{SOAK:g}s"]


@pytest.mark.parametrize(
    "fleet", [(CANARY_ARGS, False), (CANARY_ARGS, True)], indirect=True, ids=["one-server", "two-replicas"]
)
def test_a_canary_nack_holds_the_fleet_and_a_good_change_reaches_it_after_the_soak(fleet: Fleet) -> None:
    """With two replicas (sharing Consul KV), the canary is on one and the others on the other:
    the hold and the promotion apply to both."""
    fleet_side = fleet.servers[-1]
    wait_for(lambda: fleet.all_on("web-v1"), "every Envoy routes to v1")
    first = fleet.latest()
    before = {ns: xds_versions(envoy) for ns, envoy in fleet.envoys.items()}

    # A regex the canary's Envoy refuses: it NACKs, and the fleet stays where it was.
    fleet.commit("routes.yaml", routes("v2", regex=True))
    wait_for(lambda: fleet.latest() != first, "the server builds the new version")
    bad = fleet.latest()
    wait_for(lambda: "nacked" in fleet.entry(bad)["proxies"].get(node(CANARY), {}).get("RDS", {}), "the canary's NACK")
    entry = fleet.entry(bad)
    assert "program size" in entry["proxies"][node(CANARY)]["RDS"]["error"]
    [change] = entry["changes"]
    assert (change["kind"], change["name"], change["change"]) == ("VirtualService", f"{NS}/web", "changed")
    assert "routes.yaml:1" in change["source"], change
    for server in fleet.servers:  # the hold is fleet-wide: the canary's replica and the other
        wait_for(lambda server=server: fleet.latest(server) == bad, "every replica builds it")
        status_of = lambda server=server: fleet.cli("rollout", "status", "-o", "json", code=None, on=server)  # noqa: E731
        # A replica that builds the version after the hold was decided on the other one stages
        # it, then takes the hold from the shared state: held once that is read.
        wait_for(lambda status_of=status_of: status_of()["state"] == "held", "the replica holds the rollout")
        status = status_of()
        assert status["state"] == "held" and node(CANARY) in status["held"], status
        assert status["fleet"] == first and status["candidate"] == bad
        assert "meshctl_rollout_held 1" in server.admin("/metrics")
    versions = fleet.proxy_versions()
    assert versions == {node(CANARY): bad, node("c-b"): first, node("c-c"): first}
    admins = [a for server in fleet.servers for a in ("--admin", server.admin_address)]
    table = runner.invoke(app, ["proxy-status", *admins, "--admin-token-file", str(fleet.token)])
    assert table.exit_code == 1  # the canary shows ERROR
    assert f"{bad[:12]} (canary)" in table.stdout and first[:12] in table.stdout, table.stdout
    time.sleep(SOAK + 1)  # past the soak: a held version still goes nowhere
    assert set(fleet.entry(bad)["proxies"]) == {node(CANARY)}, "the others were sent the refused version"
    assert not fleet.entry(bad, on=fleet_side)["proxies"].keys() - {node(CANARY)}
    assert fleet.all_on("web-v1"), "traffic left the previous version"
    for ns in ("c-b", "c-c"):
        assert xds_versions(fleet.envoys[ns]) == before[ns], ns

    # A good change: the canary first, the others once it ACKed and the soak is over.
    fleet.commit("routes.yaml", routes("v2"))
    wait_for(lambda: fleet.latest() not in (first, bad), "the server builds the good version")
    good = fleet.latest()
    wait_for(lambda: fleet.all_on("web-v2"), "every Envoy routes to v2", timeout=DEADLINE + SOAK)
    # Envoy applies a config before its ACK reaches the server (traffic can move first), and the
    # server may read the ACK before its write of the push returns: the history has it anyway.
    wait_for(
        lambda: all("acked" in t for t in fleet.entry(good)["proxies"][node(CANARY)].values()),
        "the canary's ACKs of the good version in the history",
    )
    # The fleet is promoted once every canary ACKed and the soak is over (the rollout's own
    # record, on whichever replica promoted): the others are sent the version after that.
    entry, others = fleet.entry(good), fleet.entry(good, on=fleet_side)
    canary_sent = min(t["sent"] for t in entry["proxies"][node(CANARY)].values())
    staged = min(entry["rollout"]["canary"], others["rollout"]["canary"])
    promoted = [e["rollout"]["fleet"] for e in (entry, others) if "fleet" in e["rollout"]]
    assert promoted, (entry["rollout"], others["rollout"])
    assert min(promoted) - staged >= SOAK - 0.5, (entry["rollout"], others["rollout"])
    for ns in ("c-b", "c-c"):
        sent = min(t["sent"] for t in others["proxies"][node(ns)].values())
        assert sent >= canary_sent and sent >= min(promoted), (ns, sent, canary_sent, promoted)
        assert sent - staged >= SOAK - 0.5, (ns, sent, entry["rollout"], others["rollout"])
    for server in fleet.servers:
        status = fleet.cli("rollout", "status", "-o", "json", code=None, on=server)
        assert status["state"] == "complete", status
    assert all(loop.failures == [] for loop in fleet.loops.values())


@pytest.mark.parametrize("fleet", [["--history-size", "3"]], indirect=True)
def test_rollback_brings_every_envoy_back_without_a_failed_request_and_history_survives_restart(
    fleet: Fleet,
) -> None:
    wait_for(lambda: fleet.all_on("web-v1"), "every Envoy routes to v1")
    first = fleet.latest()
    wait_for(lambda: first in fleet.cli("rollout", "status", "-o", "json")["rollback_versions"], "v1 acked by all")
    at_first = {ns: xds_versions(envoy) for ns, envoy in fleet.envoys.items()}
    commit = fleet.commit("routes.yaml", routes("v2"))
    wait_for(lambda: fleet.all_on("web-v2"), "every Envoy routes to v2")
    second = fleet.latest()
    assert second != first
    wait_for(lambda: second in fleet.cli("rollout", "status", "-o", "json")["rollback_versions"], "v2 acked by all")
    assert fleet.entry(second)["git"] == [{"dir": str(fleet.dir), "commit": commit, "dirty": False}]

    marks = {ns: loop.mark() for ns, loop in fleet.loops.items()}
    fleet.cli("rollout", "rollback", first)
    wait_for(lambda: fleet.all_on("web-v1"), "every Envoy routes to v1 again")
    for ns, envoy in fleet.envoys.items():
        wait_for(lambda envoy=envoy, ns=ns: xds_versions(envoy) == at_first[ns], f"{ns} holds the first versions")
    assert all(loop.failures == [] for loop in fleet.loops.values())
    assert all(loop.mark() > marks[ns] for ns, loop in fleet.loops.items())
    assert f"pinned to version {first}" in fleet.server.admin("/ready")
    assert "meshctl_rollout_pinned 1" in fleet.server.admin("/metrics")
    assert fleet.cli("rollout", "status", "-o", "json", code=1)["pinned"] == first
    assert set(fleet.proxy_versions().values()) == {first}

    # A dirty tree is noted; the history outlives the process and keeps --history-size versions.
    (fleet.dir / "routes.yaml").write_text(routes("v2").replace("name: default", "name: all"))
    wait_for(lambda: fleet.latest() not in (first, second), "an uncommitted change is built")
    dirty = fleet.latest()
    assert fleet.entry(dirty)["git"][0]["dirty"] is True
    fleet.server.restart()
    listed = fleet.cli("history", "-o", "json")
    assert [e["version"] for e in listed][:3] == [dirty, second, first]
    assert fleet.entry(second)["proxies"].keys() == {node(ns) for ns in CLIENTS}
    table = fleet.cli("history")
    assert commit[:12] in table.stdout and "VERSION" in table.stdout
    for i in range(3):
        previous = fleet.latest()
        fleet.commit("routes.yaml", routes("v2").replace("name: default", f"name: r{i}"))
        wait_for(lambda previous=previous: fleet.latest() != previous, "a new version is built")
    versions = [e["version"] for e in fleet.cli("history", "-o", "json")]
    assert len(versions) == 3 and not {first, second} & set(versions), versions
    wait_for(lambda: len(json.loads((fleet.root / "state-0" / "history.json").read_text())["entries"]) == 3, "the file")
