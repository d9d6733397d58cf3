"""Rotating the mesh CA under traffic, as docs/vm-setup.md ("Rotating the CA") tells an operator.

`meshctl serve --ca-dir` follows Istio's cacerts files while it runs. Two real Envoys (a client
VM and a server VM behind its Sidecar ingress, ISTIO_MUTUAL, STRICT) carry a request loop through
the whole procedure, each request on a new upstream connection (`maxRequestsPerConnection: 1`)
so every request is a new mutual TLS handshake under the trust and certificates of that moment:

0. the intermediate is replaced by another of the same root: every workload certificate is
   reissued by it;
1. a second root is added to `root-cert.pem` (both roots trusted);
2. the signing certificate becomes an intermediate of the new root (its files written one by one,
   as `cp` would): every workload certificate is reissued by it within the reissue window;
3. the old root is removed from `root-cert.pem`.

No request may fail, and at the end both Envoys trust only the new root and present a
certificate chain that verifies up to it (read from their own admin API).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import DEADLINE, needs_envoy
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store
from test_ca import key_pem, make_ca_cert, pem, write_cacerts

from meshctl.testing.backends import Backend, RequestLoop, send
from meshctl.testing.builders import vm_behind_ingress_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess, meshctl_command

NS = "rot"
HOST = f"reviews.{NS}.mesh"
SERVER_IP = "127.0.0.23"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
SERVER = f"sidecar~{SERVER_IP}~reviews-v1.{NS}~{NS}.svc.cluster.local"

POLICY = f"""apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {NS}}}
spec:
  mtls: {{mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: {HOST}
  trafficPolicy:
    tls: {{mode: ISTIO_MUTUAL}}
    connectionPool:
      http: {{maxRequestsPerConnection: 1}}
"""


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def trusted_roots(envoy: EnvoyProcess) -> list[x509.Certificate]:
    """The roots the Envoy's `ROOTCA` secret holds now (its config dump)."""
    return x509.load_pem_x509_certificates(_secret(envoy, "ROOTCA")["validation_context"]["trusted_ca"])


def workload_chain(envoy: EnvoyProcess) -> list[x509.Certificate]:
    """The certificate chain of the Envoy's `default` secret now (leaf first)."""
    return x509.load_pem_x509_certificates(_secret(envoy, "default")["tls_certificate"]["certificate_chain"])


def _secret(envoy: EnvoyProcess, name: str) -> dict[str, dict[str, bytes]]:
    dump = json.loads(envoy.admin("config_dump?resource=dynamic_active_secrets"))
    for entry in dump["configs"]:
        if entry["name"] == name:
            secret = entry["secret"]
            for part in (p for p in secret.values() if isinstance(p, dict)):
                for field, value in part.items():
                    if isinstance(value, dict) and "inline_bytes" in value:
                        part[field] = base64.b64decode(value["inline_bytes"])
            return secret  # type: ignore[no-any-return]
    raise AssertionError(f"no secret {name}")


def chains_to(chain: list[x509.Certificate], root: x509.Certificate) -> bool:
    leaf, *rest = chain
    verifier = PolicyBuilder().store(Store([root])).build_client_verifier()
    try:
        verifier.verify(leaf, rest)
    except Exception:
        return False
    return True


def handshakes(envoy: EnvoyProcess, port: int) -> int:
    stats = dict(line.split(": ", 1) for line in envoy.admin("stats").splitlines() if ": " in line)
    return int(stats.get(f"listener.{SERVER_IP}_{port}.ssl.handshake", "0"))


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
def test_rotating_to_a_new_root_under_traffic_fails_no_request(tmp_path: Path) -> None:
    old_root, new_root = make_ca_cert("Example Corp root 2024"), make_ca_cert("Example Corp root 2025")
    first_ca = make_ca_cert("mesh CA 2023", old_root)
    old_ca, new_ca = make_ca_cert("mesh CA 2024", old_root), make_ca_cert("mesh CA 2025", new_root)
    cacerts = write_cacerts(tmp_path / "cacerts", first_ca, old_root)
    (cacerts / "ca-key.pem").chmod(0o600)
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    service_port, ingress_port = free_port(), free_port(SERVER_IP)
    with ExitStack() as stack:
        app_server = stack.enter_context(Backend("reviews", "127.0.0.1"))
        (mesh / "mesh.yaml").write_text(
            vm_behind_ingress_yaml(
                namespace=NS,
                host=HOST,
                address=SERVER_IP,
                service_port=service_port,
                ingress_port=ingress_port,
                app_port=app_server.port,
            )
        )
        (mesh / "policy.yaml").write_text(POLICY)
        args = ["--insecure-send-keys", "--ca-dir", str(cacerts), "--ca-reissue-window", "2s"]
        server = stack.enter_context(ServeProcess([mesh], extra_args=args))
        stack.callback(lambda: print(f"--- meshctl serve log:\n{server.log()[-6000:]}"))
        envoys = {}
        for name, node in (("server", SERVER), ("client", CLIENT)):
            envoys[name] = envoy = stack.enter_context(EnvoyProcess(server.bootstrap(node)))
            stack.callback(lambda e=envoy, n=name: print(f"--- envoy {n} log:\n{e.log()[-3000:]}"))
        wait_for(lambda: send(service_port, HOST).ok, "the client reaches reviews through the mesh")
        for envoy in envoys.values():
            assert chains_to(workload_chain(envoy), old_root.cert)

        with RequestLoop(service_port, HOST) as loop:
            loop.wait_for_answers(10)
            # 0. A new intermediate of the same root: the key first, then its certificate and chain.
            replace_file(cacerts / "ca-key.pem", key_pem(old_ca.key), mode=0o600)
            replace_file(cacerts / "ca-cert.pem", pem(old_ca.cert))
            replace_file(cacerts / "cert-chain.pem", pem(old_ca.cert, old_root.cert))
            for envoy in envoys.values():
                wait_for(lambda e=envoy: workload_chain(e)[1] == old_ca.cert, "each Envoy's certificate is reissued")
            loop.wait_for_answers(10)

            # 1. The new root joins the bundle: both Envoys trust both.
            replace_file(cacerts / "root-cert.pem", pem(old_root.cert, new_root.cert))
            for envoy in envoys.values():
                wait_for(lambda e=envoy: new_root.cert in trusted_roots(e), "the new root reaches each Envoy")
            loop.wait_for_answers(10)

            # 2. The new intermediate signs, its files copied in one by one: every workload
            # certificate is reissued from it.
            replace_file(cacerts / "ca-cert.pem", pem(new_ca.cert))
            wait_for(lambda: "cannot be used, the CA in force stays" in server.log(), "the half-copied CA is refused")
            replace_file(cacerts / "ca-key.pem", key_pem(new_ca.key), mode=0o600)
            replace_file(cacerts / "cert-chain.pem", pem(new_ca.cert, new_root.cert))
            for envoy in envoys.values():
                wait_for(lambda e=envoy: workload_chain(e)[1] == new_ca.cert, "each Envoy's certificate is reissued")
            # What tells the operator the step is done: only the new signer holds certificates.
            signers = [
                line for line in server.admin("metrics").splitlines() if line.startswith("meshctl_workload_certs{")
            ]
            assert signers == ['meshctl_workload_certs{signer="CN=mesh CA 2025"} 2'], signers
            loop.wait_for_answers(10)

            # 3. The old root leaves the bundle.
            replace_file(cacerts / "root-cert.pem", pem(new_root.cert))
            for envoy in envoys.values():
                wait_for(lambda e=envoy: trusted_roots(e) == [new_root.cert], "the old root leaves each Envoy")
            before = handshakes(envoys["server"], ingress_port)
            loop.wait_for_answers(20)
            assert handshakes(envoys["server"], ingress_port) >= before + 10  # new connections, new trust only
        assert loop.failures == []

        for envoy in envoys.values():
            assert trusted_roots(envoy) == [new_root.cert]
            # And as /certs shows them: the one CA it trusts is the new root.
            certs = json.loads(envoy.admin("certs"))["certificates"]
            serials = {int(c["serial_number"], 16) for entry in certs for c in entry.get("ca_cert", [])}
            assert serials == {new_root.cert.serial_number}, serials
            chain = workload_chain(envoy)
            assert chains_to(chain, new_root.cert) and not chains_to(chain, old_root.cert)


def test_a_replica_refuses_to_make_a_root_of_its_own(tmp_path: Path) -> None:
    """Config from Consul KV, or a directory meshctl-git-sync keeps, says the server is one of
    several replicas: a self-signed root made by it alone would split the mesh."""
    state = tmp_path / "state"
    base = ["serve", "--state-dir", str(state), "--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        # Started, it would wait for Consul or serve: the timeout fails the test then.
        command = [*meshctl_command(), *base, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)

    result = serve("--config-consul-kv", "mesh", "--consul", "127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "one of several replicas" in lines[0] and "--ca-dir" in lines[0], lines
    assert not (state / "ca").exists()

    # The layout meshctl-git-sync keeps: a link into its trees, beside its cache.
    sync = tmp_path / "sync"
    (sync / "cache.git").mkdir(parents=True)
    (sync / "trees" / "0123abcd").mkdir(parents=True)
    (sync / "current").symlink_to(sync / "trees" / "0123abcd")
    result = serve("--config-dir", str(sync / "current"))
    assert result.returncode == 2 and "meshctl-git-sync" in result.stderr, result.stderr
    assert not (state / "ca").exists()


def test_the_certificate_service_refuses_a_signing_root_the_xds_port_does_not_trust(tmp_path: Path) -> None:
    """During a root rotation, a VM's xDS client certificate from the new root would lock it out
    until `--client-ca` trusts that root: the bundle trusting the old one is not enough."""
    from meshctl.security.ca import CertificateAuthority
    from meshctl.server.ca_service import CertificateService, Refusal

    old_root, new_root = make_ca_cert("old root"), make_ca_cert("new root")
    new_ca = make_ca_cert("new mesh CA", new_root)
    cacerts = write_cacerts(tmp_path / "cacerts", new_ca, new_root, roots=pem(old_root.cert, new_root.cert))
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(pem(old_root.cert))
    ca = CertificateAuthority.from_ca_dir(cacerts)
    service = CertificateService(ca, lambda: None, datetime.timedelta(days=1), client_ca)
    with pytest.raises(Refusal, match="not trusted by --client-ca"):
        service._check_trusted()
    client_ca.write_bytes(pem(old_root.cert, new_root.cert))
    service._check_trusted()


VM_MESH = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client, namespace: shop}
spec: {address: 10.0.0.9, serviceAccount: client}
"""


def test_a_vm_renews_from_the_new_root_once_the_server_follows_it(tmp_path: Path) -> None:
    """The VM side of step 2: `meshctl ca renew`, as its timer runs it, gets a certificate from
    the new CA (chained to the new root) once `--ca-dir` has switched, over the xDS port that
    trusts both roots; after step 3 (the port trusts the new root alone) that certificate renews."""
    from meshctl.security import renewal
    from meshctl.security.ca import CertificateAuthority
    from meshctl.server.auth import XdsTls
    from meshctl.testing.server import run, serving

    old_root, new_root = make_ca_cert("old root"), make_ca_cert("new root")
    old_ca, new_ca = make_ca_cert("old mesh CA", old_root), make_ca_cert("new mesh CA", new_root)
    cacerts = write_cacerts(tmp_path / "cacerts", old_ca, old_root, roots=pem(old_root.cert, new_root.cert))
    (cacerts / "ca-key.pem").chmod(0o600)
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "client.yaml").write_text(VM_MESH)
    signing = CertificateAuthority.from_ca_dir(cacerts)
    tls = tmp_path / "tls"
    tls.mkdir()
    served = signing.issue_server(ip_addresses=["127.0.0.1"])
    (tls / "cert.pem").write_bytes(served.cert_chain_pem)
    (tls / "key.pem").write_bytes(served.private_key_pem)
    client_ca = tls / "client-ca.pem"
    client_ca.write_bytes(pem(old_root.cert, new_root.cert))
    vm = tmp_path / "vm"
    vm.mkdir()
    first = signing.issue_client(["client.shop"])
    (vm / "cert-chain.pem").write_bytes(first.cert_chain_pem)
    (vm / "key.pem").write_bytes(first.private_key_pem)
    (vm / "root-cert.pem").write_bytes(pem(old_root.cert))  # what the VM trusts meshctl's certificate with

    def chain() -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates((vm / "cert-chain.pem").read_bytes())

    async def test() -> None:
        import asyncio

        settings = {"ca_dir": cacerts, "tls": XdsTls(tls / "cert.pem", tls / "key.pem", client_ca)}
        async with serving(mesh, **settings) as server:
            loop = asyncio.get_running_loop()
            address = f"127.0.0.1:{server.xds_port}"
            await loop.run_in_executor(None, renewal.renew, vm, address)
            assert chain()[1] == old_ca.cert and chains_to(chain(), old_root.cert)

            replace_file(cacerts / "ca-key.pem", key_pem(new_ca.key), mode=0o600)
            replace_file(cacerts / "ca-cert.pem", pem(new_ca.cert))
            replace_file(cacerts / "cert-chain.pem", pem(new_ca.cert, new_root.cert))
            for _ in range(100):
                if server.ca is not None and server.ca.certificate == new_ca.cert:
                    break
                await asyncio.sleep(0.1)
            await loop.run_in_executor(None, renewal.renew, vm, address)
            assert chain()[1] == new_ca.cert and chains_to(chain(), new_root.cert)

            replace_file(client_ca, pem(new_root.cert))
            replace_file(cacerts / "root-cert.pem", pem(new_root.cert))
            # The port reads its TLS files again at the next handshake: the VM's new certificate is
            # trusted by the new root alone.
            await loop.run_in_executor(None, renewal.renew, vm, address)
            assert chains_to(chain(), new_root.cert)

    run(test)


def test_certificates_of_a_replaced_signer_are_reissued_spread_over_the_window(tmp_path: Path) -> None:
    """After the signing certificate changes, each certificate it issued is due at its own random
    moment within the window, not all at the next round (the fleet does not renew in one burst),
    and the trust bundle is unchanged when only the intermediate is."""
    from conftest import PRODUCTPAGE, REVIEWS_V1, examples_copy

    from meshctl.security.ca import CertificateAuthority
    from meshctl.testing.ads_client import AdsClient
    from meshctl.testing.server import run, serving
    from meshctl.xds import types

    root = make_ca_cert("root")
    first, second = make_ca_cert("first mesh CA", root), make_ca_cert("second mesh CA", root)
    cacerts = write_cacerts(tmp_path / "cacerts", first, root)
    (cacerts / "ca-key.pem").chmod(0o600)
    replacement = write_cacerts(tmp_path / "replacement", second, root)
    (replacement / "ca-key.pem").chmod(0o600)
    other_root = make_ca_cert("other root")
    elsewhere = write_cacerts(tmp_path / "elsewhere", make_ca_cert("other mesh CA", other_root), other_root)
    (elsewhere / "ca-key.pem").chmod(0o600)
    window = datetime.timedelta(seconds=600)

    async def test() -> None:
        async with serving(examples_copy(tmp_path), ca_dir=cacerts, insecure_send_keys=True) as server:
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, PRODUCTPAGE) as one, AdsClient(address, REVIEWS_V1) as two:
                for client in (one, two):
                    await client.wait_for(lambda c: len(c.resources[types.SECRET]) == 2, timeout=20)
                assert server.secrets.signers() == {"CN=first mesh CA": 2}
                assert server.ca_holder is not None
                server.ca_holder.swap(CertificateAuthority.from_ca_dir(replacement))
                now = datetime.datetime.now(datetime.UTC)
                draws = iter([0.25, 0.75])
                assert server.secrets.follow_ca(window, rng=lambda: next(draws)) == set()  # same bundle
                due = server.secrets.due()
                assert due is not None and now + window * 0.2 < due < now + window * 0.3
                assert server.secrets.due_nodes(now) == set()
                assert len(server.secrets.due_nodes(now + window / 2)) == 1
                assert server.secrets.due_nodes(now + window) == {PRODUCTPAGE, REVIEWS_V1}

                # A bundle without the root they chain to: peers refuse them already, so they are
                # due at once, and every holder is pushed the new bundle now.
                server.ca_holder.swap(CertificateAuthority.from_ca_dir(elsewhere))
                assert server.secrets.follow_ca(window) == {PRODUCTPAGE, REVIEWS_V1}
                assert server.secrets.due_nodes(datetime.datetime.now(datetime.UTC)) == {PRODUCTPAGE, REVIEWS_V1}

    run(test)
