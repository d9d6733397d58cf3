"""Every kind of Istio's API groups is served or refused with the reason, never skipped in silence.

`meshctl validate` fails on a refused kind (config that would silently do nothing must fail CI);
a server warns and keeps serving the rest of the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import runner

from meshctl.cli.app import app
from meshctl.config.findings import Severity
from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.model import ISTIO_KINDS, REFUSED, served_group

#: The custom resources of istio/api (its kubernetes/customresourcedefinitions.gen.yaml).
ISTIO_API: dict[str, set[str]] = {
    "networking.istio.io": {
        "VirtualService",
        "DestinationRule",
        "Gateway",
        "ServiceEntry",
        "WorkloadEntry",
        "WorkloadGroup",
        "Sidecar",
        "EnvoyFilter",
        "ProxyConfig",
    },
    "security.istio.io": {"AuthorizationPolicy", "PeerAuthentication", "RequestAuthentication"},
    "telemetry.istio.io": {"Telemetry"},
    "extensions.istio.io": {"WasmPlugin"},
}

VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: r}
spec: {hosts: [r.example.com], http: [{route: [{destination: {host: r.example.com}}]}]}
"""

WASM = """apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: auth}
spec: {url: "file:///opt/filters/auth.wasm"}
"""


def test_every_kind_of_istios_api_is_served_or_refused_with_a_reason() -> None:
    for group, kinds in ISTIO_API.items():
        assert ISTIO_KINDS[group] >= kinds
        for kind in kinds:
            assert served_group(kind) == group or REFUSED[kind][0] == group, kind


@pytest.mark.parametrize(
    ("api_version", "kind", "reason"),
    [
        ("networking.istio.io/v1beta1", "ProxyConfig", "meshctl bootstrap --config"),
    ],
)
def test_a_server_refuses_an_unserved_istio_kind_with_a_warning_and_serves_the_rest(
    api_version: str, kind: str, reason: str
) -> None:
    text = f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: x}}\nspec: {{}}\n---\n{VS}"
    result = load_text(text, "mixed.yaml")
    assert result.ok and [c.name for c in result.configs] == ["r"]
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING and warning.line == 2
    assert warning.message.startswith(f"refused {api_version} {kind}: ") and reason in warning.message


def test_validate_fails_on_an_unserved_istio_kind_naming_file_line_and_reason(tmp_path: Path) -> None:
    proxy_config = "apiVersion: networking.istio.io/v1beta1\nkind: ProxyConfig\nmetadata: {name: p}\nspec: {}\n"
    (tmp_path / "auth.yaml").write_text(VS + "---\n" + proxy_config)
    result = runner.invoke(app, ["validate", "--known-host", "r.example.com", str(tmp_path)])
    assert result.exit_code == 1, result.output
    line = next(x for x in result.output.splitlines() if "ProxyConfig" in x)
    assert "auth.yaml:7" in line and "refused networking.istio.io/v1beta1 ProxyConfig" in line


def test_gateway_api_kinds_are_skipped_as_not_served_yet(tmp_path: Path) -> None:
    text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {}\n"
    (tmp_path / "route.yaml").write_text(text + "---\n" + VS)
    result = runner.invoke(app, ["validate", "--known-host", "r.example.com", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "skipped gateway.networking.k8s.io/v1 HTTPRoute: Gateway API config is not served yet" in result.output
    assert load_text(text, "route.yaml", LoadOptions(refuse_unserved=True)).ok


@pytest.mark.parametrize("url", ["oci://registry.example.com/auth:1.0", "https://example.com/auth.wasm", "auth:1.0"])
def test_validate_refuses_a_wasm_module_to_download_in_one_line_at_its_url(tmp_path: Path, url: str) -> None:
    (tmp_path / "auth.yaml").write_text(WASM.replace("file:///opt/filters/auth.wasm", url))
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.output.splitlines() if "WasmPlugin" in x]
    assert "auth.yaml:4:" in line and "spec.url" in line
    assert f"url {url!r}: meshctl does not download code" in line


def test_a_local_wasm_module_is_served(tmp_path: Path) -> None:
    (tmp_path / "auth.yaml").write_text(WASM)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "/opt/filters/auth.wasm is not on this host" in result.output
