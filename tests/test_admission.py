"""When the server lets a proxy in: not before it can serve a complete mesh (every registry synced
once, or `--registry-sync-timeout` passed), and only one server per xDS address."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import grpc
import pytest
from conftest import PRODUCTPAGE, examples_copy

from meshctl.registry.consul_http import ConsulOptions
from meshctl.server.admission import NOT_READY
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command
from meshctl.testing.server import serving
from meshctl.xds import types

pytestmark = pytest.mark.slow


def test_with_consul_unreachable_proxies_wait_then_get_what_the_server_has(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mesh = examples_copy(tmp_path)
    nobody = f"127.0.0.1:{free_port()}"  # no Consul listens there

    async def test() -> None:
        consul = ConsulOptions.from_env(address=nobody, environ={})
        async with serving(mesh, consul=consul, registry_sync_timeout=1.5) as server:
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, PRODUCTPAGE) as refused:
                with pytest.raises(ConnectionError):
                    await refused.wait_for(lambda c: c.complete(), timeout=1)
                assert isinstance(refused.closed, grpc.aio.AioRpcError)
                assert refused.closed.code() == grpc.StatusCode.UNAVAILABLE
                assert refused.closed.details() == NOT_READY
            assert not server.ready()
            await asyncio.sleep(1.5)
            assert server.ready()
            async with AdsClient(address, PRODUCTPAGE) as served:
                await served.wait_for(lambda c: c.complete(), timeout=20)
                assert "outbound|9080|v1|reviews.bookinfo.mesh" in served.names(types.CLUSTER)

    with caplog.at_level(logging.WARNING, logger="meshctl.server"):
        asyncio.run(asyncio.wait_for(test(), 60))
    loud = [r for r in caplog.records if "has not synced" in r.getMessage()]
    assert len(loud) == 1 and loud[0].levelno == logging.ERROR
    assert nobody in loud[0].getMessage() and "--registry-sync-timeout" in loud[0].getMessage()


def test_a_second_serve_on_a_busy_xds_address_exits_2_with_one_line(tmp_path: Path) -> None:
    mesh = examples_copy(tmp_path)
    with ServeProcess([mesh]) as first:
        for address, reason in (
            (first.xds_address, "Address already in use"),
            ("192.0.2.1:15010", "Cannot assign requested address"),  # TEST-NET-1: not this host's
            ("no-such-host.invalid:15010", "cannot resolve no-such-host.invalid"),
        ):
            flags = ["-c", str(mesh), "--xds-address", address, "--admin-address", "127.0.0.1:0"]
            proc = subprocess.run(
                [*meshctl_command(), "serve", *flags],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode == 2, proc.stderr
            assert proc.stdout == ""
            (line,) = proc.stderr.strip().splitlines()  # one line: no traceback, no gRPC C-core log
            assert line.startswith("error: cannot serve: ") and reason in line, proc.stderr
        assert first.ready()
