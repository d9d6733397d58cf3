"""MC0002 and MC0003: on a VM without iptables, traffic to an endpoint port no Sidecar ingress
listener takes reaches the app itself, so a STRICT PeerAuthentication is not enforced there and
auto mTLS opens mutual TLS to an app that cannot take it. Each warns on the broken mesh, names the
policy or workload and the ports, and stays quiet once the port goes through the proxy."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import INGRESS_ON_SERVICE_PORT, runner

from meshctl.cli.app import app
from meshctl.config.analysis_mtls import STRICT, PeerAuthentications, Sidecars, workload_labels
from meshctl.config.check import check
from meshctl.config.findings import Finding, Severity
from meshctl.security.peer_authentication import MtlsMode, workload_mtls
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for, snapshot_from_yaml


def service(ports: str = "[{number: 9080, name: http, protocol: HTTP}]", location: str = "MESH_INTERNAL") -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews.shop.mesh]
  location: {location}
  resolution: STATIC
  ports: {ports}
  workloadSelector: {{labels: {{app: reviews}}}}
"""


def workload(name: str = "reviews-v1", ports: str = "", labels: str = "app: reviews", annotations: str = "") -> str:
    text = f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: shop{annotations}}}
spec:
  address: 10.0.0.41
  labels: {{{labels}}}
"""
    return text + (f"  ports: {ports}\n" if ports else "")


LABELLED = "app: reviews, security.istio.io/tlsMode: istio"


def sidecar(ingress_port: int = 15080, selector: str = "app: reviews", namespace: str = "shop", extra: str = "") -> str:
    select = f"  workloadSelector: {{labels: {{{selector}}}}}\n" if selector else ""
    return f"""apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: reviews, namespace: {namespace}}}
spec:
{select}  ingress:
  - port: {{number: {ingress_port}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:9080{extra}
"""


def peer(
    mode: str = "STRICT",
    name: str = "default",
    namespace: str = "shop",
    selector: str = "",
    port_level: str = "",
) -> str:
    text = f"""apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: {name}, namespace: {namespace}}}
