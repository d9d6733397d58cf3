"""The real server on loopback, with in-process ADS clients subscribing as Envoy does."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import PRODUCTPAGE, examples_copy

from meshctl.server.app import Server
from meshctl.server.discovery import DebounceSettings
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    return examples_copy(tmp_path)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
        return body


async def admin_get(server: Server, path: str) -> bytes:
    """GET an admin page from another thread: the server answers on this test's event loop."""
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{server.admin_port}{path}")


async def admin_json(server: Server, path: str) -> object:
    return json.loads(await admin_get(server, path))


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_proxy_gets_a_complete_config_with_istio_names(mesh: Path, delta: bool) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE, delta=delta) as c:
            await c.wait_for(
                lambda c: c.complete() and "outbound|9080|v1|reviews.bookinfo.mesh" in c.names(types.ENDPOINT)
            )
            assert "outbound|9080|v2|reviews.bookinfo.mesh" in c.names(types.CLUSTER)
            assert "9080" in c.names(types.ROUTE)
            order = []
            for r in c.log:
                if r.type_url not in order:
                    order.append(r.type_url)
            assert order == [types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE]
            syncz = await admin_json(server, "/debug/syncz")
            assert isinstance(syncz, list) and syncz[0]["proxy"] == PRODUCTPAGE

    run(test)


def test_a_burst_of_file_writes_is_one_push(mesh: Path) -> None:
    async def test() -> None:
        quiet = DebounceSettings(0.3, 5.0)
        async with serving(mesh, debounce=quiet) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete())
            await asyncio.sleep(0.5)
            before = len([r for r in c.log if r.type_url == types.ROUTE])
            traffic = mesh / "bookinfo" / "traffic.yaml"
            text = traffic.read_text()
            for i in range(50):
                traffic.write_text(text.replace("timeout: 3s", f"timeout: {i + 1}s"))
            await c.wait_for(lambda c: len([r for r in c.log if r.type_url == types.ROUTE]) > before)
            await asyncio.sleep(1.0)
            route_pushes = [r for r in c.log if r.type_url == types.ROUTE][before:]
            assert len(route_pushes) == 1

    run(test)


def test_endpoint_change_pushes_eds_alone(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(
                lambda c: c.complete() and "outbound|9080||ratings.bookinfo.mesh" in c.names(types.ENDPOINT)
            )
            await asyncio.sleep(0.3)
            seen = len(c.log)
            (mesh / "bookinfo" / "ratings-v1-b.yaml").write_text(
                "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: ratings-v1-b\n"
                "  namespace: bookinfo\nspec:\n  address: 10.10.0.52\n  labels:\n    app: ratings\n    version: v1\n"
            )

            def has_new_endpoint(c: AdsClient) -> bool:
                cla = c.resources[types.ENDPOINT].get("outbound|9080||ratings.bookinfo.mesh")
                addresses = {
                    e.endpoint.address.socket_address.address
                    for group in getattr(cla, "endpoints", [])
                    for e in group.lb_endpoints
                }
                return "10.10.0.52" in addresses

            await c.wait_for(has_new_endpoint)
            await asyncio.sleep(0.5)
            assert {r.type_url for r in c.log[seen:]} == {types.ENDPOINT}

    run(test)


def addresses(client: AdsClient, cluster: str) -> set[str]:
    cla = client.resources[types.ENDPOINT].get(cluster)
    return {
        e.endpoint.address.socket_address.address for group in getattr(cla, "endpoints", []) for e in group.lb_endpoints
    }


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_endpoint_change_sends_only_that_services_assignments(mesh: Path, delta: bool) -> None:
    """In state of the world as in delta, an endpoint change carries the assignments of its service
    alone; the client keeps the others, as Envoy does, and a new stream gets them all."""
    ratings = "outbound|9080||ratings.bookinfo.mesh"

    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE, delta=delta) as c:
            await c.wait_for(lambda c: c.complete() and ratings in c.names(types.ENDPOINT))
            await asyncio.sleep(0.3)
            before = dict(c.resources[types.ENDPOINT])
            seen = len(c.log)
            (mesh / "bookinfo" / "ratings-v1-b.yaml").write_text(
                "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: ratings-v1-b\n"
                "  namespace: bookinfo\nspec:\n  address: 10.10.0.52\n  labels:\n    app: ratings\n    version: v1\n"
            )
            await c.wait_for(lambda c: "10.10.0.52" in addresses(c, ratings))
            await asyncio.sleep(0.5)
            responses = c.log[seen:]
            assert {r.type_url for r in responses} == {types.ENDPOINT}
            carried = {name for r in responses for name in r.names}
            assert ratings in carried
            assert all(name.endswith("|ratings.bookinfo.mesh") for name in carried), carried
            assert len(carried) < len(before)
            # The client still holds every other assignment, untouched.
            assert c.names(types.ENDPOINT) == set(before)
            assert all(c.resources[types.ENDPOINT][n] is m for n, m in before.items() if n not in carried)

            async with AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE, delta=delta) as fresh:
                await fresh.wait_for(lambda f: f.complete() and "10.10.0.52" in addresses(f, ratings))
                first_eds = next(r for r in fresh.log if r.type_url == types.ENDPOINT)
                assert set(first_eds.names) == set(before)

    run(test)


