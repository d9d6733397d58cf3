"""One trust across replicas: each publishes its roots' fingerprints, and proxy-status flags
replicas that do not share them (two servers with roots of their own split the mesh)."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ratings_mesh

from meshctl.server.metrics import Metrics
from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command


def proxy_status(*admins: str) -> subprocess.CompletedProcess[str]:
    flags = [arg for a in admins for arg in ("--admin", a)]
    return subprocess.run(
        [*meshctl_command(), "proxy-status", *flags], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.slow
def test_proxy_status_flags_replicas_with_different_roots(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(ratings_mesh("renew", free_port()))
    short = ["--workload-cert-lifetime", "2h"]
    with ServeProcess([mesh], extra_args=["--state-dir", str(tmp_path / "a"), *short]) as a:
        shutil.copytree(tmp_path / "a", tmp_path / "shared")
        with (
            ServeProcess([mesh], extra_args=["--state-dir", str(tmp_path / "b")]) as b,
            ServeProcess([mesh], extra_args=["--state-dir", str(tmp_path / "shared")]) as same,
        ):
            fingerprint = a.admin_json("/version")["root_fingerprints"]
            assert fingerprint and fingerprint[0].startswith("sha256:")
            assert f'meshctl_ca_root_info{{fingerprint="{fingerprint[0]}"}} 1' in a.admin("metrics")
            assert same.admin_json("/version")["root_fingerprints"] == fingerprint
            assert b.admin_json("/version")["root_fingerprints"] != fingerprint

            agreed = proxy_status(a.admin_address, same.admin_address)
            assert agreed.returncode == 0 and "root CA" not in agreed.stderr, agreed.stderr
            split = proxy_status(a.admin_address, b.admin_address)
            assert split.returncode == 1, split.stderr
            assert "do not share one root CA" in split.stderr
            assert a.admin_address in split.stderr and b.admin_address in split.stderr

            # Outage arithmetic: 2 h renewed at two thirds leaves 40 min without any replica.
            assert "after 0:40:00 without any replica: under an hour" in a.log()
            assert "without any replica" not in b.log()


def test_the_earliest_workload_certificate_expiry_is_exported() -> None:
    metrics = Metrics()
    assert "meshctl_workload_cert_earliest_expiry_seconds" not in metrics.render()
    ends = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=8)
    metrics.watch_workload_certificates(lambda: ends)
    [line] = [x for x in metrics.render().splitlines() if x.startswith("meshctl_workload_cert_earliest_expiry_seconds")]
    assert 8 * 3600 - 60 < float(line.split()[-1]) <= 8 * 3600
