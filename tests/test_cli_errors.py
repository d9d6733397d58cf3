"""User mistakes on the command line end in one line with a hint and exit 2, never a traceback."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*meshctl_command(), *args], capture_output=True, text=True, timeout=60, check=False)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    mesh = tmp_path_factory.mktemp("cli") / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    with ServeProcess([mesh]) as process:
        yield process


@pytest.mark.slow
def test_proxy_status_pointed_at_the_xds_port_says_so(serve: ServeProcess) -> None:
    line = one_error_line(meshctl("proxy-status", "--admin", serve.xds_address))
    assert "looks like the xDS port" in line and "--admin-address" in line


@pytest.mark.slow
def test_proxy_status_without_a_server_says_none_is_running() -> None:
    address = f"127.0.0.1:{free_port()}"
    line = one_error_line(meshctl("proxy-status", "--admin", address))
    assert f"nothing listens on {address}: is meshctl serve running" in line


@pytest.mark.slow
def test_proxy_status_with_a_missing_token_file_names_it(serve: ServeProcess, tmp_path: Path) -> None:
    missing = tmp_path / "token"
    line = one_error_line(meshctl("proxy-status", "--admin", serve.admin_address, "--admin-token-file", str(missing)))
    assert str(missing) in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--proxy", "a.b", "--ip", "10.0.0.300"], "--ip '10.0.0.300' is not an IPv4 or IPv6 address"),
        (["--proxy", "sidecar~not-an-ip~a.b~b.svc.cluster.local"], "is not an IPv4 or IPv6 address"),
        (["--proxy", "a.b", "--ip", "10.0.0.3", "-o", "xml"], "'xml' is not one of"),
    ],
)
def test_bootstrap_refuses_what_envoy_could_not_use(args: list[str], says: str) -> None:
    proc = meshctl("bootstrap", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert says in " ".join(proc.stderr.split()), proc.stderr


def test_services_with_an_unreachable_consul_is_one_line() -> None:
    address = f"127.0.0.1:{free_port()}"
    line = one_error_line(meshctl("services", "--config-dir", str(EXAMPLES), "--consul", address))
    assert f"cannot read consul at http://{address}" in line
