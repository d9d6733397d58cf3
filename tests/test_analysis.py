"""Cross-resource analysis: each Istio code fires on the broken case and stays quiet on the fixed one."""

from __future__ import annotations

from meshctl.config.check import check
from meshctl.config.findings import Finding, Severity

HEAD = "apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: shop\nspec:\n"

SE = (
    HEAD.format(kind="ServiceEntry", name="reviews")
    + """  hosts: [reviews.shop.mesh]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector:
    labels: {app: reviews}
"""
)
WE = (
    HEAD.format(kind="WorkloadEntry", name="reviews-v1")
    + """  address: 10.0.0.1
  labels: {app: reviews, version: v1}
"""
)
DR = (
    HEAD.format(kind="DestinationRule", name="reviews")
    + """  host: reviews.shop.mesh
  subsets:
  - name: v1
    labels: {version: v1}
"""
)


def vs(
    name: str = "reviews",
    host: str = "reviews.shop.mesh",
    dest: str = "reviews.shop.mesh",
    subset: str = "",
    gateways: str = "",
) -> str:
    text = HEAD.format(kind="VirtualService", name=name) + f"  hosts: [{host}]\n"
    if gateways:
        text += f"  gateways: [{gateways}]\n"
    text += f"  http:\n  - route:\n    - destination:\n        host: {dest}\n"
    if subset:
        text += f"        subset: {subset}\n"
    return text


def gateway(name: str, host: str, port: int = 80, selector: str = "istio: ingressgateway") -> str:
    return (
        HEAD.format(kind="Gateway", name=name)
        + f"""  selector: {{{selector}}}
  servers:
  - port: {{number: {port}, name: http-{name}, protocol: HTTP}}
    hosts: ["{host}"]
"""
    )


GW_WE = HEAD.format(kind="WorkloadEntry", name="gw") + "  address: 10.0.0.9\n  labels: {istio: ingressgateway}\n"


def run(*docs: str, tmp_path: object) -> list[Finding]:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "mesh.yaml").write_text("---\n".join(docs))
    return check([str(root)])


def codes(findings: list[Finding]) -> list[tuple[str, str, Severity]]:
    return [(f.code, f.field, f.severity) for f in findings if f.code]


def test_a_consistent_mesh_has_no_findings(tmp_path: object) -> None:
    assert run(SE, WE, DR, vs(subset="v1"), tmp_path=tmp_path) == []


def test_ist0101_host_subset_and_gateway(tmp_path: object) -> None:
    found = codes(run(SE, WE, DR, vs(dest="nope.shop.mesh"), tmp_path=tmp_path))
    assert found == [("IST0101", "spec.http[0].route[0].destination.host", Severity.ERROR)]
    found = codes(run(SE, WE, DR, vs(subset="v9"), tmp_path=tmp_path))
    assert found == [("IST0101", "spec.http[0].route[0].destination.subset", Severity.ERROR)]
    found = codes(run(SE, WE, DR, vs(gateways="missing-gw"), tmp_path=tmp_path))
    assert ("IST0101", "spec.gateways[0]", Severity.ERROR) in found


def test_ist0101_short_host_resolves_in_the_namespace(tmp_path: object) -> None:
    assert codes(run(SE, WE, DR, vs(host="reviews", dest="reviews", subset="v1"), tmp_path=tmp_path)) == []


def test_ist0109_two_mesh_virtual_services_for_one_host(tmp_path: object) -> None:
    found = codes(run(SE, WE, DR, vs("a"), vs("b"), tmp_path=tmp_path))
    assert found == [("IST0109", "spec.hosts[0]", Severity.ERROR)] * 2
    # Bound to a gateway only, they do not conflict on the mesh.
    found = codes(run(SE, WE, GW_WE, gateway("gw", "*"), vs("a"), vs("b", gateways="gw"), tmp_path=tmp_path))
    assert found == []


def test_ist0127_selector_matches_no_workload(tmp_path: object) -> None:
    sidecar = HEAD.format(kind="Sidecar", name="s") + (
        "  workloadSelector:\n    labels: {app: ratings}\n  egress:\n  - hosts: ['./*']\n"
    )
    found = codes(run(SE, WE, sidecar, tmp_path=tmp_path))
    assert found == [("IST0127", "spec.workloadSelector", Severity.WARNING)]
    assert codes(run(SE, WE, sidecar.replace("ratings", "reviews"), tmp_path=tmp_path)) == []


def test_ist0127_an_envoy_filter_selecting_no_workload(tmp_path: object) -> None:
    ef = HEAD.format(kind="EnvoyFilter", name="f").replace(
        "networking.istio.io/v1\n", "networking.istio.io/v1alpha3\n"
    ) + (
        "  workloadSelector:\n    labels: {app: ratings}\n  configPatches:\n  - applyTo: CLUSTER\n"
        "    patch: {operation: MERGE, value: {connect_timeout: 2s}}\n"
    )
    assert codes(run(SE, WE, ef, tmp_path=tmp_path)) == [("IST0127", "spec.workloadSelector", Severity.WARNING)]
    assert codes(run(SE, WE, ef.replace("ratings", "reviews"), tmp_path=tmp_path)) == []


def test_ist0132_host_not_exposed_by_gateway(tmp_path: object) -> None:
    ext = vs("edge", host="shop.example.com", gateways="gw")
    found = codes(run(SE, WE, GW_WE, gateway("gw", "other.example.com"), ext, tmp_path=tmp_path))
    assert found == [("IST0132", "spec.hosts[0]", Severity.WARNING)]
    assert codes(run(SE, WE, GW_WE, gateway("gw", "*.example.com"), ext, tmp_path=tmp_path)) == []


def test_ist0145_conflicting_gateways(tmp_path: object) -> None:
    found = codes(run(GW_WE, gateway("a", "*.example.com"), gateway("b", "shop.example.com"), tmp_path=tmp_path))
    assert found == [("IST0145", "spec.servers[0]", Severity.ERROR)] * 2
    assert (
        codes(
            run(
                GW_WE,
                gateway("a", "*.example.com"),
                gateway("b", "shop.example.com", port=8080),
                tmp_path=tmp_path,
            )
        )
        == []
    )


def test_ist0173_subset_selects_no_endpoint(tmp_path: object) -> None:
    dr = DR.replace("version: v1}", "version: v2}")
    found = codes(run(SE, WE, dr, tmp_path=tmp_path))
    assert found == [("IST0173", "spec.subsets[0]", Severity.WARNING)]


def test_ist0174_destination_rule_host_unknown(tmp_path: object) -> None:
    found = codes(run(SE, WE, DR.replace("host: reviews.shop.mesh", "host: ghost.shop.mesh"), tmp_path=tmp_path))
    assert found == [("IST0174", "spec.host", Severity.WARNING)]
