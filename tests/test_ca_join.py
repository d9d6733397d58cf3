"""First boot by join token: a VM's key is made on it, and a token gets one certificate, once.

`meshctl serve` runs as a process with mutual TLS on the xDS port and a join port; tokens come
from `meshctl ca token` on the server's state directory, and the VM side is `meshctl ca renew
--token`, as an operator runs them.
"""

from __future__ import annotations

import grp
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ratings_mesh
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command

NS = "renew"  # the namespace of the ratings mesh these tests serve


def meshctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*meshctl_command(), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.slow
def test_a_vm_joins_once_with_a_token_for_its_own_workload(tmp_path: Path) -> None:
    state, tls = tmp_path / "state", tmp_path / "tls"
    assert meshctl("ca", "issue", "--server", "127.0.0.1", "--out", tls, "--state-dir", state).returncode == 0
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(ratings_mesh(NS, free_port()))
    join_port = free_port()
    flags = [
        "--state-dir", str(state), "--tls-cert", str(tls / "cert-chain.pem"), "--tls-key", str(tls / "key.pem"),
        "--client-ca", str(tls / "root-cert.pem"), "--join-address", f"127.0.0.1:{join_port}",
    ]  # fmt: skip
    join_server = f"127.0.0.1:{join_port}"
    root = tls / "root-cert.pem"

    def token(workload: str, ttl: str = "1h") -> Path:
        minted = meshctl("ca", "token", "--proxy", workload, "--ttl", ttl, "--state-dir", state)
        assert minted.returncode == 0, minted.stderr
        path = tmp_path / f"{workload}-{time.monotonic_ns()}.token"
        path.write_text(minted.stdout)
        return path

    def join(token_file: Path, directory: Path, *more: str) -> subprocess.CompletedProcess[str]:
        return meshctl(
            "ca", "renew", "--server", join_server, "--dir", directory, "--token", token_file, "--root", root, *more
        )

    with ServeProcess([mesh], extra_args=flags) as serve:
        vm = tmp_path / "vm"
        first = token(f"client.{NS}")
        joined = join(first, vm)
        assert joined.returncode == 0, joined.stderr + serve.log()[-2000:]
        leaf = x509.load_pem_x509_certificate((vm / "cert-chain.pem").read_bytes())
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(n.value) for n in sans] == [f"client.{NS}", f"spiffe://cluster.local/ns/{NS}/sa/client"]
        # The key was made here, by the command, and only its owner reads it.
        key = serialization.load_pem_private_key((vm / "key.pem").read_bytes(), password=None)
        assert key.public_key() == leaf.public_key()
        assert (vm / "key.pem").stat().st_mode & 0o077 == 0
        assert (vm / "root-cert.pem").read_bytes() == root.read_bytes()

        # The certificate is one the xDS port takes: it renews itself there.
        group = grp.getgrgid(os.getgid()).gr_name
        renewed = meshctl("ca", "renew", "--server", serve.xds_address, "--dir", vm, "--force", "--group", group)
        assert renewed.returncode == 0, renewed.stderr
        # --group: the new key is its group's to read (Envoy's, under systemd), and no one else's.
        renewed_key = (vm / "key.pem").stat()
        assert (renewed_key.st_mode & 0o777, renewed_key.st_gid) == (0o640, os.getgid())
        assert x509.load_pem_x509_certificate((vm / "cert-chain.pem").read_bytes()).serial_number != leaf.serial_number

        # A second use, an expired token and a token for another workload get nothing.
        again = join(first, tmp_path / "again")
        assert again.returncode == 2 and "used already" in again.stderr, again.stderr
        short = token(f"client.{NS}", ttl="1s")
        time.sleep(2)
        late = join(short, tmp_path / "late")
        assert late.returncode == 2 and "expired" in late.stderr, late.stderr
        other = join(token(f"ratings-1.{NS}"), tmp_path / "other", "--proxy", f"client.{NS}")
        assert other.returncode == 2 and f"client.{NS}" in other.stderr and "join token" in other.stderr, other.stderr
        for refused in (again, late, other):
            assert refused.stderr.count("\n") == 1, refused.stderr
        for directory in ("again", "late", "other"):
            assert not (tmp_path / directory / "cert-chain.pem").exists()
        # A forged token (another CA's key) is refused too.
        forged = tmp_path / "forged.token"
        other_state = tmp_path / "other-state"
        minted = meshctl("ca", "token", "--proxy", f"client.{NS}", "--state-dir", other_state)
        forged.write_text(minted.stdout)
        refused = join(forged, tmp_path / "forged")
        assert refused.returncode == 2 and "not minted by this mesh's CA" in refused.stderr, refused.stderr
