"""A client certificate proves one workload and one service account, checked wherever the binding
can change: the rule as pure functions over small snapshots, then the real server on loopback over
mutual TLS, where a stream whose workload goes away is ended instead of re-bound."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from meshctl.errors import BindingError
from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.auth import PeerIdentity, XdsTls, authorize_node
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.node import ProxyNode, parse_node_id
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.testing.server import run, serving
from meshctl.xds import types

#: A ServiceEntry whose inline endpoint runs as `payments`; WorkloadEntries without a service
#: account (a, b) and one with its own (victim), whose service names mutual TLS.
MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: 10.0.0.31, serviceAccount: payments, labels: {app: payments, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: victim, namespace: shop}
spec:
  hosts: [victim.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9090, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: victim}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: victim, namespace: shop}
spec: {address: 10.0.0.34, serviceAccount: victim-sa, labels: {app: victim, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a, namespace: shop}
spec: {address: 10.0.0.32, labels: {app: a}}
"""

B_ENTRY = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: b, namespace: shop}
spec: {address: 10.0.0.33, labels: {app: b}}
"""

#: WorkloadEntry a's node, claiming the IP of payments' inline endpoint.
A_AT_PAYMENTS = "sidecar~10.0.0.31~a.shop~shop.svc.cluster.local"
#: WorkloadEntry b's node, claiming victim's IP.
B_AT_VICTIM = "sidecar~10.0.0.34~b.shop~shop.svc.cluster.local"


def peer(*sans: str) -> PeerIdentity:
    uris = tuple(s.removeprefix("URI:") for s in sans if s.startswith("URI:"))
    dns = tuple(s.removeprefix("DNS:") for s in sans if s.startswith("DNS:"))
    return PeerIdentity(uris, dns, has_certificate=True)


def attested(node_id: str, *sans: str, mesh: str = MESH + "---" + B_ENTRY) -> ProxyNode:
    outcome = authorize_node(parse_node_id(node_id), peer(*sans), snapshot_from_yaml(mesh))
    assert not isinstance(outcome, str), outcome
    return outcome


# -- the rule, as pure functions ---------------------------------------------------------------


def test_an_endpoint_at_the_claimed_ip_lends_neither_instances_nor_its_service_account() -> None:
    snapshot = snapshot_from_yaml(MESH)
    node = attested(A_AT_PAYMENTS, "DNS:a.shop", mesh=MESH)
    assert (node.workload, node.service_account) == ("shop/a", "default")
    proxy = bind_proxy(node, snapshot)
    assert proxy.instances == () and proxy.service_account == "default"
    # Its certificate naming payments proves nothing: a runs as default.
    refusal = authorize_node(
        parse_node_id(A_AT_PAYMENTS), peer("URI:spiffe://cluster.local/ns/shop/sa/payments"), snapshot
    )
    assert isinstance(refusal, str) and "sa/default" in refusal, refusal
    # Nor does any other account of the namespace, for a workload that names none.
    refusal = authorize_node(parse_node_id(A_AT_PAYMENTS), peer("URI:spiffe://cluster.local/ns/shop/sa/x"), snapshot)
    assert isinstance(refusal, str)
    node = attested(A_AT_PAYMENTS, "URI:spiffe://cluster.local/ns/shop/sa/default", mesh=MESH)
    assert node.service_account == "default"


def test_the_registry_endpoint_itself_is_proved_by_its_own_service_account() -> None:
    """A VM that is payments' inline endpoint (no WorkloadEntry) binds to it by IP."""
    node = attested("sidecar~10.0.0.31~payments-vm.shop~shop.svc.cluster.local", "URI:spiffe://td/ns/shop/sa/payments")
    assert node.service_account == "payments"
    assert [i.service.hostname for i in bind_proxy(node, snapshot_from_yaml(MESH)).instances] == ["payments.shop.mesh"]


def test_endpoints_at_one_address_that_disagree_prove_no_identity() -> None:
    mesh = (
        MESH
        + """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ledger, namespace: shop}
spec:
  hosts: [ledger.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.31, serviceAccount: ledger}]
"""
    )
    node = parse_node_id("sidecar~10.0.0.31~vm.shop~shop.svc.cluster.local")
    for account in ("payments", "ledger"):
        refusal = authorize_node(node, peer(f"URI:spiffe://td/ns/shop/sa/{account}"), snapshot_from_yaml(mesh))
        assert isinstance(refusal, str) and "several service accounts (ledger, payments)" in refusal, refusal


def test_a_proved_node_never_binds_to_another_workload() -> None:
    node = attested(B_AT_VICTIM, "DNS:b.shop")
    assert (node.workload, node.service_account) == ("shop/b", "default")
    assert bind_proxy(node, snapshot_from_yaml(MESH + "---" + B_ENTRY)).workload == "shop/b"
    # b's entry deleted: victim is at the IP b claimed, and would have been its workload.
    with pytest.raises(BindingError, match=r"b\.shop.*shop/b.*now binds to workload shop/victim"):
        bind_proxy(node, snapshot_from_yaml(MESH))
    # b's entry now running as another account: what the certificate proved no longer holds.
    with pytest.raises(BindingError, match="as service account other"):
        bind_proxy(node, snapshot_from_yaml(MESH + "---" + B_ENTRY.replace("labels", "serviceAccount: other, labels")))
    # An unproved node (no client CA) is bound as before.
    assert bind_proxy(replace(node, attested=False, workload=""), snapshot_from_yaml(MESH)).workload == "shop/victim"


