"""A VM's xDS client certificate renewed on the VM while a real Envoy keeps running.

`meshctl serve` runs as a process with mutual TLS on the xDS port; the VM's certificate (20 s)
comes from `meshctl ca issue --proxy`; Envoy starts from `meshctl bootstrap --xds-cert-dir`. Three
times, `meshctl ca renew` runs as the timer runs it, the old certificate is left to expire, and
the server is restarted, which makes Envoy connect again: only the renewed certificate can get it
in. Envoy is never restarted and its config never changes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import envoy_log_left_open, needs_envoy, ratings_mesh
from cryptography import x509

from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command

NS = "renew"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"


def meshctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*meshctl_command(), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def wait_until(what: str, check: Callable[[], bool], log: Callable[[], str], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not seen after {deadline}s:\n{log()[-12000:]}")
        time.sleep(0.2)


def leaf(directory: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / "cert-chain.pem").read_bytes())


def dynamic_config(envoy: EnvoyProcess) -> list[Any]:
    """Envoy's xDS-delivered clusters and listeners with their versions (no timestamps)."""
    dump = json.loads(envoy.admin("config_dump"))
    held = []
    for section in dump["configs"]:
        for key in ("dynamic_active_clusters", "dynamic_listeners"):
            for item in section.get(key, []):
                state = item.get("active_state", item)
                held.append((item.get("name") or state.get("cluster", {}).get("name"), state.get("version_info")))
    return sorted(held, key=str)


def connected(envoy: EnvoyProcess) -> bool:
    return "control_plane.connected_state: 1" in envoy.admin("stats?filter=control_plane.connected_state")


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
@envoy_log_left_open
def test_envoy_follows_three_renewals_without_a_restart(tmp_path: Path) -> None:
    state, tls, vm = tmp_path / "state", tmp_path / "tls", tmp_path / "vm"
    issued = meshctl("ca", "issue", "--server", "127.0.0.1", "--out", tls, "--state-dir", state)
    assert issued.returncode == 0, issued.stderr
    issued = meshctl(
        "ca", "issue", "--proxy", f"client.{NS}", "--service-account", "client",
        "--lifetime", "20s", "--out", vm, "--state-dir", state,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(ratings_mesh(NS, free_port()))
    flags = [
        "--state-dir", str(state), "--tls-cert", str(tls / "cert-chain.pem"), "--tls-key", str(tls / "key.pem"),
        "--client-ca", str(tls / "root-cert.pem"), "--workload-cert-lifetime", "20s",
    ]  # fmt: skip
    with ServeProcess([mesh], extra_args=flags) as serve:
        config = serve.bootstrap(CLIENT, extra_args=["--xds-cert-dir", str(vm)])
        with EnvoyProcess(config) as envoy:
            wait_until("Envoy's first config", lambda: f"ratings.{NS}.mesh" in envoy.admin("clusters"), envoy.log)
            held = dynamic_config(envoy)
            assert held, "no dynamic config"
            pid = envoy._proc.pid if envoy._proc is not None else None
            for round_ in range(3):
                old = leaf(vm)
                # As the timer runs it, every second here: nothing until two thirds of its life.
                runs = []
                while leaf(vm).serial_number == old.serial_number:
                    assert time.time() < old.not_valid_after_utc.timestamp(), f"round {round_}: never renewed"
                    run = meshctl("ca", "renew", "--server", serve.xds_address, "--dir", vm)
                    assert run.returncode == 0, run.stderr
                    runs.append(run.stderr)
                    time.sleep(1)
                new = leaf(vm)
                # The timer's next run, at once: a fresh certificate is not due.
                again = meshctl("ca", "renew", "--server", serve.xds_address, "--dir", vm)
                assert again.returncode == 0 and "is not due" in again.stderr, again.stderr
                assert leaf(vm).serial_number == new.serial_number
                assert new.serial_number != old.serial_number, f"round {round_}: not renewed"
                assert new.extensions.get_extension_for_class(x509.SubjectAlternativeName).value == (
                    old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                )
                # Envoy has loaded the new pair: its /certs lists the new serial.
                serial = format(new.serial_number, "x")
                wait_until(
                    f"round {round_}: Envoy holding certificate {serial}",
                    lambda serial=serial: serial in envoy.admin("certs").lower(),
                    envoy.log,
                )
                # The old certificate expires, then a new connection can only use the new one.
                wait = (old.not_valid_after_utc.timestamp() - time.time()) + 1
                if wait > 0:
                    time.sleep(wait)
                serve.restart()
                both_logs = lambda: envoy.log() + serve.log()  # noqa: E731
                wait_until(f"round {round_}: Envoy connected again", lambda: connected(envoy), both_logs)
                wait_until(
                    f"round {round_}: the new server streaming to Envoy",
                    lambda: any(p["proxy"] == CLIENT for p in serve.admin_json("debug/syncz")),
                    serve.log,
                )
                assert envoy.running() and envoy._proc is not None and envoy._proc.pid == pid
                # The server exports the expiry of the certificate the proxy connected with: the new one.
                ends = new.not_valid_after_utc
                [entry] = [p for p in serve.admin_json("debug/syncz") if p["proxy"] == CLIENT]
                assert entry["client_cert_expires"] == ends.timestamp()
                metric = f'meshctl_xds_client_cert_expiry_timestamp{{workload="{NS}/client"}} {int(ends.timestamp())}'
                assert metric in serve.admin("metrics")
                status = meshctl("proxy-status", "--admin", serve.admin_address, "-o", "json")
                assert json.loads(status.stdout)[0]["client_cert_expires"] == ends.isoformat(timespec="seconds")
                # Twenty seconds is well within the hour: proxy-status says so, before it ends.
                assert f"expires at {ends.isoformat(timespec='seconds')}" in status.stderr
                assert dynamic_config(envoy) == held
            assert "refused node" not in serve.log()
            # Envoy read each pair once both files were in place.
            assert "Failed to reload certificates" not in envoy.log()
