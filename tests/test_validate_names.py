"""`meshctl validate` MC0006: two services that claim one name or one address in a proxy's view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import NAME_CLASH as CLASH
from conftest import runner

from meshctl.check.names import proxy_views
from meshctl.cli.app import app
from meshctl.ingest import load_files
from meshctl.snapshot.model import build_snapshot

# The web VMs import only the shop namespace: the ops entry is not in their view.
SCOPED = """---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: web}
spec:
  egress:
  - hosts: [shop/*]
"""


def mc0006(tmp_path: Path, text: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    (tmp_path / "mesh.yaml").write_text(text)
    result = runner.invoke(app, ["validate", "-o", "json", *args, str(tmp_path / "mesh.yaml")])
    return result.exit_code, [f for f in json.loads(result.stdout) if f["code"] == "MC0006"]


def test_two_hosts_answering_one_short_name_are_warned_about_where_the_loser_is_written(tmp_path: Path) -> None:
    code, findings = mc0006(tmp_path, CLASH)
    assert code == 0
    (finding,) = findings
    assert {k: finding[k] for k in ("severity", "file", "line", "kind", "namespace", "name", "field")} == {
        "severity": "warning",
        "file": str(tmp_path / "mesh.yaml"),
        "line": 5,
        "kind": "ServiceEntry",
        "namespace": "shop",
        "name": "db",
        "field": "spec.hosts[0]",
    }
    message = finding["message"]
    assert "name db.shop is claimed by db.shop.svc.cluster.local" in message
    assert f"ServiceEntry ops/legacy-db ({tmp_path / 'mesh.yaml'}:11)" in message
    assert "namespace web (no Sidecar)" in message


def test_the_warning_fails_the_run_only_with_strict(tmp_path: Path) -> None:
    """The tree has no other finding: MC0006 alone decides the exit status."""
    assert mc0006(tmp_path, CLASH)[0] == 0
    code, findings = mc0006(tmp_path, CLASH, "--strict")
    assert code == 1 and [f["code"] for f in findings] == ["MC0006"]


BATCH = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: batch-vm, namespace: batch}
spec: {address: 10.2.0.42, labels: {app: batch}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: batch, namespace: batch}
spec:
  workloadSelector: {labels: {app: batch}}
  egress:
  - hosts: [shop/*, ops/*]
"""


def test_a_sidecar_that_scopes_one_host_away_ends_the_warning_for_its_view(tmp_path: Path) -> None:
    """web's Sidecar imports shop alone; batch's imports both: only batch's view is named."""
    code, (finding,) = mc0006(tmp_path, CLASH + SCOPED + BATCH)
    assert code == 0
    assert "for the sidecars of namespace batch (Sidecar batch/batch):" in finding["message"]
    assert "namespace web" not in finding["message"]
    code, findings = mc0006(tmp_path, CLASH + SCOPED, "--strict")
    assert (code, findings) == (0, [])


def test_two_tcp_services_on_one_address_and_port_are_warned_about(tmp_path: Path) -> None:
    """With the loopback range turned off, two databases on 5432 both answer 127.0.0.1."""
    tree = tmp_path / "mesh"
    tree.mkdir()
    (tmp_path / "meshconfig.yaml").write_text('loopbackRange: ""\n')
    text = CLASH.replace("db.shop]", "pg.ops.example]")
    code, (finding,) = mc0006(tree, text, "--mesh-config", str(tmp_path / "meshconfig.yaml"))
    assert code == 0
    assert (finding["namespace"], finding["name"], finding["field"]) == ("ops", "legacy-db", "spec.hosts[0]")
    assert "both resolve to 127.0.0.1 on TCP port 5432" in finding["message"]
    assert "db.shop.svc.cluster.local of ServiceEntry shop/db" in finding["message"]
    _, apart = mc0006(tree, text)
    assert apart == []


def test_a_namespace_of_many_vms_without_a_sidecar_is_one_view(tmp_path: Path) -> None:
    vms = "".join(
        f"""---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: vm.{i}, namespace: web}}
spec: {{address: 10.3.{i // 200}.{i % 200 + 1}, labels: {{app: app-{i % 7}}}, ports: {{http: {8000 + i}}}}}
"""
        for i in range(600)
    )
    (tmp_path / "mesh.yaml").write_text(CLASH + vms)
    loaded = load_files([tmp_path])
    snapshot = build_snapshot(loaded.configs, loaded.services())
    assert [v.namespace for v in proxy_views(snapshot)] == ["web"]