spec:
"""
    if selector:
        text += f"  selector: {{matchLabels: {{{selector}}}}}\n"
    if mode:
        text += f"  mtls:\n    mode: {mode}\n"
    if port_level:
        text += f"  portLevelMtls:\n    {port_level}\n"
    return text


#: The fix: the WorkloadEntry's port points at the Sidecar's ingress listener.
THROUGH_PROXY = (workload(ports="{http: 15080}"), sidecar())


def run(*docs: str, tmp_path: Path) -> list[Finding]:
    """The findings for `docs`, which must load: a quiet case is quiet because of what it says."""
    (tmp_path / "mesh.yaml").write_text("---\n".join(docs))
    findings = check([str(tmp_path)])
    assert not [f for f in findings if f.severity is Severity.ERROR], "\n".join(map(str, findings))
    return findings


def found(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def line_of(tmp_path: Path, text: str, after: str = "") -> int:
    """The 1-based line of mesh.yaml holding `text`, the first one after a line holding `after`."""
    lines = (tmp_path / "mesh.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


# -- MC0002: STRICT not enforced -----------------------------------------------------------------


def test_mc0002_namespace_strict_on_a_port_that_bypasses_the_proxy(tmp_path: Path) -> None:
    (warning,) = found(run(service(), workload(), peer(), tmp_path=tmp_path), "MC0002")
    assert warning.severity is Severity.WARNING
    assert warning.resource is not None and str(warning.resource.kind) == "PeerAuthentication"
    assert warning.field == "spec.mtls.mode"
    assert warning.line == line_of(tmp_path, "mode: STRICT")
    assert warning.message == (
        "PeerAuthentication shop/default requires mutual TLS for WorkloadEntry shop/reviews-v1, but its port 9080 "
        "reaches the app directly on a VM without iptables: STRICT is not enforced there; add a Sidecar ingress "
        "listener for the port (and point the WorkloadEntry's port at it), or run the proxy with "
        "INTERCEPTION_MODE REDIRECT"
    )


def test_mc0002_mesh_wide_and_workload_strict(tmp_path: Path) -> None:
    (mesh,) = found(run(service(), workload(), peer(namespace="istio-system"), tmp_path=tmp_path), "MC0002")
    assert "PeerAuthentication istio-system/default requires mutual TLS for WorkloadEntry shop/reviews-v1" in (
        mesh.message
    )
    selected = peer(name="reviews", selector="app: reviews")
    (own,) = found(run(service(), workload(), selected, tmp_path=tmp_path), "MC0002")
    assert own.message.startswith("PeerAuthentication shop/reviews requires mutual TLS for WorkloadEntry shop/reviews")


def test_mc0002_one_finding_per_policy_and_workload_listing_the_ports(tmp_path: Path) -> None:
    ports = "[{number: 9080, name: http, protocol: HTTP}, {number: 9090, name: tcp-metrics, protocol: TCP}]"
    docs = (service(ports), workload(), workload("reviews-v2"), peer())
    warnings = found(run(*docs, tmp_path=tmp_path), "MC0002")
    assert [w.message.split(",")[0] for w in warnings] == [
        "PeerAuthentication shop/default requires mutual TLS for WorkloadEntry shop/reviews-v1",
        "PeerAuthentication shop/default requires mutual TLS for WorkloadEntry shop/reviews-v2",
    ]
    assert "but its ports 9080, 9090 reach the app directly" in warnings[0].message
    assert "a Sidecar ingress listener for each port" in warnings[0].message


def test_mc0002_port_level_strict_names_its_field(tmp_path: Path) -> None:
    policy = peer("PERMISSIVE", "reviews", selector="app: reviews", port_level="9080: {mode: STRICT}")
    (warning,) = found(run(service(), workload(), policy, tmp_path=tmp_path), "MC0002")
    assert warning.field == "spec.portLevelMtls.9080.mode"
    assert warning.line == line_of(tmp_path, "9080: {mode: STRICT}")
    assert "port 9080 reaches the app directly" in warning.message
    # STRICT on a port clients do not reach the workload on: nothing bypasses it.
    elsewhere = peer("PERMISSIVE", "reviews", selector="app: reviews", port_level="9090: {mode: STRICT}")
    assert found(run(service(), workload(), elsewhere, tmp_path=tmp_path), "MC0002") == []


def test_mc0002_names_only_the_ports_no_ingress_listener_takes(tmp_path: Path) -> None:
    ports = "[{number: 9080, name: http, protocol: HTTP}, {number: 9090, name: tcp-metrics, protocol: TCP}]"
    docs = (service(ports), workload(ports="{http: 15080}"), sidecar(), peer())
    (warning,) = found(run(*docs, tmp_path=tmp_path), "MC0002")
    assert "but its port 9090 reaches the app directly" in warning.message


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param((peer(), *THROUGH_PROXY), id="covered-by-a-sidecar-ingress"),
        pytest.param(
            (peer(), workload(ports="{http: 15080}"), sidecar(namespace="istio-system", selector="")),
            id="covered-by-the-root-default-sidecar",
        ),
        pytest.param((peer("PERMISSIVE"), workload()), id="permissive"),
        pytest.param((peer("DISABLE"), workload()), id="disable"),
        pytest.param((peer(), peer("DISABLE", "reviews", selector="app: reviews"), workload()), id="workload-disable"),
        pytest.param(
            (peer(), peer("", "reviews", selector="app: reviews", port_level="9080: {mode: PERMISSIVE}"), workload()),
            id="port-level-permissive",
        ),
        pytest.param((peer(namespace="other"), workload()), id="another-namespace"),
        pytest.param((peer(selector="app: ratings"), workload()), id="selects-another-workload"),
        pytest.param(
            (peer(), workload(annotations=", annotations: {istio.io/autoRegistrationGroup: reviews}")),
            id="workload-group-entry",
        ),
    ],
)
def test_mc0002_quiet_when_strict_is_enforced_or_absent(docs: tuple[str, ...], tmp_path: Path) -> None:
    assert found(run(service(), *docs, tmp_path=tmp_path), "MC0002") == []


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(sidecar(selector="app: ratings"), id="sidecar-of-another-workload"),
        pytest.param(sidecar(extra="\n    captureMode: IPTABLES"), id="iptables-capture-binds-nothing"),
        pytest.param(sidecar(ingress_port=15081), id="ingress-on-another-port"),
    ],
)
def test_mc0002_a_sidecar_that_does_not_take_the_port(other: str, tmp_path: Path) -> None:
    docs = (service(), workload(ports="{http: 15080}"), other, peer())
    (warning,) = found(run(*docs, tmp_path=tmp_path), "MC0002")
    assert "port 15080 reaches the app directly" in warning.message


# -- MC0003: auto mTLS to the app ----------------------------------------------------------------


def test_mc0003_labelled_workload_without_ingress(tmp_path: Path) -> None:
    (warning,) = found(run(service(), workload(labels=LABELLED), tmp_path=tmp_path), "MC0003")
    assert warning.severity is Severity.WARNING
    assert warning.resource is not None and warning.resource.name == "reviews-v1"
    assert warning.field == "spec.labels.security.istio.io/tlsMode"
    assert warning.line == line_of(tmp_path, "labels:", after="kind: WorkloadEntry")
    assert warning.message == (
        "WorkloadEntry shop/reviews-v1 is labelled security.istio.io/tlsMode: istio, so clients open mutual TLS to "
        "it, but its port 9080 reaches the app directly on a VM without iptables, which does not take mutual TLS; "
        "add a Sidecar ingress listener for the port (and point the WorkloadEntry's port at it), remove the label, "
        "or run the proxy with INTERCEPTION_MODE REDIRECT"
    )


def test_mc0003_points_at_a_metadata_label(tmp_path: Path) -> None:
    entry = workload(annotations=", labels: {security.istio.io/tlsMode: istio}")
    (warning,) = found(run(service(), entry, tmp_path=tmp_path), "MC0003")
    assert warning.field == "metadata.labels.security.istio.io/tlsMode"


def test_mc0003_partly_proxied_workload_keeps_its_label(tmp_path: Path) -> None:
    ports = "[{number: 9080, name: http, protocol: HTTP}, {number: 9090, name: tcp-metrics, protocol: TCP}]"
    docs = (service(ports), workload(ports="{http: 15080}", labels=LABELLED), sidecar())
    (warning,) = found(run(*docs, tmp_path=tmp_path), "MC0003")
    assert "but its port 9090 reaches the app directly" in warning.message
    assert "remove the label" not in warning.message


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param((service(), workload(ports="{http: 15080}", labels=LABELLED), sidecar()), id="covered"),
        pytest.param((service(), workload()), id="no-label"),
        pytest.param((service(location="MESH_EXTERNAL"), workload(labels=LABELLED)), id="mesh-external"),
        pytest.param((service(), workload(labels=LABELLED), peer("DISABLE")), id="namespace-disable"),
        pytest.param((workload(labels=LABELLED),), id="no-service"),
    ],
)
def test_mc0003_quiet_when_clients_reach_the_proxy_or_use_plaintext(docs: tuple[str, ...], tmp_path: Path) -> None:
    assert found(run(*docs, tmp_path=tmp_path), "MC0003") == []


def test_the_fixed_mesh_has_no_findings(tmp_path: Path) -> None:
    docs = (service(), workload(ports="{http: 15080}", labels=LABELLED), sidecar(), peer())
    assert run(*docs, tmp_path=tmp_path) == []


# -- the rules are the server's ------------------------------------------------------------------

POLICIES = [
    pytest.param((), id="none"),
    pytest.param((peer(namespace="istio-system"),), id="mesh"),
    pytest.param((peer(namespace="istio-system"), peer("PERMISSIVE")), id="namespace-over-mesh"),
    pytest.param((peer("", namespace="istio-system"), peer("DISABLE")), id="unset-mesh"),
    pytest.param((peer(), peer("", "reviews", selector="app: reviews")), id="unset-workload-inherits"),
    pytest.param((peer(), peer("DISABLE", "reviews", selector="app: reviews")), id="workload-over-namespace"),
    pytest.param(
        (peer(), peer("", "reviews", selector="app: reviews", port_level="9080: {mode: DISABLE}")),
        id="port-level",
    ),
    pytest.param(
        (peer("DISABLE", "b", selector="app: reviews"), peer("STRICT", "a", selector="version: v1")),
        id="oldest-by-name",
    ),
]


@pytest.mark.parametrize("policies", POLICIES)
def test_modes_agree_with_the_server(policies: tuple[str, ...]) -> None:
    text = "---\n".join([service(), workload(labels="app: reviews, version: v1"), *policies])
    snapshot = snapshot_from_yaml(text)
    configs = configs_from_yaml(text)
    ours = PeerAuthentications([c for c in configs if c.kind == "PeerAuthentication"], "istio-system")
    labels = {"app": "reviews", "version": "v1"}
    server = workload_mtls(snapshot, "shop", labels)
    for port in (9080, 9090):
        assert (ours.modes("shop", labels).for_port(port).mode == STRICT) == (server.for_port(port) is MtlsMode.STRICT)


@pytest.mark.parametrize(
    "sidecars",
    [
        pytest.param((sidecar(),), id="selected"),
        pytest.param((sidecar(selector=""),), id="namespace-default"),
        pytest.param((sidecar(namespace="istio-system", selector=""),), id="root-default"),
        pytest.param((sidecar(selector="app: ratings"),), id="none"),
        pytest.param((sidecar(namespace="istio-system"),), id="root-selector-applies-to-root-only"),
    ],
)
def test_sidecar_selection_agrees_with_the_server(sidecars: tuple[str, ...]) -> None:
    text = "---\n".join([service(), workload(), *sidecars])
    snapshot = snapshot_from_yaml(text)
    configs = configs_from_yaml(text)
    entry = next(c for c in configs if c.kind == "WorkloadEntry")
    ours = Sidecars([c for c in configs if c.kind == "Sidecar"], "istio-system")
    proxy = proxy_for(snapshot, "sidecar~10.0.0.41~reviews-v1.shop~shop.svc.cluster.local")
    server = ProxyScope(snapshot, proxy).sidecar
    mine = ours.applying_to("shop", workload_labels(entry))
    assert (mine.key if mine else None) == (server.key if server else None)


# -- meshctl validate ----------------------------------------------------------------------------


def test_validate_warns_and_passes(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text("---\n".join([service(), workload(labels=LABELLED), peer()]))
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output  # warnings: the mesh works with iptables
    lines = result.stdout.splitlines()
    (strict,) = [line for line in lines if line.endswith("[MC0002]")]
    assert strict.startswith(f"warning {tmp_path / 'mesh.yaml'}:")
    assert "PeerAuthentication shop/default spec.mtls.mode:" in strict
    assert "WorkloadEntry shop/reviews-v1, but its port 9080" in strict
    (label,) = [line for line in lines if line.endswith("[MC0003]")]
    assert "WorkloadEntry shop/reviews-v1 " in label and "port 9080" in label
    assert runner.invoke(app, ["validate", "--strict", str(tmp_path)]).exit_code == 1


def test_a_port_a_sidecar_ingress_listener_takes_is_not_the_apps() -> None:
    """Istio's pattern for a VM without iptables: Envoy takes the service port on the VM's address
    and the app sits on 127.0.0.1:8080; the workload can still call 9080 through 127.0.0.1."""
    from meshctl.config.analysis import analyze
    from meshctl.testing.builders import configs_from_yaml

    codes = [i.code for i in analyze(configs_from_yaml(INGRESS_ON_SERVICE_PORT))]
    assert "MC0001" not in codes
    without_ingress = INGRESS_ON_SERVICE_PORT.replace(
        "  ingress:\n  - port: {number: 9080, protocol: HTTP, name: http}\n    defaultEndpoint: 127.0.0.1:8080\n",
        "  egress: [{hosts: ['./*']}]\n",
    )
    assert "MC0001" in [i.code for i in analyze(configs_from_yaml(without_ingress))]
    calls_nothing = without_ingress.replace("./*", "~/*")
    assert "MC0001" not in [i.code for i in analyze(configs_from_yaml(calls_nothing))]
