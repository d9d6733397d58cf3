"""EnvoyFilter `targetRefs`, as meshctl resolves them (a Gateway's proxies, a Service's or
ServiceEntry's endpoints), what validation refuses of them, and the per-proxy "matched nothing"
warning: in `meshctl dump`'s notes and once per filter and kind of proxy in the server's log.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from test_wasm_plugins import WORKLOADS

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.serve_process import meshctl_command
from meshctl.xds.envoyfilter_report import UnmatchedFilters
from meshctl.xds.generate import unpatched_config

WEB = "sidecar~10.0.0.99~web-1.shop~shop.svc.cluster.local"
DB = "sidecar~10.0.0.96~db-1.shop~shop.svc.cluster.local"
GATEWAY = "router~10.0.0.97~edge.shop~shop.svc.cluster.local"
OTHER = "sidecar~10.0.0.98~client.other~other.svc.cluster.local"

#: A patch that matches every proxy (every cluster: each has at least BlackHoleCluster).
EVERYWHERE = """  - applyTo: CLUSTER
    patch: {operation: MERGE, value: {connect_timeout: 3s}}
"""
#: A patch that matches nothing any proxy has.
NOWHERE = """  - applyTo: CLUSTER
    match: {cluster: {name: no-such-cluster}}
    patch: {operation: MERGE, value: {connect_timeout: 7s}}
"""


def envoy_filter(name: str, patches: str, extra: str = "", namespace: str = "shop") -> str:
    return f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: {name}, namespace: {namespace}}}
spec:
{extra}  configPatches:
{patches}"""


@pytest.mark.parametrize(
    ("refs", "selected"),
    [
        ("[{kind: Gateway, group: gateway.networking.k8s.io, name: edge}]", {"gateway"}),
        ("[{kind: ServiceEntry, group: networking.istio.io, name: web}]", {"web"}),
        ("[{kind: Service, name: web}]", {"web"}),
        ("[{kind: Gateway, group: gateway.networking.k8s.io, name: nothing}]", set()),
    ],
)
def test_target_refs_select_the_proxies_they_name(refs: str, selected: set[str]) -> None:
    snapshot = snapshot_from_yaml(WORKLOADS + envoy_filter("f", EVERYWHERE, f"  targetRefs: {refs}\n"))
    nodes = {"web": WEB, "db": DB, "gateway": GATEWAY, "other": OTHER}
    metadata = {"gateway": {"LABELS": {"istio": "edge"}}}
    found = {name for name, node in nodes.items() if proxy_for(snapshot, node, metadata.get(name)).envoy_filters}
    assert found == selected


@pytest.mark.parametrize(
    ("refs", "field", "message"),
    [
        ("[{kind: GatewayClass, group: gateway.networking.k8s.io, name: x}]", "spec.targetRefs[0].kind", "Class"),
        ("[{kind: Deployment, group: apps, name: x}]", "spec.targetRefs[0].kind", "not apps/Deployment"),
        ("[{kind: Service, name: x, namespace: other}]", "spec.targetRefs[0].namespace", "must not be set"),
    ],
)
def test_target_refs_meshctl_cannot_resolve_are_errors(refs: str, field: str, message: str) -> None:
    findings = load_text(envoy_filter("f", EVERYWHERE, f"  targetRefs: {refs}\n"), "ef.yaml").findings
    errors = [(f.field, f.message) for f in findings if f.severity is Severity.ERROR]
    assert len(errors) == 1 and errors[0][0] == field and message in errors[0][1], errors


MESH = WORKLOADS + envoy_filter("everywhere", EVERYWHERE) + "---\n" + envoy_filter("nowhere", NOWHERE)


def test_dump_notes_an_envoy_filter_that_matched_nothing_in_the_proxys_config(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH)
    proc = subprocess.run(
        [*meshctl_command(), "dump", "--config-dir", str(tmp_path), "--proxy", WEB, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    notes = [line for line in proc.stderr.splitlines() if "matched anything" in line]
    assert len(notes) == 1, proc.stderr
    assert "mesh.yaml:" in notes[0] and "EnvoyFilter shop/nowhere selects sidecar proxy" in notes[0]


def test_a_server_says_it_once_per_filter_and_kind_of_proxy(caplog: pytest.LogCaptureFixture) -> None:
    snapshot = snapshot_from_yaml(MESH)
    unmatched = UnmatchedFilters()
    said = []
    for node, metadata in ((WEB, None), (DB, None), (GATEWAY, {"LABELS": {"istio": "edge"}}), (WEB, None)):
        proxy = proxy_for(snapshot, node, metadata)
        said.extend(unmatched.new_messages(unpatched_config(snapshot, proxy), proxy))
    assert len(said) == 2, said
    assert "selects sidecar proxy" in said[0] and "selects router proxy" in said[1]
    assert all("shop/nowhere" in m for m in said)


@pytest.mark.parametrize("mesh", [MESH, WORKLOADS + envoy_filter("nowhere", NOWHERE)], ids=["two", "one"])
def test_the_cache_logs_it_when_it_patches(caplog: pytest.LogCaptureFixture, mesh: str) -> None:
    from meshctl.server.cache import ResourceCache

    snapshot = snapshot_from_yaml(mesh)
    cache = ResourceCache()
    with caplog.at_level(logging.WARNING, "meshctl.server.cache"):
        cache.resources(snapshot, proxy_for(snapshot, WEB))
        cache.resources(snapshot, proxy_for(snapshot, DB))
    lines = [r.getMessage() for r in caplog.records if "matched anything" in r.getMessage()]
    assert len(lines) == 1 and "EnvoyFilter shop/nowhere" in lines[0]
