"""Several `meshctl serve` replicas that Envoy fails over between (docs/replicas.md).

The bootstrap names every replica, each replica paces new streams and asks its proxies to
reconnect now and then, `proxy-status` reads them all, and a git-synced config directory is
swapped whole under a running server. The end-to-end test kills the replica a real Envoy is
connected to while requests flow through that Envoy.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import BOOTSTRAP_NODE, PRODUCTPAGE, examples_copy, needs_envoy
from ruamel.yaml import YAML
from typer.testing import CliRunner

from meshctl.bootstrap import XDS_CLUSTER
from meshctl.cli.app import app
from meshctl.config.model import ConfigKey
from meshctl.server.ads import TOO_MANY_NEW_STREAMS
from meshctl.server.pacing import TokenBucket
from meshctl.server.settings import grpc_age_options
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.envoy import envoy_binary, validate_config
from meshctl.testing.server import run, serving

ROOT = Path(__file__).resolve().parent.parent
GIT_SYNC = ROOT / "systemd" / "meshctl-git-sync"


def bootstrap(*addresses: str) -> dict[str, Any]:
    """`meshctl bootstrap` with these `--xds-address`es, read back."""
    args = ["bootstrap", "--proxy", BOOTSTRAP_NODE]
    for address in addresses:
        args += ["--xds-address", address]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = YAML(typ="safe").load(result.stdout)
    return loaded


def xds_cluster(config: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER)


def endpoints(cluster: dict[str, Any]) -> list[tuple[str, int]]:
    lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    return [
        (
            e["endpoint"]["address"]["socket_address"]["address"],
            e["endpoint"]["address"]["socket_address"]["port_value"],
        )
        for e in lb
    ]


# -- bootstrap ----------------------------------------------------------------------------------


def test_one_address_keeps_the_cluster_as_it_was() -> None:
    one = xds_cluster(bootstrap("10.0.0.1:15010"))
    assert endpoints(one) == [("10.0.0.1", 15010)]
    assert "upstream_connection_options" not in one
    assert bootstrap("10.0.0.1:15010") == bootstrap("10.0.0.1:15010", "10.0.0.1:15010")
    assert endpoints(xds_cluster(bootstrap())) == [("127.0.0.1", 15010)]


def test_two_addresses_give_one_endpoint_each_with_keepalive() -> None:
    cluster = xds_cluster(bootstrap("10.0.0.1:15010", "10.0.0.2:15011"))
    assert endpoints(cluster) == [("10.0.0.1", 15010), ("10.0.0.2", 15011)]
    assert cluster["type"] == "STATIC"
    assert cluster["connect_timeout"] == "1s"
    assert cluster["upstream_connection_options"] == {"tcp_keepalive": {"keepalive_time": 300}}
    h2 = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert h2["explicit_http_config"]["http2_protocol_options"]["connection_keepalive"]


def test_a_name_among_the_addresses_makes_the_cluster_dns() -> None:
    cluster = xds_cluster(bootstrap("meshctl.internal:15010", "10.0.0.2:15010"))
    assert cluster["type"] == "STRICT_DNS"
    assert endpoints(cluster) == [("meshctl.internal", 15010), ("10.0.0.2", 15010)]


def test_several_hosts_over_tls_need_one_server_name(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    args = ["bootstrap", "--proxy", PRODUCTPAGE, "--xds-ca", str(ca)]
    args += ["--xds-address", "10.0.0.1:15010", "--xds-address", "10.0.0.2:15010"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--xds-sni" in result.output
    with_sni = CliRunner().invoke(app, [*args, "--xds-sni", "meshctl.internal", "-o", "json"])
    assert with_sni.exit_code == 0, with_sni.output


@needs_envoy
def test_envoy_takes_the_bootstrap_with_two_replicas() -> None:
    validate_config(bootstrap("127.0.0.1:15010", "127.0.0.2:15010"))
    validate_config(bootstrap("localhost:15010", "127.0.0.2:15010"))


# -- serve: connection age and the new-stream limit ---------------------------------------------


def test_max_connection_age_is_a_grpc_option_with_istiods_grace() -> None:
    assert grpc_age_options(1800.0) == [
        ("grpc.max_connection_age_ms", 1_800_000),
        ("grpc.max_connection_age_grace_ms", 10_000),
    ]
    assert grpc_age_options(None) == grpc_age_options(0) == []


def test_serve_flags_reach_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import meshctl.server.app as server_app

    seen: list[Any] = []

    class Stub:
        def __init__(self, settings: Any) -> None:
            seen.append(settings)

        async def run(self) -> None:
            return None

    monkeypatch.setattr(server_app, "Server", Stub)
    args = ["serve", "--config-dir", str(tmp_path), "--max-connection-age", "1h", "--max-new-streams-per-second", "7"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (seen[0].max_connection_age, seen[0].max_new_streams_per_second) == (3600.0, 7.0)
    CliRunner().invoke(app, ["serve", "--config-dir", str(tmp_path), "--max-connection-age", "0"])
    assert seen[1].max_connection_age is None
    bad = CliRunner().invoke(app, ["serve", "--config-dir", str(tmp_path), "--max-connection-age", "soon"])
    assert bad.exit_code == 2 and "--max-connection-age" in bad.output


def test_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] += 0.5
    assert [bucket.take() for _ in range(2)] == [True, False]
    now[0] += 100
    assert sum(bucket.take() for _ in range(10)) == 2  # saved up to a second's worth, no more


def test_a_reconnect_storm_is_paced_and_every_proxy_is_served(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path)
    proxies = 12

    async def test() -> None:
        async with serving(tree, max_new_streams_per_second=4.0) as server:
            address = f"127.0.0.1:{server.xds_port}"
            refused: list[int] = []

            async def proxy(i: int) -> None:
                # As Envoy: UNAVAILABLE is retried after a backoff, until the stream is served.
                while True:
                    async with AdsClient(address, PRODUCTPAGE.replace("productpage-v1-vm", f"p{i}")) as client:
                        try:
                            await client.wait_for(lambda c: c.complete(), timeout=20)
                            return
                        except ConnectionError:
                            closed = client.closed
                            assert isinstance(closed, grpc.aio.AioRpcError)
                            assert closed.code() is grpc.StatusCode.UNAVAILABLE, closed
                            assert closed.details() == TOO_MANY_NEW_STREAMS
                            refused.append(i)
                    await asyncio.sleep(0.2)

            started = time.monotonic()
            await asyncio.gather(*(proxy(i) for i in range(proxies)))
            assert len(refused) >= proxies - 4, refused  # the first second's worth got in at once
            # 4 at once, then 4 a second: the last 8 wait about two seconds.
            assert time.monotonic() - started >= 1.5

    run(test)


# -- proxy-status across replicas ---------------------------------------------------------------


def test_proxy_status_merges_replicas_and_names_the_one_holding_each_stream(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path)
    runner = CliRunner()

    async def test() -> None:
        async with serving(tree) as one, serving(tree) as two:
            admin_one, admin_two = f"127.0.0.1:{one.admin_port}", f"127.0.0.1:{two.admin_port}"
            first = PRODUCTPAGE
            second = PRODUCTPAGE.replace("productpage-v1-vm", "other")
            async with (
                AdsClient(f"127.0.0.1:{one.xds_port}", first) as a,
                AdsClient(f"127.0.0.1:{two.xds_port}", second) as b,
            ):
                await a.wait_for(lambda c: c.complete())
                await b.wait_for(lambda c: c.complete())
                args = ["proxy-status", "--admin", admin_one, "--admin", admin_two]
                result = await asyncio.to_thread(runner.invoke, app, [*args, "-o", "json"])
                while result.exit_code == 1 and "STALE" in result.stdout:  # an ACK not read yet
                    await asyncio.sleep(0.05)
                    result = await asyncio.to_thread(runner.invoke, app, [*args, "-o", "json"])
                assert result.exit_code == 0, result.output
                rows = {r["proxy"]: r for r in json.loads(result.stdout)}
                assert rows[first]["replica"] == admin_one and rows[second]["replica"] == admin_two
                table = await asyncio.to_thread(runner.invoke, app, args)
                assert "REPLICA" in table.stdout and admin_two in table.stdout

                # One replica gone: a line on stderr, the other's rows still shown.
                dead = "127.0.0.1:1"
                partial = await asyncio.to_thread(
                    runner.invoke, app, ["proxy-status", "--admin", dead, "--admin", admin_two, "-o", "json"]
                )
                assert partial.exit_code == 0, partial.output
                assert [r["proxy"] for r in json.loads(partial.stdout)] == [second]
                assert len(partial.stderr.strip().splitlines()) == 1 and dead in partial.stderr

    run(test)
    nobody = runner.invoke(app, ["proxy-status", "--admin", "127.0.0.1:1", "--admin", "127.0.0.1:2"])
    assert nobody.exit_code == 2


# -- a git-synced config directory --------------------------------------------------------------


def test_a_symlink_swap_of_the_config_dir_is_one_change(tmp_path: Path) -> None:
    v1 = examples_copy(tmp_path / "v1")
    v2 = tmp_path / "v2"
    shutil.copytree(v1, v2)
    (v2 / "bookinfo" / "traffic.yaml").unlink()
    (v2 / "bookinfo" / "extra.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: extra\n  namespace: bookinfo\n"
        "spec:\n  hosts: [extra.example.com]\n  location: MESH_EXTERNAL\n"
        "  ports: [{number: 443, name: tls, protocol: TLS}]\n"
        "  resolution: DNS\n"
    )
    current = tmp_path / "current"
    current.symlink_to(v1)
    extra = ConfigKey("ServiceEntry", "bookinfo", "extra")
    reviews = ConfigKey("VirtualService", "bookinfo", "reviews")

    async def test() -> None:
        async with serving(current) as server:
            changes: list[Any] = []
            server.store.subscribe(changes.append)
            snapshots = [server.discovery.snapshot]
            before = server.store.configs
            assert reviews in before and extra not in before

            tmp = tmp_path / ".current.tmp"
            tmp.symlink_to(v2)
            os.replace(tmp, current)  # what `ln -sfn` + `mv -T` do
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if server.discovery.snapshot is not snapshots[-1]:
                    snapshots.append(server.discovery.snapshot)
                await asyncio.sleep(0.002)
                if len(snapshots) > 1 and time.monotonic() > deadline - 8:
                    break  # two quiet seconds after the new snapshot: nothing more is coming
            assert len(changes) == 1, changes
            assert len(snapshots) == 2
            after = server.store.configs
            assert extra in after and reviews not in after
            assert len(after) == len(before) - len([k for k in before if k not in after]) + 1

    run(test)


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_sync_script_swaps_the_link_to_each_new_commit(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    examples_copy(origin)
    git(origin, "init", "--quiet", "--initial-branch", "main")
    git(origin, "add", "-A")
    git(origin, "commit", "--quiet", "-m", "one")
    state = tmp_path / "state"
    env = {
        "PATH": os.environ["PATH"],
        "MESHCTL_GIT_URL": str(origin),
        "MESHCTL_GIT_SUBDIR": "mesh",
        "MESHCTL_GIT_STATE": str(state),
    }

    def sync() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", str(GIT_SYNC)], env=env, capture_output=True, text=True, check=False)

    assert sync().returncode == 0
    link = state / "current"
    first = os.readlink(link)
    assert (link / "bookinfo" / "traffic.yaml").is_file()
    assert sync().returncode == 0 and os.readlink(link) == first  # nothing new: nothing swapped

    (origin / "mesh" / "bookinfo" / "traffic.yaml").unlink()
    git(origin, "commit", "--quiet", "-am", "two")
    assert sync().returncode == 0
    assert os.readlink(link) != first and not (link / "bookinfo" / "traffic.yaml").exists()
    assert Path(first).is_dir()  # the tree just replaced is kept for a reader still in it
    git(origin, "commit", "--quiet", "--allow-empty", "-m", "three")
    assert sync().returncode == 0
    assert not Path(first).exists() and len(list((state / "trees").iterdir())) == 2
    assert not list(state.glob(".*"))  # no temporary link left behind

    env["MESHCTL_GIT_SUBDIR"] = "nowhere"
    missing = sync()
    assert missing.returncode == 1 and "nowhere" in missing.stderr


# -- end to end: a real Envoy and two replicas --------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
def test_envoy_fails_over_to_the_other_replica_without_a_failed_request(tmp_path: Path) -> None:
    from test_e2e_serve import CLIENT, NS, Mesh, envoy_stats, service_entry, wait_for, workload_entry

    from meshctl.testing.backends import RequestLoop, send
    from meshctl.testing.envoy import EnvoyProcess, free_port
    from meshctl.testing.serve_process import ServeProcess

    assert envoy_binary() is not None
    with ExitStack() as stack:
        mesh = Mesh(tmp_path, stack)
        port = free_port()
        mesh.backend("web-v1", "127.0.0.21", port)
        mesh.write("web.yaml", service_entry("web", port), workload_entry("web-v1", "127.0.0.21", "web", "v1"))
        state = tmp_path / "state"
        first = mesh.serve(extra_args=["--state-dir", str(state)])
        shutil.copytree(state, tmp_path / "state-copy")  # one CA for both replicas
        second = mesh.serve(extra_args=["--state-dir", str(tmp_path / "state-copy")])
        replicas = {first.xds_address: first, second.xds_address: second}
        bootstrap = first.bootstrap(CLIENT, extra_args=["--xds-address", second.xds_address])
        envoy = stack.enter_context(EnvoyProcess(bootstrap))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        host = f"web.{NS}.mesh"
        wait_for(lambda: send(port, host).ok, "Envoy routes the first request")

        def holder() -> ServeProcess | None:
            live = [r for r in replicas.values() if r.pid is not None]
            held = [r for r in live if any(e["proxy"] == CLIENT for e in r.admin_json("/debug/syncz"))]
            return held[0] if len(held) == 1 else None

        wait_for(lambda: holder() is not None, "one replica holds Envoy's stream")
        connected = holder()
        assert connected is not None
        other = second if connected is first else first
        before = listener_versions(envoy)
        assert before

        with RequestLoop(port, host) as loop:
            loop.wait_for_answers(5)
            assert connected.pid is not None
            os.kill(connected.pid, signal.SIGKILL)
            killed = time.monotonic()
            wait_for(
                lambda: any(e["proxy"] == CLIENT for e in other.admin_json("/debug/syncz")),
                "Envoy on the other replica",
            )
            wait_for(
                lambda: envoy_stats(envoy, "control_plane.connected_state") == {"control_plane.connected_state": 1},
                "connected",
            )
            took = time.monotonic() - killed
            mark = loop.mark()
            wait_for(lambda: loop.mark() >= mark + 5, "requests keep flowing")
        assert loop.failures == []
        assert took < 10, took
        assert listener_versions(envoy) == before  # nothing drained, nothing modified
        connected.stop()


def listener_versions(envoy: Any) -> dict[str, tuple[str, str]]:
    """Every dynamic listener, cluster and route config Envoy holds: (version_info, last_updated)."""
    from test_e2e_serve import dynamic_versions

    return {k: v for k, v in dynamic_versions(envoy).items() if not k.startswith("EDS/")}


@pytest.fixture(autouse=True)
def _no_meshctl_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("MESHCTL_")]:
        monkeypatch.delenv(name)
    yield
