"""The staged rollout and the push history on loopback: the real server, in-process ADS clients
that ACK and NACK as Envoy does, and the history file in a state directory.

The Envoy end of it (a canary's real refusal, rollback under traffic) is in test_e2e_rollout.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import EXAMPLES, PRODUCTPAGE, REVIEWS_V1, examples_copy, runner
from google.protobuf.message import Message

from meshctl.cli.app import app
from meshctl.errors import UsageError
from meshctl.kv.source import KvLocation
from meshctl.registry.consul_http import ConsulOptions
from meshctl.server.history import DETAILED, FILE_NAME, PushHistory, git_state
from meshctl.server.rollout import RolloutError
from meshctl.server.rollout_plan import CanarySelector, RolloutSettings
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.server import run, serving
from meshctl.xds import types

SOAK = 1.0


RATINGS_ROUTE = "  http:\n  - route:\n    - destination:\n        host: ratings.bookinfo.mesh\n"


def set_ratings_timeout(tree: Path, timeout: str) -> None:
    """Give the example's ratings VirtualService a route timeout (traffic.yaml edited in place)."""
    text = (EXAMPLES / "bookinfo" / "traffic.yaml").read_text()
    assert text.count(RATINGS_ROUTE) == 1
    timed = RATINGS_ROUTE.replace("  - route:", f"  - timeout: {timeout}\n    route:")
    write(tree, "traffic.yaml", text.replace(RATINGS_ROUTE, timed))


def refuse_seven_seconds(type_url: str, resources: Mapping[str, Message]) -> str | None:
    """NACK route configs with a 7 s route timeout, as an Envoy that cannot take some field would."""
    if type_url != types.ROUTE:
        return None
    for config in resources.values():
        for host in config.virtual_hosts:  # type: ignore[attr-defined]
            if any(r.route.timeout.seconds == 7 for r in host.routes):
                return "a 7s timeout is refused here"
    return None


def write(tree: Path, name: str, text: str) -> None:
    tmp = tree / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, tree / name)


def routes_at(client: AdsClient) -> list[float]:
    return [r.at for r in client.log if r.type_url == types.ROUTE]


def test_canary_selectors_are_labels_or_node_ids() -> None:
    assert CanarySelector.parse("app=reviews, track=canary").labels == {"app": "reviews", "track": "canary"}
    nodes = {PRODUCTPAGE, "reviews-v1-vm.bookinfo"}
    assert CanarySelector.parse(f"{PRODUCTPAGE},reviews-v1-vm.bookinfo").nodes == nodes
    for bad in ("", "app=reviews,reviews-v1-vm.bookinfo", "=x"):
        with pytest.raises(UsageError, match="--canary"):
            CanarySelector.parse(bad)


def test_a_version_goes_to_the_canary_first_a_nack_holds_it_and_endpoints_go_to_everyone(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path) / "bookinfo"
    rollout = RolloutSettings(CanarySelector.parse("productpage-v1-vm.bookinfo"), soak=SOAK)

    async def test() -> None:
        async with (
            serving(tree.parent, rollout=rollout, state_dir=tmp_path / "state") as server,
            AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE, nack=refuse_seven_seconds) as canary,
            AdsClient(f"127.0.0.1:{server.xds_port}", REVIEWS_V1) as other,
        ):
            await canary.wait_for(lambda c: c.complete())
            await other.wait_for(lambda c: c.complete())
            rollout_of = server.delivery.rollout
            first = rollout_of.fleet.version if rollout_of.fleet else ""
            seen = len(routes_at(other))

            # Refused by the canary: held, the other proxy is sent nothing, past the soak too.
            set_ratings_timeout(tree, "7s")
            await canary.wait_for(lambda c: bool(c.errors))
            for _ in range(100):
                if rollout_of.held:
                    break
                await asyncio.sleep(0.05)
            assert PRODUCTPAGE in rollout_of.held and "7s timeout" in rollout_of.held
            bad = rollout_of.candidate.version if rollout_of.candidate else ""
            await asyncio.sleep(SOAK + 0.5)
            assert len(routes_at(other)) == seen
            assert rollout_of.fleet is not None and rollout_of.fleet.version == first
            entry = server.delivery.history.entry(bad)
            assert entry is not None
            assert entry["proxies"][PRODUCTPAGE]["RDS"]["error"] == "a 7s timeout is refused here"
            assert REVIEWS_V1 not in entry["proxies"]
            with pytest.raises(RolloutError, match="cannot be rolled back"):
                server.delivery.act("rollback", "ffff")

            # An endpoint change goes to everyone at once, held or not.
            workloads = tree / "workloads.yaml"
            write(tree, "workloads.yaml", workloads.read_text().replace("10.10.0.42", "10.10.0.48"))

            def has_endpoint(client: AdsClient) -> bool:
                return "10.10.0.48" in str(client.resources[types.ENDPOINT])

            await other.wait_for(has_endpoint)
            await canary.wait_for(has_endpoint)
            assert len(routes_at(other)) == seen
            assert rollout_of.held

            # The operator promotes: the fleet gets the held version.
            server.delivery.act("promote")
            await other.wait_for(lambda c: len(routes_at(c)) > seen)
            assert not rollout_of.held and rollout_of.candidate is None

            # A good change: the canary, then the fleet once the canary ACKed and the soak passed.
            canary_seen, seen = len(routes_at(canary)), len(routes_at(other))
            set_ratings_timeout(tree, "8s")
            await canary.wait_for(lambda c: len(routes_at(c)) > canary_seen)
            await other.wait_for(lambda c: len(routes_at(c)) > seen, timeout=10 + SOAK)
            assert routes_at(other)[seen] - routes_at(canary)[canary_seen] >= SOAK - 0.2

    run(test)


