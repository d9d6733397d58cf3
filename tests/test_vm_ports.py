"""A VM without iptables whose app listens on the port of a service it calls (bookinfo as Istio
writes it: every app on 9080) gets no outbound listener there. `validate` warns, `dump` explains,
in the same words; both name the workload, the port and the two fixes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import INGRESS_ON_SERVICE_PORT, ORDERS_VM, runner

from meshctl.cli.app import app


def service(name: str, target_port: int | None = None) -> str:
    target = f", targetPort: {target_port}" if target_port else ""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: bookinfo}}
spec:
  hosts: [{name}.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP{target}}}]
  workloadSelector: {{labels: {{app: {name}}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}-vm, namespace: bookinfo}}
spec: {{address: 10.0.0.{len(name)}, labels: {{app: {name}}}}}
---
"""


@pytest.fixture
def bookinfo_on_9080(tmp_path: Path) -> Path:
    (tmp_path / "mesh.yaml").write_text(service("productpage") + service("reviews"))
    return tmp_path


def test_validate_warns_naming_the_workload_the_port_and_the_fixes(bookinfo_on_9080: Path) -> None:
    result = runner.invoke(app, ["validate", str(bookinfo_on_9080)])
    assert result.exit_code == 0, result.output  # a warning: the mesh works with iptables
    lines = [line for line in result.stdout.splitlines() if "MC0001" in line]
    assert len(lines) == 2
    productpage = next(line for line in lines if "bookinfo/productpage-vm" in line)
    for words in ("127.0.0.1:9080", "reviews.bookinfo.mesh on port 9080", "targetPort", "egress listener"):
        assert words in productpage, productpage


def test_a_target_port_clears_the_warning(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(service("productpage", 8080) + service("reviews", 8080))
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0 and "MC0001" not in result.output


def test_dump_explains_the_missing_listener_and_redirect_mode_has_it(bookinfo_on_9080: Path) -> None:
    args = ["dump", "--config-dir", str(bookinfo_on_9080), "--proxy", "productpage-vm.bookinfo", "--type", "listeners"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert "binds no outbound listener on 127.0.0.1:9080" in plain.stderr
    assert "127.0.0.1     9080" not in plain.stdout
    redirected = runner.invoke(app, [*args, "--interception", "REDIRECT"])
    assert redirected.exit_code == 0, redirected.output
    assert "binds no outbound listener" not in redirected.stderr
    assert "Route: 9080" in redirected.stdout  # the outbound HTTP listener an iptables VM gets


def test_diff_takes_the_interception_mode(bookinfo_on_9080: Path) -> None:
    result = runner.invoke(
        app, ["diff", str(bookinfo_on_9080), str(bookinfo_on_9080), "--all-proxies", "--interception", "TPROXY"]
    )
    assert result.exit_code == 0, result.output


def test_a_port_envoy_takes_for_inbound_still_has_its_outbound_listener_on_loopback() -> None:
    """Istio's pattern without iptables: Envoy takes 9080 on the VM's address for inbound and
    hands it to the app on 127.0.0.1:8080, so the app can still call other services on
    127.0.0.1:9080 through the proxy."""
    from meshctl.testing.builders import proxy_for, snapshot_from_yaml
    from meshctl.xds import types
    from meshctl.xds.generate import generate

    snapshot = snapshot_from_yaml(INGRESS_ON_SERVICE_PORT + ORDERS_VM)
    node = "sidecar~10.10.0.52~inventory-v2.shop~shop.svc.cluster.local"
    names = {listener.name for listener in generate(snapshot, proxy_for(snapshot, node))[types.LISTENER]}
    assert {"10.10.0.52_9080", "127.0.0.1_9080"} <= names


def test_dump_says_which_inbound_ports_the_proxy_does_not_take_without_iptables(bookinfo_on_9080: Path) -> None:
    """Istio (iptables) applies a port's mutual TLS mode and the workload's policies on every
    service port; a VM proxy without iptables only on its Sidecar ingress ports: dump names the
    others, and says nothing under REDIRECT, where virtualInbound takes them."""
    args = ["dump", "--config-dir", str(bookinfo_on_9080), "--proxy", "reviews-vm.bookinfo", "--type", "listeners"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert "reviews-vm takes no inbound traffic on port(s) 9080" in plain.stderr.replace("bookinfo/", "")
    assert "no PeerAuthentication, AuthorizationPolicy or RequestAuthentication applies" in plain.stderr
    redirected = runner.invoke(app, [*args, "--interception", "REDIRECT"])
    assert redirected.exit_code == 0 and "takes no inbound traffic" not in redirected.stderr


GATEWAY_BEHIND_TARGET_PORT = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ingress, namespace: edge}
spec:
  hosts: [ingress.edge.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  workloadSelector: {labels: {istio: ingressgateway}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ingress-vm, namespace: edge}
spec: {address: 10.0.9.1, labels: {istio: ingressgateway}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]
"""


def test_dump_says_where_istio_would_bind_a_gateways_target_port(tmp_path: Path) -> None:
    """Istio's resolvePorts binds a gateway server on the targetPort of the gateway's own service;
    meshctl binds the server port as written, and dump says what that means for mesh clients."""
    (tmp_path / "mesh.yaml").write_text(GATEWAY_BEHIND_TARGET_PORT)
    node = "router~10.0.9.1~ingress-vm.edge~edge.svc.cluster.local"
    result = runner.invoke(app, ["dump", "--config-dir", str(tmp_path), "--proxy", node, "--type", "listeners"])
    assert result.exit_code == 0, result.output
    assert "Gateway edge/web server port 80 is bound as written; Istio binds 8080" in result.stderr
    assert "Route: http.80" in result.stdout
