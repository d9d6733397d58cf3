"""The server on a tree with Gateway API config: the gateway is sent the HTTPRoute's routes, a
route added while it runs reaches it, and the status of what did not attach is logged once
and shown in /debug/configz with its file:line."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import urllib.request
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

from meshctl.server.app import Server
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow

GATEWAY = "router~10.10.0.3~bookinfo-gateway-vm.bookinfo~bookinfo.svc.cluster.local"

SHOP = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: bookinfo}
spec:
  parentRefs: [{name: bookinfo-gateway}]
  hostnames: [bookinfo.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /shop}}]
    backendRefs: [{name: db, namespace: other, port: 9080}]
"""


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    target = tmp_path / "mesh"
    target.mkdir()
    shutil.copytree(EXAMPLES / "bookinfo", target / "bookinfo")
    shutil.copy(ROOT / "examples" / "gateway-api" / "bookinfo-gateway.yaml", target)
    return target


def _configz(server: Server) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/debug/configz", timeout=5) as r:
        found: dict[str, object] = json.loads(r.read())
        return found


def _routes(client: AdsClient) -> list[str]:
    return [
        route.name
        for config in client.resources[types.ROUTE].values()
        for host in config.virtual_hosts  # type: ignore[attr-defined]
        for route in host.routes
    ]


def test_the_gateway_gets_the_http_route_and_a_refused_backend_is_reported(
    mesh: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def test() -> None:
        async with serving(mesh) as server, AdsClient(f"127.0.0.1:{server.xds_port}", GATEWAY) as c:
            await c.wait_for(lambda c: c.complete() and "bookinfo.bookinfo.0" in _routes(c))
            assert {"0.0.0.0_8080"} <= c.names(types.LISTENER)
            with caplog.at_level(logging.WARNING, logger="meshctl.server.discovery"):
                (mesh / "shop.yaml").write_text(SHOP)
                await c.wait_for(lambda c: "bookinfo.shop.0" in _routes(c))
                configz = await asyncio.to_thread(_configz, server)
            gateway_api = configz["gatewayApi"]
            assert isinstance(gateway_api, dict)
            [condition] = gateway_api["conditions"]
            assert (condition["name"], condition["type"], condition["reason"]) == (
                "shop",
                "ResolvedRefs",
                "RefNotPermitted",
            )
            assert (
                condition["source"].endswith("shop.yaml:1:1") and condition["field"] == "spec.rules[0].backendRefs[0]"
            )
            attached = {(a["route"], a["listener"]) for a in gateway_api["attachments"]}
            assert attached == {("HTTPRoute bookinfo/bookinfo", "http"), ("HTTPRoute bookinfo/shop", "http")}
            warned = [r.getMessage() for r in caplog.records if "RefNotPermitted" in r.getMessage()]
            assert len(warned) == 1 and "shop.yaml:1:1 HTTPRoute bookinfo/shop" in warned[0]

    run(test)
