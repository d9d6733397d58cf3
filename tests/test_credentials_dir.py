"""The credentials directory as the server reads it, and the TLS contexts that name its secrets."""

from __future__ import annotations

import os
from pathlib import Path

from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2
from google.protobuf import any_pb2

from meshctl.security.ca import CertificateAuthority
from meshctl.server.credentials import CredentialDirectory
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate


def put(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def secret(directory: CredentialDirectory, namespace: str, name: str) -> secret_pb2.Secret:
    packed = any_pb2.Any.FromString(directory.secrets(namespace)[name].body)
    out = secret_pb2.Secret()
    assert packed.Unpack(out)
    return out


def chain(directory: CredentialDirectory, namespace: str, name: str) -> bytes:
    return secret(directory, namespace, name).tls_certificate.certificate_chain.inline_bytes


def bundle(directory: CredentialDirectory, namespace: str, name: str) -> bytes:
    return secret(directory, namespace, name).validation_context.trusted_ca.inline_bytes


def test_secrets_take_istio_names_and_a_cacert_secret_wins_over_ca_crt(tmp_path: Path) -> None:
    ca = CertificateAuthority.self_signed(tmp_path / "ca")
    other = CertificateAuthority.self_signed(tmp_path / "other")
    a, b = ca.issue_server(dns_names=["a.mesh"]), ca.issue_server(dns_names=["b.mesh"])
    root = tmp_path / "dir"
    put(root / "edge" / "tls-form" / "tls.crt", a.cert_chain_pem)
    put(root / "edge" / "tls-form" / "tls.key", a.private_key_pem)
    put(root / "edge" / "tls-form" / "ca.crt", ca.root_pem)
    put(root / "edge" / "tls-form-cacert" / "ca.crt", other.root_pem)
    put(root / "edge" / "generic" / "cert", b.cert_chain_pem)
    put(root / "edge" / "generic" / "key", b.private_key_pem)
    put(root / "edge" / "generic" / "cacert", ca.root_pem)
    directory = CredentialDirectory(root)
    assert directory.names() == {
        "edge": [
            "kubernetes-gateway://edge/generic",
            "kubernetes-gateway://edge/generic-cacert",
            "kubernetes-gateway://edge/tls-form",
            "kubernetes-gateway://edge/tls-form-cacert",
            "kubernetes://generic",
            "kubernetes://generic-cacert",
            "kubernetes://tls-form",
            "kubernetes://tls-form-cacert",
        ]
    }
    # The names a Gateway API listener's certificateRefs take carry the same secrets.
    assert chain(directory, "edge", "kubernetes-gateway://edge/tls-form") == a.cert_chain_pem
    assert bundle(directory, "edge", "kubernetes-gateway://edge/tls-form-cacert") == other.root_pem
    assert chain(directory, "edge", "kubernetes://tls-form") == a.cert_chain_pem
    assert chain(directory, "edge", "kubernetes://generic") == b.cert_chain_pem
    assert bundle(directory, "edge", "kubernetes://generic-cacert") == ca.root_pem
    assert bundle(directory, "edge", "kubernetes://tls-form-cacert") == other.root_pem
    assert directory.secrets("elsewhere") == {}


def test_a_rotation_half_way_keeps_the_last_good_pair_and_names_the_file(tmp_path: Path) -> None:
    ca = CertificateAuthority.self_signed(tmp_path / "ca")
    old, new = ca.issue_server(dns_names=["a.mesh"]), ca.issue_server(dns_names=["a.mesh"])
    held = tmp_path / "dir" / "edge" / "cert"
    put(held / "tls.crt", old.cert_chain_pem)
    put(held / "tls.key", old.private_key_pem)
    directory = CredentialDirectory(tmp_path / "dir")
    before = directory.secrets("edge")
    assert directory.check() == set()
    assert directory.secrets("edge") is before  # nothing changed: the very same set
    put(held / "tls.crt", new.cert_chain_pem)  # the key is not replaced yet
    assert directory.check() == {"edge"}
    assert chain(directory, "edge", "kubernetes://cert") == old.cert_chain_pem
    put(held / "tls.key", new.private_key_pem)
    assert directory.check() == {"edge"}
    assert chain(directory, "edge", "kubernetes://cert") == new.cert_chain_pem
    (held / "tls.key").unlink()
    directory.check()
    assert chain(directory, "edge", "kubernetes://cert") == new.cert_chain_pem


GATEWAY = """apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: MUTUAL, credentialName: edge-cert, subjectAltNames: [client.mesh]}
"""
ROUTER = "router~10.0.0.5~ingress.edge~edge.svc.cluster.local"


def _contexts(listeners: list[object]) -> list[tls_pb2.DownstreamTlsContext]:
    out = []
    for listener in listeners:
        for filter_chain in listener.filter_chains:  # type: ignore[attr-defined]
            typed = filter_chain.transport_socket.typed_config
            if typed.type_url.endswith("DownstreamTlsContext"):
                context = tls_pb2.DownstreamTlsContext()
                typed.Unpack(context)
                out.append(context)
    return out


def test_a_mutual_credential_server_takes_certificate_and_bundle_over_sds() -> None:
    snapshot = snapshot_from_yaml(GATEWAY, namespace="edge")
    proxy = proxy_for(snapshot, ROUTER, {"LABELS": {"istio": "ingressgateway"}})
    [context] = _contexts(generate(snapshot, proxy)[types.LISTENER])  # type: ignore[arg-type]
    common = context.common_tls_context
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == ["kubernetes://edge-cert"]
    combined = common.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "kubernetes://edge-cert-cacert"
    assert [m.matcher.exact for m in combined.default_validation_context.match_typed_subject_alt_names] == [
        "client.mesh"
    ]
    assert context.require_client_certificate.value


def test_a_proxy_not_sent_credentials_has_no_server_that_names_one() -> None:
    from dataclasses import replace

    from meshctl.snapshot.binding import bind_proxy
    from meshctl.snapshot.node import parse_node_id

    snapshot = snapshot_from_yaml(GATEWAY, namespace="edge")
    node = replace(parse_node_id(ROUTER, {"LABELS": {"istio": "ingressgateway"}}), credentials=False)
    listeners = generate(snapshot, bind_proxy(node, snapshot))[types.LISTENER]
    assert _contexts(listeners) == []  # type: ignore[arg-type]


EGRESS = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: edge}
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 443, name: https, protocol: HTTPS}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: edge}
spec:
  host: api.example.com
  trafficPolicy:
    tls: {mode: MUTUAL, credentialName: api-client, sni: api.example.com, subjectAltNames: [api.example.com]}
