"""Envoy from `meshctl bootstrap` is ready when it has its config, and says so on the health port.

- Istio's bootstrap gives CDS and LDS `initial_fetch_timeout: 0s`: an Envoy started while meshctl
  is down waits for it, not ready (`/ready` 503), however long it takes. With a timeout (Envoy's
  default is 15 s per type) it gives up and reports LIVE with no listeners, which is what the
  same bootstrap with a one-second timeout does here within a few seconds. Once `meshctl serve`
  comes up on the address the bootstrap names, the waiting Envoy gets its config and goes LIVE.
- A router's health listener (Istio's 15021) answers `/healthz/ready` from Envoy's readiness:
  nothing while Envoy waits for its config (static listeners open with the first config), 200
  once it is LIVE, 503 once its health checks are failed (the unit's stop does that first).
  Nothing else of the admin API is reachable there.
"""

from __future__ import annotations

import copy
import http.client
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_envoy, wait_for

from meshctl.bootstrap import HEALTH_CLUSTER
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import gateway_mesh_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
]

NS = "ready"
GATEWAY = f"router~127.0.0.81~edge.{NS}~{NS}.svc.cluster.local"
HOST = "shop.example.com"
BACKEND = "127.0.0.82"
#: How long an Envoy without a server is watched: well past the one-second timeout of the
#: impatient bootstrap, which goes LIVE (with nothing) within it.
WAIT_SECONDS = 4.0


def mesh_yaml(service_port: int, gateway_port: int) -> str:
    return gateway_mesh_yaml(
        namespace=NS,
        service="shop",
        backend_ip=BACKEND,
        gateway="edge",
        gateway_ip="127.0.0.81",
        selector="ready-gateway",
        host=HOST,
        service_port=service_port,
        gateway_port=gateway_port,
    )


def get(port: int, path: str) -> tuple[int, str]:
    """GET 127.0.0.1:`port``path`, the path sent as is: (status, body), (0, "") for no answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        return 0, ""
    finally:
        conn.close()


def impatient(config: dict[str, Any]) -> dict[str, Any]:
    """The same bootstrap with a one-second first-fetch timeout (Envoy's default is 15 s)."""
    config = copy.deepcopy(config)
    for source in ("cds_config", "lds_config"):
        config["dynamic_resources"][source]["initial_fetch_timeout"] = "1s"
    return config


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServeProcess, int]]:
    """`meshctl serve` on ports of its own, stopped: a test starts it when it wants. Its ports are
    chosen by the first start and kept (ServeProcess.start on a stopped one reuses them)."""
    directory = tmp_path / "mesh"
    directory.mkdir()
    service_port, gateway_port = free_port(BACKEND), free_port()
    (directory / "mesh.yaml").write_text(mesh_yaml(service_port, gateway_port))
    with Backend("shop", BACKEND, service_port), ServeProcess([directory]) as serve:
        serve.stop()
        try:
            yield serve, gateway_port
        finally:
            print(f"--- meshctl serve log:\n{serve.log()[-4000:]}")


def test_envoy_waits_for_meshctl_not_ready_until_its_config_comes(server: tuple[ServeProcess, int]) -> None:
    serve, gateway_port = server
    admin, health, stats = free_port(), free_port(), free_port()
    flags = ["--admin-port", str(admin), "--health-port", str(health), "--stats-port", str(stats)]
    config = serve.bootstrap(GATEWAY, extra_args=flags)
    assert config["dynamic_resources"]["cds_config"]["initial_fetch_timeout"] == "0s"
    assert config["dynamic_resources"]["lds_config"]["initial_fetch_timeout"] == "0s"
    other_admin = free_port()
    hurried = impatient(serve.bootstrap(GATEWAY, extra_args=["--admin-port", str(other_admin), "--health-port", "0"]))

    # meshctl is down: the xDS address the bootstraps name has nothing listening.
    with (
        EnvoyProcess(config, admin_port=admin, wait_live=False, log_level="info") as envoy,
        EnvoyProcess(hurried, admin_port=other_admin, wait_live=False, log_level="info") as envoy_hurried,
    ):
        # The impatient one gives up and goes LIVE, with no listener: what Envoy's default
        # timeout does after 15 s per type.
        wait_for(lambda: envoy_hurried.ready() == (200, "LIVE"), "the impatient Envoy LIVE", envoy_hurried.log)
        assert "0.0.0.0_" not in envoy_hurried.admin("listeners")
        watched_until = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < watched_until:
            status, state = envoy.ready()
            assert (status, state) in ((503, "PRE_INITIALIZING"), (503, "INITIALIZING")), (status, state)
            # Static listeners open with the first config: no health answer yet, not even 503.
            assert get(health, "/healthz/ready") == (0, "")
            time.sleep(0.2)
        assert send(gateway_port, HOST).status == 0  # nothing listens on the gateway's port

        # meshctl comes up on the address the bootstrap names: Envoy takes its config.
        serve.start()
        wait_for(lambda: envoy.ready() == (200, "LIVE"), "Envoy LIVE once meshctl serves it", envoy.log)
        assert f"0.0.0.0_{gateway_port}" in envoy.admin("listeners")
        wait_for(lambda: send(gateway_port, HOST).backend == "shop", "the gateway routing", envoy.log)

        # The health port answers from Envoy's readiness, and only `/healthz/ready`.
        assert get(health, "/healthz/ready") == (200, "LIVE")
        assert get(health, "/healthz/ready?full") == (200, "LIVE")
        for path in ("/ready", "/healthz/ready/../../config_dump", "/healthz", "/stats/prometheus", "/"):
            assert get(health, path)[0] == 404, path
        assert f"{HEALTH_CLUSTER}::0.0.0.0:{health}" in envoy.admin("listeners")
        # Failed health checks (the unit's stop does this first) read as 503 there.
        envoy.admin("healthcheck/fail", method="POST")
        assert get(health, "/healthz/ready") == (503, "DRAINING")
        envoy.admin("healthcheck/ok", method="POST")
        assert get(health, "/healthz/ready") == (200, "LIVE")


def test_a_sidecar_has_no_health_listener_unless_asked(server: tuple[ServeProcess, int]) -> None:
    serve, _ = server
    serve.start()
    sidecar = f"sidecar~127.0.0.83~client.{NS}~{NS}.svc.cluster.local"
    for flags, expected in (([], False), (["--health-port", str(free_port())], True)):
        admin = free_port()
        config = serve.bootstrap(sidecar, extra_args=["--admin-port", str(admin), *flags])
        with EnvoyProcess(config, admin_port=admin, wait_live=False, log_level="info") as envoy:
            wait_for(lambda envoy=envoy: envoy.ready() == (200, "LIVE"), "Envoy LIVE", envoy.log)
            assert (f"{HEALTH_CLUSTER}::" in envoy.admin("listeners")) is expected
