"""A proxyless gRPC node is a proxy to the operator: `meshctl proxy-status` lists it beside the
Envoys with its generator and its sync state per type, and the admin's config dump of it is
what it is served (gRPC's resources, not an Envoy's)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from conftest import runner
from test_simulate_grpc import MESH

from meshctl.cli.app import app
from meshctl.testing.ads_client import AdsClient, GrpcAdsClient
from meshctl.testing.server import run, serving

GRPC_NODE = "sidecar~10.0.0.9~client.shop~shop.svc.cluster.local"
ENVOY_NODE = "sidecar~10.0.0.1~echo-v1.shop~shop.svc.cluster.local"
DIALED = "echo.shop.mesh:7070"


def proxy_status(admin: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    result = runner.invoke(app, ["proxy-status", "--admin", admin, "-o", "json"])
    table = runner.invoke(app, ["proxy-status", "--admin", admin])
    return result.exit_code, {row["proxy"]: row for row in json.loads(result.stdout)}, table.stdout


def test_proxy_status_shows_a_grpc_node_synced_beside_an_envoy(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "mesh.yaml").write_text(MESH)

    async def body() -> None:
        async with serving(tmp_path) as server:
            xds, admin = f"127.0.0.1:{server.xds_port}", f"127.0.0.1:{server.admin_port}"
            async with (
                GrpcAdsClient(xds, GRPC_NODE, dialed=[DIALED]) as grpc_node,
                AdsClient(xds, ENVOY_NODE) as envoy,
            ):
                await grpc_node.wait_for(lambda c: c.complete())
                await envoy.wait_for(lambda c: c.complete())
                # The ACKs of the last responses reach the server after the client holds them.
                for _ in range(100):
                    code, rows, table = await asyncio.to_thread(proxy_status, admin)
                    if code == 0:
                        break
                    await asyncio.sleep(0.05)
                assert code == 0, rows
                grpc_row, envoy_row = rows[GRPC_NODE], rows[ENVOY_NODE]
                assert grpc_row["generator"] == "grpc" and envoy_row["generator"] == "envoy"
                assert [grpc_row[t] for t in ("CDS", "LDS", "EDS", "RDS", "SDS")] == [
                    "SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT SENT",
                ]  # fmt: skip
                assert "GENERATOR" in table and "grpc" in table
                url = f"http://{admin}/debug/config_dump?proxyID=client.shop"
                dump = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url, timeout=10)))
                assert DIALED in json.dumps(dump) and "0.0.0.0_7070" not in json.dumps(dump)

    run(body)


def test_diff_of_a_grpc_node_shows_what_grpc_is_sent(tmp_path: Path) -> None:
    """A new route timeout is a new `max_stream_duration` for a gRPC node (Envoy's `timeout`
    means nothing to it), in the route config it subscribes to by name."""
    for side, timeout in (("old", "3s"), ("new", "4s")):
        (tmp_path / side / "shop").mkdir(parents=True)
        (tmp_path / side / "shop" / "mesh.yaml").write_text(MESH.replace("timeout: 3s", f"timeout: {timeout}"))
    args = ["diff", str(tmp_path / "old"), str(tmp_path / "new"), "--proxy", "client.shop"]
    result = runner.invoke(app, [*args, "--grpc"])
    assert result.exit_code == 1, result.output
    assert "routes/outbound|7070||echo.shop.mesh" in result.stdout
    assert "-        max_stream_duration: 3s" in result.stdout and "+        max_stream_duration: 4s" in result.stdout
    assert runner.invoke(app, [*args, "--all-proxies", "--grpc"]).exit_code == 2
