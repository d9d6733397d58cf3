"""Which workloads are health-checked and how (Istio's probe fields and defaults), and that Envoy
accepts the health check meshctl makes of each kind of probe."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import needs_envoy

from meshctl.ingest import load_files
from meshctl.registry.health_checks import LOOPBACK, Probe, ProbeKind, WorkloadCheck, workload_checks
from meshctl.testing.envoy import to_dict, validate_config
from meshctl.xds.health_checks import cluster_health_check

SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [api.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, targetPort: 8080}, {number: 90, name: grpc-admin, targetPort: 9090}]
  workloadSelector: {labels: {app: api}}
"""


def entry(name: str, annotations: str = "", ip: str = "10.0.0.1") -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: shop
  annotations: {{{annotations}}}
spec:
  address: {ip}
  labels: {{app: api}}
"""


def group(name: str, probe: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {{name: {name}, namespace: shop}}
spec:
  metadata: {{labels: {{app: api}}}}
  template: {{ports: {{http: 8080}}}}
  probe: {probe}
"""


def checks_of(tmp_path: Path, *documents: str) -> dict[tuple[str, str], WorkloadCheck]:
    (tmp_path / "mesh.yaml").write_text("---\n".join(documents))
    loaded = load_files([tmp_path])
    assert not loaded.errors, loaded.errors
    return workload_checks(loaded.configs.values(), loaded.services())


def test_the_annotation_checks_every_target_port_with_istios_defaults(tmp_path: Path) -> None:
    checks = checks_of(
        tmp_path,
        SERVICE,
        entry("api-a", 'proxy.istio.io/health-checks-enabled: "true"'),
        entry("api-b", "", ip="10.0.0.2"),
    )
    assert checks == {
        ("shop", "api-a"): WorkloadCheck("shop", "api-a", Probe(ProbeKind.TCP, (8080, 9090))),
    }
    probe = checks[("shop", "api-a")].probe
    assert (probe.host, probe.period, probe.timeout, probe.success_threshold, probe.failure_threshold) == (
        LOOPBACK,
        10,
        1,
        1,
        3,
    )


def test_a_groups_probe_checks_its_entries(tmp_path: Path) -> None:
    checks = checks_of(
        tmp_path,
        SERVICE,
        group(
            "api",
            "{periodSeconds: 2, failureThreshold: 4, httpGet: {path: /ready, port: 8081, "
            "httpHeaders: [{name: x-probe, value: '1'}]}}",
        ),
        entry("api-a", "istio.io/autoRegistrationGroup: api"),
    )
    probe = checks[("shop", "api-a")].probe
    assert probe == Probe(
        ProbeKind.HTTP, (8081,), path="/ready", headers=(("x-probe", "1"),), period=2, failure_threshold=4
    )


PROBES = {
    "http": Probe(ProbeKind.HTTP, (8080,), path="/ready", headers=(("Host", "api"), ("x-probe", "1"))),
    "https": Probe(ProbeKind.HTTP, (8443,), scheme="HTTPS"),
    "tcp": Probe(ProbeKind.TCP, (8080, 9090), period=1, failure_threshold=2),
    "grpc": Probe(ProbeKind.GRPC, (9090,), service="api.Health"),
}


@needs_envoy
@pytest.mark.parametrize("kind", sorted(PROBES))
def test_envoy_accepts_the_health_check_of_each_kind_of_probe(kind: str) -> None:
    """Envoy checks an HDS cluster's health checks as it checks a cluster's: one static cluster
    with the same endpoints, health check and transport socket matches must load."""
    hds = cluster_health_check(WorkloadCheck("shop", "api-a", PROBES[kind]))
    cluster = {
        "name": hds.cluster_name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "health_checks": [to_dict(hc) for hc in hds.health_checks],
        "load_assignment": {
            "cluster_name": hds.cluster_name,
            "endpoints": [{"lb_endpoints": [{"endpoint": to_dict(e)} for e in hds.locality_endpoints[0].endpoints]}],
        },
    }
    if hds.transport_socket_matches:
        cluster["transport_socket_matches"] = [to_dict(m) for m in hds.transport_socket_matches]
    if kind == "grpc":
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    validate_config({"static_resources": {"clusters": [cluster]}})
