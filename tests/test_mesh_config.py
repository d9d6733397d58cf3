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
from meshctl.config.mesh import MeshSettings, load_mesh_config, mesh_settings
from meshctl.config.validation.access_log_format import access_log_format_problem
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types
from meshctl.xds.access_log import TEXT_FORMAT

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
        async with (
            serving(mesh_dir, mesh_config=mesh_file) as server,
            AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as client,
        ):
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

    text = (
        (EXAMPLES / "bookinfo" / "services.yaml").read_text()
        + "\n---\n"
        + (EXAMPLES / "bookinfo" / "traffic.yaml").read_text()
    )
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


# -- values every Envoy would refuse -------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ("trustDomain: Cluster.Local", "trustDomain", 'trustDomain "Cluster.Local" is invalid: "Cluster" is not a'),
        ("trustDomain: corp_net", "trustDomain", '"corp_net" is not a lowercase DNS label'),
        ("trustDomain: a..b", "trustDomain", '"" is not a lowercase DNS label'),
        ("accessLogFormat: '%FOO% %BYTES_SENT%'", "accessLogFormat", "FOO is not one of Envoy's access log commands"),
        ("accessLogFormat: '%REQ%'", "accessLogFormat", "REQ needs an argument"),
        ("accessLogFormat: 'took 50%'", "accessLogFormat", 'write a literal % as "%%"'),
        (
            "connectTimeout: 99999999999999h",
            "connectTimeout",
            'duration "99999999999999h" is longer than Envoy can hold',
        ),
        ("connectTimeout: 9223372036s", "connectTimeout", "longer than Envoy can hold"),
    ],
)
def test_values_envoy_refuses_are_errors_at_their_field_and_line(
    tmp_path: Path, line: str, field: str, message: str
) -> None:
    """In the ConfigMap form users keep: the finding points at the field's line in the file,
    and the file keeps nothing (the server keeps the settings last loaded)."""
    path = tmp_path / "mesh.yaml"
    path.write_text(configmap(f"rootNamespace: istio-system\n{line}\n"))
    settings, findings = load_mesh_config(path)
    assert settings is None
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert len(errors) == 1 and errors[0].field == field and message in errors[0].message, errors
    assert (errors[0].file, errors[0].line) == (str(path), 7), str(errors[0])  # data.mesh's second line


def test_the_longest_duration_envoy_holds_and_a_proper_trust_domain_load() -> None:
    settings, findings = mesh_settings({"connectTimeout": "9223372035s", "trustDomain": "corp.example.com."})
    assert findings == [] and settings is not None
    assert settings.trust_domain == "corp.example.com."


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # Measured against Envoy: each accepted or refused as Envoy does (see the module docstring).
        (TEXT_FORMAT, None),
        ("100%% %START_TIME(%s)% %REQ(x-id):5% %REQ(:path):0%", None),
        ("%DYNAMIC_METADATA(a)% %FILTER_STATE(a:PLAIN)% %ENVIRONMENT(HOME)% %METADATA(ROUTE:a)%", None),
        ("%GRPC_STATUS(CAMEL_STRING)% %PATH(WQ)% %CEL(x)%", None),
        ("%start_time%", "starts no command Envoy knows"),
        ("%REQ(x)", "is not closed"),
        ("%REQ(x)%%", 'a "%" at position 8'),
        ("%REQ(:path):abc%", "is not closed"),
        ("%REQ()%", "REQ needs an argument"),
        ("%DYNAMIC_METADATA%", "DYNAMIC_METADATA needs an argument"),
        ("%RESPONSE_FLAGS(x)%", "RESPONSE_FLAGS takes no argument"),
        ("%BYTES_SENT:5%", "BYTES_SENT takes no argument and no length"),
        ("%START_TIME(%s):5%", "START_TIME takes no length"),
        ("%REQ(a b)%", "takes a header name"),
        ("%REQ(x?y?z)%", "takes a header name, or two"),
        ("%PER_REQUEST_STATE(a)%", "PER_REQUEST_STATE is not one of Envoy's access log commands"),
    ],
)
def test_access_log_formats_are_read_as_envoy_reads_them(text: str, problem: str | None) -> None:
    found = access_log_format_problem(text)
    assert found is None if problem is None else (found is not None and problem in found), found