"""


def _upstream(clusters: list[object], name: str) -> tls_pb2.UpstreamTlsContext | None:
    [cluster] = [c for c in clusters if c.name == name]  # type: ignore[attr-defined]
    if not cluster.HasField("transport_socket"):  # type: ignore[attr-defined]
        return None
    context = tls_pb2.UpstreamTlsContext()
    cluster.transport_socket.typed_config.Unpack(context)  # type: ignore[attr-defined]
    return context


def test_a_gateway_originates_mutual_tls_with_a_rule_credential_and_a_sidecar_does_not() -> None:
    snapshot = snapshot_from_yaml(EGRESS, namespace="edge")
    cluster = "outbound|443||api.example.com"
    router = proxy_for(snapshot, ROUTER, {"LABELS": {"istio": "egressgateway"}})
    context = _upstream(list(generate(snapshot, router)[types.CLUSTER]), cluster)
    assert context is not None
    common = context.common_tls_context
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == ["kubernetes://api-client"]
    combined = common.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "kubernetes://api-client-cacert"
    assert [m.matcher.exact for m in combined.default_validation_context.match_typed_subject_alt_names] == [
        "api.example.com"
    ]
    assert context.sni == "api.example.com"
    # Istio uses a rule's credential on gateways only: a sidecar, with no files, stays plaintext.
    sidecar = proxy_for(snapshot, "sidecar~10.0.0.6~app.edge~edge.svc.cluster.local")
    assert _upstream(list(generate(snapshot, sidecar)[types.CLUSTER]), cluster) is None


VALIDATED = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ingress, namespace: edge}
spec: {address: 10.0.0.5, labels: {istio: ingressgateway}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: SIMPLE, credentialName: CERT}
  - port: {number: 8443, name: mtls, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: MUTUAL, credentialName: good}
"""