def test_the_history_is_bounded_survives_a_restart_and_sets_a_bad_file_aside(tmp_path: Path) -> None:
    service = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
"""
    snapshots = [snapshot_from_yaml(service.replace("80", str(port))) for port in (80, 81, 82, 83)]
    history = PushHistory(tmp_path, keep=3)
    before = None
    for snapshot in snapshots:
        history.record(snapshot, before)
        before = snapshot
    history.note_proxy(snapshots[-1].version, "node-a", "CDS", "sent")
    history.note_proxy(snapshots[-1].version, "node-a", "CDS", "nacked", "no")
    history.flush(force=True)
    assert history.versions() == [s.version for s in snapshots[1:]]
    changes = history.entry(snapshots[-1].version)["changes"]  # type: ignore[index]
    assert [(c["kind"], c["name"], c["change"]) for c in changes] == [
        ("ServiceEntry", "shop/web", "changed"),
        ("service", "web.shop.mesh", "changed"),
    ]
    assert ":1" in changes[0]["source"]

    again = PushHistory(tmp_path, keep=3)
    assert again.versions() == history.versions()
    assert again.entry(snapshots[-1].version[:10])["proxies"]["node-a"]["CDS"]["error"] == "no"  # type: ignore[index]
    assert PushHistory(tmp_path, keep=2).versions() == history.versions()[1:]

    (tmp_path / FILE_NAME).write_text('{"format": 1, "entries": [{"no": "version"}]}')
    fresh = PushHistory(tmp_path)
    assert fresh.versions() == []
    assert json.loads((tmp_path / f"{FILE_NAME}.bad").read_text())["entries"] == [{"no": "version"}]


def test_git_state_names_the_commit_and_a_dirty_tree(tmp_path: Path) -> None:
    assert git_state(tmp_path) is None
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "a.yaml").write_text("a: 1\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env, capture_output=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout
    state = git_state(mesh)
    assert state is not None and state.commit == head.strip() and not state.dirty
    (tmp_path / "elsewhere.txt").write_text("outside the config directory")
    assert git_state(mesh) == state
    (mesh / "a.yaml").write_text("a: 2\n")
    assert git_state(mesh).dirty  # type: ignore[union-attr]


def test_git_state_leaves_the_checkouts_index_alone(tmp_path: Path) -> None:
    """`git status` refreshes a stale index under `.git/index.lock`; done by the server while the
    operator commits in the same checkout, their `git add` or `git commit` failed with "Unable to
    create index.lock: File exists". The server reads with optional locks off: the index is never
    written, however stale its file times are."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    for i in range(20):
        (mesh / f"{i}.yaml").write_text(f"a: {i}\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env, capture_output=True)
    index = tmp_path / ".git" / "index"
    later = index.stat().st_mtime + 100
    for i in range(20):
        os.utime(mesh / f"{i}.yaml", (later, later))  # same bytes, times the index does not hold
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    state = git_state(mesh)
    assert state is not None and not state.dirty
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


def test_two_replicas_sharing_consul_kv_hold_and_promote_fleet_wide(tmp_path: Path) -> None:
    """The canary on one replica, the other proxy on another: the hold its NACK causes, and the
    promotion after the soak, apply on both (their state shared beside the config in KV)."""
    mesh = examples_copy(tmp_path)
    tree = mesh / "bookinfo"
    rollout = RolloutSettings(CanarySelector.parse("productpage-v1-vm.bookinfo"), soak=SOAK)

    with FakeConsul() as fake:

        def push() -> None:
            result = runner.invoke(app, ["kv", "push", str(mesh), "--prefix", "meshctl/mesh", "--consul", fake.address])
            assert result.exit_code == 0, result.output

        push()
        options = ConsulOptions(address=fake.address, wait=2.0, backoff_min=0.05, backoff_max=0.2, rate_interval=0.0)
        kv = KvLocation(options, "meshctl/mesh")

        async def test() -> None:
            async with (
                serving((), config_kv=kv, rollout=rollout) as one,
                serving((), config_kv=kv, rollout=rollout) as two,
                AdsClient(f"127.0.0.1:{one.xds_port}", PRODUCTPAGE, nack=refuse_seven_seconds) as canary,
                AdsClient(f"127.0.0.1:{two.xds_port}", REVIEWS_V1) as other,
            ):
                await canary.wait_for(lambda c: c.complete())
                await other.wait_for(lambda c: c.complete())
                seen = len(routes_at(other))

                set_ratings_timeout(tree, "7s")
                push()
                await canary.wait_for(lambda c: bool(c.errors))
                for _ in range(100):
                    if two.delivery.rollout.held:
                        break
                    await asyncio.sleep(0.05)
                assert PRODUCTPAGE in two.delivery.rollout.held, "the hold did not reach the other replica"
                await asyncio.sleep(SOAK + 0.5)
                assert len(routes_at(other)) == seen
                assert json.loads(fake.kv_get("meshctl/mesh.rollout/state") or b"{}")["held"]

                # Promoted on the replica without the canary: the fleet on both gets it.
                two.delivery.act("promote")
                await other.wait_for(lambda c: len(routes_at(c)) > seen)
                for _ in range(100):
                    if not one.delivery.rollout.held and one.delivery.rollout.candidate is None:
                        break
                    await asyncio.sleep(0.05)
                assert one.delivery.rollout.fleet is not None and two.delivery.rollout.fleet is not None
                assert one.delivery.rollout.fleet.version == two.delivery.rollout.fleet.version

                # A good change: the canary on one replica first, the proxy on the other after the soak.
                canary_seen, seen = len(routes_at(canary)), len(routes_at(other))
                set_ratings_timeout(tree, "8s")
                push()
                await canary.wait_for(lambda c: len(routes_at(c)) > canary_seen)
                await other.wait_for(lambda c: len(routes_at(c)) > seen, timeout=10 + SOAK)
                assert routes_at(other)[seen] - routes_at(canary)[canary_seen] >= SOAK - 0.2

        run(test)


def test_old_versions_keep_counts_and_nacks_of_their_proxies_only(tmp_path: Path) -> None:
    history = PushHistory(tmp_path, keep=50)
    entry = "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: w{0}, namespace: n}}\n"
    snapshots = [snapshot_from_yaml(entry.format(i) + "spec: {address: 10.0.0.1}\n") for i in range(DETAILED + 2)]
    first = snapshots[0].version
    history.record(snapshots[0], None)
    for node in ("a", "b"):
        history.note_proxy(first, node, "CDS", "sent")
        history.note_proxy(first, node, "CDS", "acked")
    history.note_proxy(first, "b", "LDS", "sent")
    history.note_proxy(first, "b", "LDS", "nacked", "no")
    for before, snapshot in itertools.pairwise(snapshots):
        history.record(snapshot, before)
    old = history.entry(first)
    assert old is not None
    assert old["counted"] == {"sent": 2, "acked": 1, "nacked": 1}
    assert old["proxies"] == {"b": {"LDS": old["proxies"]["b"]["LDS"]}} and old["proxies"]["b"]["LDS"]["error"] == "no"
    assert "counted" not in history.entry(snapshots[-DETAILED].version)  # type: ignore[operator]


def test_replicas_sharing_no_store_refuse_a_canary(tmp_path: Path) -> None:
    """A directory meshctl-git-sync keeps is fed to several replicas that share nothing: each
    would stage and hold versions on its own, so `--canary` there is one line and exit 2."""
    from meshctl.testing.serve_process import meshctl_command

    state = tmp_path / "state"
    made = subprocess.run(
        [*meshctl_command(), "ca", "root", "--state-dir", str(state)], capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    sync = tmp_path / "sync"  # the layout meshctl-git-sync keeps: a link into its trees, beside its cache
    (sync / "cache.git").mkdir(parents=True)
    (sync / "trees" / "0123abcd").mkdir(parents=True)
    (sync / "current").symlink_to(sync / "trees" / "0123abcd")
    serve = [*meshctl_command(), "serve", "--config-dir", str(sync / "current"), "--state-dir", str(state)]
    serve += ["--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0", "--canary", "track=canary"]
    # Started, it would serve: the timeout fails the test then.
    result = subprocess.run(serve, capture_output=True, text=True, timeout=30, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--canary" in lines[0] and "meshctl-git-sync" in lines[0] and "--config-consul-kv" in lines[0]