# -- the real server over mutual TLS -----------------------------------------------------------


def test_a_stream_whose_workload_is_deleted_is_ended_and_its_key_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    ca = CertificateAuthority.self_signed(state)
    issued = ca.issue_server(ip_addresses=["127.0.0.1"])
    (tmp_path / "server.pem").write_bytes(issued.cert_chain_pem)
    (tmp_path / "server.key").write_bytes(issued.private_key_pem)
    (tmp_path / "root.pem").write_bytes(ca.root_pem)
    b_cert = ca.issue_client(["b.shop"])
    a_cert = ca.issue_client([], WorkloadIdentity("cluster.local", "shop", "payments"))
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(MESH)
    (mesh / "b.yaml").write_text(B_ENTRY)

    async def test() -> None:
        tls = XdsTls(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "root.pem")
        async with serving(mesh, tls=tls, state_dir=state) as server:
            address = f"127.0.0.1:{server.xds_port}"

            def channel(cert: IssuedCertificate) -> grpc.aio.Channel:
                credentials = grpc.ssl_channel_credentials(ca.root_pem, cert.private_key_pem, cert.cert_chain_pem)
                return grpc.aio.secure_channel(address, credentials)

            # a's node claiming payments' IP with a certificate saying payments: refused at connect.
            chan = channel(a_cert)
            async with AdsClient(address, A_AT_PAYMENTS, channel=chan) as impostor:
                with pytest.raises(ConnectionError):
                    await impostor.wait_for(lambda c: c.complete(), timeout=10)
                assert impostor.resources[types.SECRET] == {}
            await chan.close(None)
            chan = channel(b_cert)
            async with AdsClient(address, B_AT_VICTIM, channel=chan) as client:
                await client.wait_for(lambda c: c.complete() and len(c.resources[types.SECRET]) == 2, timeout=20)
                assert server.secrets.held_identities() == ["spiffe://cluster.local/ns/shop/sa/default"]
                (mesh / "b.yaml").unlink()
                with pytest.raises(ConnectionError, match="PERMISSION_DENIED"):
                    await client.wait_for(lambda c: False, timeout=20)
                default = client.resources[types.SECRET]["default"]
                chain = default.tls_certificate.certificate_chain.inline_bytes  # type: ignore[attr-defined]
                assert b"victim" not in chain
            await chan.close(None)
            await asyncio.sleep(0.2)
            assert server.secrets.held_nodes() == [] and server.secrets.held_identities() == []
            assert server.ads.streams == {}
            # Connecting again: b's certificate proves nothing about victim, refused.
            chan = channel(b_cert)
            async with AdsClient(address, B_AT_VICTIM, channel=chan) as again:
                with pytest.raises(ConnectionError, match="PERMISSION_DENIED"):
                    await again.wait_for(lambda c: c.complete(), timeout=10)
            await chan.close(None)
            assert "victim-sa" not in " ".join(server.secrets.held_identities())

    with caplog.at_level(logging.INFO):
        run(test)
    ended = [r.getMessage() for r in caplog.records if "ended the stream of proxy" in r.getMessage()]
    assert len(ended) == 1 and B_AT_VICTIM in ended[0] and "shop/victim" in ended[0], ended
    assert not any("victim-sa" in r.getMessage() and "issued" in r.getMessage() for r in caplog.records)


def test_a_node_proved_by_its_registry_endpoint_is_ended_when_the_endpoints_at_its_ip_change() -> None:
    """Bound by IP to payments' inline endpoint: another account at that IP, or a WorkloadEntry
    taking it, is not what the certificate proved."""
    node = attested("sidecar~10.0.0.31~payments-vm.shop~shop.svc.cluster.local", "URI:spiffe://td/ns/shop/sa/payments")
    ledger = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ledger, namespace: shop}
spec:
  hosts: [ledger.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.31}]
"""
    with pytest.raises(BindingError, match="payments-vm"):
        bind_proxy(node, snapshot_from_yaml(MESH + ledger))  # a second endpoint, running as default
    entry = "---\n" + B_ENTRY.replace("name: b,", "name: squatter,").replace("10.0.0.33", "10.0.0.31")
    with pytest.raises(BindingError, match="now binds to workload shop/squatter"):
        bind_proxy(node, snapshot_from_yaml(MESH + entry))
    # Another endpoint of the same account at the IP is the same identity: still served.
    same = ledger.replace("{address: 10.0.0.31}", "{address: 10.0.0.31, serviceAccount: payments}")
    assert bind_proxy(node, snapshot_from_yaml(MESH + same)).service_account == "payments"
