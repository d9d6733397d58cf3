"""A server whose config source holds nothing is not ready: it admits no proxy until the source
gives config, unless an empty mesh is said to be meant (`--allow-empty-mesh`, or a file or KV key
named `empty-mesh.yaml`).

The harm it prevents is shown with a real Envoy: a replica restarted on an empty directory (a
volume not mounted yet) must not make the Envoy that fails over to it drop its listeners.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from conftest import PRODUCTPAGE, examples_copy, needs_envoy
from test_e2e_serve import CLIENT, NS, Mesh, dynamic_versions, service_entry, wait_for, workload_entry

from meshctl.kv.source import KvLocation
from meshctl.registry.consul_http import ConsulOptions
from meshctl.server.admission import EMPTY_MESH_MARKER, NOT_READY
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.backends import send
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow


def wait_until(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.05)


def test_serve_on_an_empty_directory_is_not_ready_until_config_arrives(tmp_path: Path) -> None:
    empty = tmp_path / "mesh"
    empty.mkdir()
    server = ServeProcess([empty])
    try:
        server.start(ready=False)
        wait_until(lambda: "holds no config" in server.log(), "the log says why")
        line = next(line for line in server.log().splitlines() if "holds no config" in line)
        assert str(empty) in line and EMPTY_MESH_MARKER in line and "--allow-empty-mesh" in line
        assert not server.ready()

        async def refused() -> None:
            codes = []
            for _ in range(5):
                async with AdsClient(server.xds_address, PRODUCTPAGE) as client:
                    with pytest.raises(ConnectionError):
                        await client.wait_for(lambda c: c.complete(), timeout=5)
                    assert isinstance(client.closed, grpc.aio.AioRpcError)
                    # A stream refused while its first request is in flight may end as the
                    # client's own INTERNAL ("execute_batch"); the server's word is UNAVAILABLE.
                    codes.append((client.closed.code(), client.closed.details()))
                    if codes[-1][0] != grpc.StatusCode.INTERNAL:
                        break
            assert codes[-1] == (grpc.StatusCode.UNAVAILABLE, NOT_READY), codes

        run(refused)
        # Said to be meant: ready, and proxies get the empty mesh.
        (empty / EMPTY_MESH_MARKER).write_bytes(b"")
        wait_until(server.ready, "/ready once the marker is there")

        async def served_empty() -> None:
            async with AdsClient(server.xds_address, PRODUCTPAGE) as client:
                await client.wait_for(lambda c: c.complete(), timeout=20)
                assert not client.names(types.LISTENER)

        run(served_empty)
        # Config arrives (the volume is mounted): proxies are served it.
        for path in examples_copy(tmp_path / "examples").iterdir():
            os.replace(path, empty / path.name)

        async def served() -> None:
            async with AdsClient(server.xds_address, PRODUCTPAGE) as client:
                reviews = "outbound|9080|v1|reviews.bookinfo.mesh"
                await client.wait_for(lambda c: c.complete() and reviews in c.names(types.CLUSTER), timeout=20)

        run(served)
    finally:
        server.__exit__(None)  # stops it and removes its state directory


def test_allow_empty_mesh_serves_an_empty_directory(tmp_path: Path) -> None:
    empty = tmp_path / "mesh"
    empty.mkdir()
    with ServeProcess([empty], extra_args=["--allow-empty-mesh"]) as server:
        assert server.ready()
        assert "holds no config" not in server.log()

        async def served() -> None:
            async with AdsClient(server.xds_address, PRODUCTPAGE) as client:
                await client.wait_for(lambda c: c.complete(), timeout=20)

        run(served)


@needs_envoy
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_an_envoy_the_mesh_gives_no_listener_becomes_ready(tmp_path: Path, delta: bool) -> None:
    """Envoy waits for a first response of each type it asks for (the bootstrap's initial fetch
    has no timeout): on incremental xDS an empty set of listeners is answered too, or the sidecar
    of a service not yet in the mesh stays not ready forever."""
    empty = tmp_path / "mesh"
    empty.mkdir()
    with (
        ServeProcess([empty], extra_args=["--allow-empty-mesh"]) as server,
        EnvoyProcess(server.bootstrap(CLIENT, delta=delta)) as envoy,  # returns once Envoy is LIVE
    ):
        held = dynamic_versions(envoy)
        assert not [name for name in held if name.startswith("LDS/")], held
        assert "CDS/PassthroughCluster" in held, held  # ALLOW_ANY, the default: traffic still leaves


def test_an_empty_kv_prefix_is_not_ready_until_its_marker_key(tmp_path: Path) -> None:
    with FakeConsul() as fake:
        fake.kv_put("meshctl/other/x.yaml", b"")  # another prefix's key is not this one's

        async def body() -> None:
            consul = ConsulOptions.from_env(address=fake.address, environ={})
            async with serving((), config_kv=KvLocation(consul, "meshctl/mesh")) as server:
                for _ in range(100):  # Consul's first answer
                    if server.followed.watcher.synced():
                        break
                    await asyncio.sleep(0.05)
                assert server.followed.watcher.synced()
                assert server.admission() == NOT_READY and not server.ready()
                fake.kv_put(f"meshctl/mesh/{EMPTY_MESH_MARKER}", b"")
                for _ in range(200):
                    if server.ready():
                        break
                    await asyncio.sleep(0.05)
                assert server.ready()

        run(body)


def held(envoy: object) -> dict[str, tuple[str, str]]:
    """Envoy's listeners, clusters and routes: (version, last updated) by name."""
    return {k: v for k, v in dynamic_versions(envoy).items() if not k.startswith("EDS/")}  # type: ignore[arg-type]