def test_validate_checks_named_secrets_only_when_given_the_directory(tmp_path: Path) -> None:
    import json

    from conftest import runner

    from meshctl.cli.app import app

    ca = CertificateAuthority.self_signed(tmp_path / "ca")
    a, b = ca.issue_server(dns_names=["a.mesh"]), ca.issue_server(dns_names=["b.mesh"])
    creds = tmp_path / "creds"
    put(creds / "edge" / "good" / "tls.crt", a.cert_chain_pem)
    put(creds / "edge" / "good" / "tls.key", a.private_key_pem)
    put(creds / "edge" / "good-cacert" / "ca.crt", ca.root_pem)
    put(creds / "edge" / "mismatched" / "tls.crt", a.cert_chain_pem)
    put(creds / "edge" / "mismatched" / "tls.key", b.private_key_pem)
    tree = tmp_path / "tree"
    tree.mkdir()

    def validate(cert: str, *extra: str) -> tuple[int, list[dict[str, object]]]:
        (tree / "gw.yaml").write_text(VALIDATED.replace("CERT", cert))
        result = runner.invoke(app, ["validate", "-o", "json", str(tree), *extra])
        return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else []

    # Without the directory the secrets live on the server: nothing to say.
    assert validate("missing") == (0, [])
    assert validate("good", "--credentials-dir", str(creds)) == (0, [])
    code, findings = validate("mismatched", "--credentials-dir", str(creds))
    assert code == 1
    [finding] = findings
    assert finding["code"] == "IST0161" and finding["field"] == "spec.servers[0].tls.credentialName"
    assert f"{creds}/edge/mismatched/tls.key: does not match the certificate" in str(finding["message"])
    assert str(finding["file"]).endswith("gw.yaml") and finding["line"] == 14
    code, findings = validate("missing", "--credentials-dir", str(creds))
    assert code == 1 and "edge/missing: no such secret directory" in str(findings[0]["message"])
    # A name is one path component: config cannot point validate at files outside the directory.
    code, findings = validate("../../ca", "--credentials-dir", str(creds))
    assert code == 1 and "not a secret name" in str(findings[0]["message"])
    # MUTUAL needs a bundle: without good-cacert (nor good/ca.crt), the second server is reported.
    (creds / "edge" / "good-cacert" / "ca.crt").unlink()
    code, findings = validate("good", "--credentials-dir", str(creds))
    assert code == 1 and [f["field"] for f in findings] == ["spec.servers[1].tls.credentialName"]
    assert "no trust bundle" in str(findings[0]["message"])


def test_a_credentials_directory_gone_keeps_the_secrets_last_read(tmp_path: Path) -> None:
    ca = CertificateAuthority.self_signed(tmp_path / "ca")
    issued = ca.issue_server(dns_names=["a.mesh"])
    root = tmp_path / "dir"
    put(root / "edge" / "cert" / "tls.crt", issued.cert_chain_pem)
    put(root / "edge" / "cert" / "tls.key", issued.private_key_pem)
    directory = CredentialDirectory(root)
    root.rename(tmp_path / "elsewhere")  # a volume unmounted
    assert directory.check() == set()
    assert chain(directory, "edge", "kubernetes://cert") == issued.cert_chain_pem
