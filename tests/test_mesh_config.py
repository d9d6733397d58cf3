"""Istio's MeshConfig YAML (`--mesh-config`): read as istiod's ConfigMap holds it, applied to the
generated config, followed for changes by the server, and nothing in it silently ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import EXAMPLES, PRODUCTPAGE, examples_copy
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config.findings import Severity
from meshctl.config.mesh import MeshSettings, load_mesh_config
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

MESH = """outboundTrafficPolicy:
  mode: REGISTRY_ONLY
connectTimeout: 3s
rootNamespace: mesh-root
trustDomain: example.org
"""


def configmap(mesh: str) -> str:
    body = "\n".join("    " + line for line in mesh.splitlines())
    head = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\n"
    return f"{head}data:\n  mesh: |-\n{body}\n"


@pytest.mark.parametrize("form", ["configmap", "mesh-key", "document"])
def test_every_form_istio_users_keep_it_in(tmp_path: Path, form: str) -> None:
    text = {
        "configmap": configmap(MESH),
        "mesh-key": "mesh: |-\n" + "\n".join("  " + line for line in MESH.splitlines()) + "\n",
        "document": MESH,
    }[form]
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    settings, findings = load_mesh_config(path)
    assert findings == []
    assert settings == MeshSettings("mesh-root", "REGISTRY_ONLY", 3.0, "example.org")


def test_what_meshctl_does_not_apply_is_said_and_errors_keep_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("enableTracing: true\ndefaultConfig: {holdApplicationUntilProxyStarts: true}\nfoo: 1\n")
    settings, findings = load_mesh_config(path)
    assert settings == MeshSettings()  # Istio's defaults for what is left out
    said = {(f.severity, f.message.split(" ")[0]) for f in findings}
    assert said == {
        (Severity.WARNING, "enableTracing"),
        (Severity.INFO, "defaultConfig.holdApplicationUntilProxyStarts"),
        (Severity.WARNING, "foo"),
    }
    path.write_text("outboundTrafficPolicy: {mode: SOMETIMES}\nconnectTimeout: soon\n")
    settings, findings = load_mesh_config(path)
    assert settings is None and len([f for f in findings if f.severity is Severity.ERROR]) == 2
    path.write_text("enableAutoMtls: false\n")
    settings, findings = load_mesh_config(path)
    assert settings == MeshSettings(enable_auto_mtls=False) and not findings


def test_dump_applies_the_mesh_config(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(configmap(MESH))
    args = ["dump", "--config-dir", str(EXAMPLES), "--proxy", PRODUCTPAGE, "-o", "json", "--type", "clusters"]
    plain = CliRunner().invoke(app, args)
    meshed = CliRunner().invoke(app, [*args, "--mesh-config", str(tmp_path / "mesh.yaml")])
    assert plain.exit_code == meshed.exit_code == 0, meshed.output
    assert '"connect_timeout": "10s"' in plain.stdout and '"connect_timeout": "3s"' in meshed.stdout


@pytest.mark.slow
def test_the_server_follows_the_file_and_keeps_the_last_good_settings(tmp_path: Path) -> None:
    mesh_dir = examples_copy(tmp_path)
    mesh_file = tmp_path / "meshconfig.yaml"
    mesh_file.write_text("connectTimeout: 3s\n")

    def timeout(client: AdsClient) -> float:
        """details has no DestinationRule: its cluster takes the mesh's connect timeout."""
        cluster = client.resources[types.CLUSTER].get("outbound|9080||details.bookinfo.mesh")
        return cluster.connect_timeout.ToTimedelta().total_seconds() if cluster is not None else 0.0

    async def test() -> None:
        async with serving(mesh_dir, mesh_config=mesh_file) as server, AdsClient(
            f"127.0.0.1:{server.xds_port}", PRODUCTPAGE
        ) as client:
            await client.wait_for(lambda c: c.complete() and timeout(c) == 3.0)
            mesh_file.write_text("connectTimeout: 5s\n")
            await client.wait_for(lambda c: timeout(c) == 5.0, timeout=15)
            mesh_file.write_text("connectTimeout: [broken\n")
            await asyncio.sleep(2.5)
            assert timeout(client) == 5.0
            assert server.discovery.snapshot is not None
            assert server.discovery.snapshot.mesh.connect_timeout_seconds == 5.0

    run(test)


def test_the_mesh_export_defaults_hide_what_says_nothing() -> None:
    """MeshConfig's defaultServiceExportTo / defaultVirtualServiceExportTo /
    defaultDestinationRuleExportTo apply to resources without exportTo (Istio's
    PushContext.initDefaultExportMaps); an explicit exportTo still wins."""
    from meshctl.config.mesh import mesh_settings
    from meshctl.snapshot.scope import ProxyScope
    from meshctl.testing.builders import proxy_for, snapshot_from_yaml

    text = (EXAMPLES / "bookinfo" / "services.yaml").read_text() + "\n---\n" + (
        EXAMPLES / "bookinfo" / "traffic.yaml"
    ).read_text()
    other = "sidecar~10.9.9.9~client.elsewhere~elsewhere.svc.cluster.local"
    keys = ("defaultServiceExportTo", "defaultVirtualServiceExportTo", "defaultDestinationRuleExportTo")
    private, _ = mesh_settings({key: ["."] for key in keys})
    assert private is not None
    public_scope = ProxyScope(snapshot := snapshot_from_yaml(text), proxy_for(snapshot, other))
    private_scope = ProxyScope(hidden := snapshot_from_yaml(text, mesh=private), proxy_for(hidden, other))
    assert "reviews.bookinfo.mesh" in public_scope.service_hosts
    assert "reviews.bookinfo.mesh" not in private_scope.service_hosts
    assert public_scope.virtual_services() and not private_scope.virtual_services()
    own = ProxyScope(hidden, proxy_for(hidden, "sidecar~10.9.9.8~client.bookinfo~bookinfo.svc.cluster.local"))
    assert "reviews.bookinfo.mesh" in own.service_hosts and own.virtual_services()