def settled(server: ServeProcess, proxy: str) -> bool:
    """Whether `proxy` is on the server's latest snapshot, with every type it was sent ACKed."""
    for entry in server.admin_json("/debug/syncz"):
        if entry["proxy"] == proxy:
            kinds = entry["types"].values()
            on_latest = entry["snapshot"] == entry["latest_snapshot"] != ""
            return on_latest and all(t["sent"] == t["acked"] and not t["nack"] for t in kinds)
    return False


@pytest.mark.e2e
@needs_envoy
def test_envoy_keeps_its_config_when_its_server_comes_back_on_an_empty_directory(tmp_path: Path) -> None:
    with ExitStack() as stack:
        mesh = Mesh(tmp_path, stack)
        port = free_port()
        mesh.backend("web-v1", "127.0.0.21", port)
        mesh.write("web.yaml", service_entry("web", port), workload_entry("web-v1", "127.0.0.21", "web", "v1"))
        server = mesh.serve(extra_args=["--log-level", "debug"])
        envoy = mesh.envoy(server)
        host = f"web.{NS}.mesh"
        wait_for(lambda: send(port, host).ok, "Envoy routes through the mesh")
        # What Envoy holds is taken once it has ACKed everything of the latest snapshot: a push
        # still on its way when it is taken would show as a change the restart never made.
        wait_for(lambda: settled(server, CLIENT), "Envoy has ACKed the latest snapshot")
        before = held(envoy)
        assert any(k.startswith("LDS/") for k in before)

        # The server dies; it comes back on the same ports before its volume is mounted.
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.stop()
        unmounted = tmp_path / "unmounted"
        unmounted.mkdir()
        server.config_dirs = (unmounted,)
        server.start(ready=False)
        refusals = "refused a stream from"
        wait_for(
            lambda: server.log().count(refusals) >= 2 or held(envoy) != before,
            "Envoy asks the empty server (twice), or is served by it",
        )
        assert held(envoy) == before  # nothing dropped, nothing changed
        assert not server.ready()
        assert send(port, host).ok

        # The volume is mounted: the server is ready and Envoy is served again.
        (unmounted / "web.yaml").write_text((mesh.dir / "web.yaml").read_text())
        wait_for(server.ready, "ready once the config is there")
        wait_for(lambda: any(e["proxy"] == CLIENT for e in server.admin_json("/debug/syncz")), "Envoy served")
        assert send(port, host).ok