def test_change_outside_a_proxys_sidecar_scope_pushes_nothing_to_it(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete())
            await asyncio.sleep(0.3)
            seen = len(c.log)
            (mesh / "other.yaml").write_text(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: billing\n"
                "  namespace: payments\nspec:\n  hosts: [billing.payments.mesh]\n"
                "  ports: [{number: 8080, name: http, protocol: HTTP}]\n  resolution: DNS\n"
            )
            await server_snapshot_with(server, "billing.payments.mesh")
            await asyncio.sleep(0.5)
            assert c.log[seen:] == []

    run(test)


async def server_snapshot_with(server: Server, host: str, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while server.discovery.snapshot is None or host not in server.discovery.snapshot.services.services:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), timeout)


def test_removed_cluster_outlives_the_routes_that_used_it(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(
                lambda c: c.complete() and "outbound|9080|v3|reviews.bookinfo.mesh" in c.names(types.CLUSTER)
            )
            traffic = mesh / "bookinfo" / "traffic.yaml"
            text = traffic.read_text()
            # Drop subset v3 from the DestinationRule and the route that used it, in one edit.
            text = text.replace("  - name: v3\n    labels:\n      version: v3\n", "")
            text = text.replace(
                "      weight: 90\n    - destination:\n        host: reviews.bookinfo.mesh\n"
                "        subset: v3\n      weight: 10\n",
                "      weight: 100\n",
            )
            log_start = len(c.log)
            traffic.write_text(text)
            await c.wait_for(lambda c: "outbound|9080|v3|reviews.bookinfo.mesh" not in c.names(types.CLUSTER))
            new = c.log[log_start:]
            kinds = [r.type_url for r in new]
            # Routes without v3 arrive before the CDS that drops v3.
            last_cds = max(i for i, t in enumerate(kinds) if t == types.CLUSTER)
            first_rds = kinds.index(types.ROUTE)
            assert first_rds < last_cds

    run(test)


def test_broken_file_keeps_the_last_good_config_and_metrics_move(mesh: Path) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete())
            clusters = c.names(types.CLUSTER)
            (mesh / "bookinfo" / "services.yaml").write_text("apiVersion: [broken\n")
            await asyncio.sleep(1.0)
            assert c.names(types.CLUSTER) == clusters
            configz = await admin_json(server, "/debug/configz")
            assert isinstance(configz, dict) and any("services.yaml" in e["file"] for e in configz["errors"])
            metrics = (await admin_get(server, "/metrics")).decode()
            assert 'pilot_xds_pushes{type="cds"}' in metrics and "pilot_xds 1" in metrics

    run(test)


def test_config_dump_of_a_connected_proxy_is_what_it_was_sent(mesh: Path) -> None:
    """`/debug/config_dump?proxyID=` answers for a connected proxy with Envoy's dump format, and
    holds the very clusters and routes the proxy received over ADS."""

    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete())
            quoted = urllib.parse.quote(PRODUCTPAGE, safe="")
            dump = await admin_json(server, f"/debug/config_dump?proxyID={quoted}")
            assert isinstance(dump, dict)
            sections = {s["@type"].rsplit(".", 1)[-1]: s for s in dump["configs"]}
            kinds = ("Clusters", "Endpoints", "Listeners", "Routes", "Secrets")
            assert set(sections) == {f"{kind}ConfigDump" for kind in kinds}
            clusters = {d["cluster"]["name"] for d in sections["ClustersConfigDump"]["dynamic_active_clusters"]}
            assert clusters == c.names(types.CLUSTER)
            routes = {d["route_config"]["name"] for d in sections["RoutesConfigDump"]["dynamic_route_configs"]}
            assert c.names(types.ROUTE) <= routes
            with pytest.raises(urllib.error.HTTPError) as err:
                await admin_get(server, "/debug/config_dump?proxyID=sidecar~1.2.3.4~nobody.x~x")
            err.value.close()
            assert err.value.code == 404

    run(test)
