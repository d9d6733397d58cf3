"""`meshctl bootstrap --config`: the proxy's ProxyConfigs, merged as Istio merges them (root
namespace, then namespace, then workload selector), applied to the bootstrap; what a bootstrap
cannot carry is named in a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import needs_envoy, runner
from ruamel.yaml import YAML

from meshctl.cli.app import app
from meshctl.testing.envoy import validate_config

NODE = "sidecar~10.10.0.7~orders-vm.shop~shop.svc.cluster.local"

CONFIGS = """apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: mesh-wide, namespace: istio-system}
spec:
  environmentVariables: {ISTIO_META_TIER: mesh, ISTIO_META_REGION: eu}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: shop, namespace: shop}
spec:
  environmentVariables: {ISTIO_META_TIER: shop}
  concurrency: 2
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  environmentVariables: {ISTIO_META_TEAM: orders, PROXY_CONFIG_XDS_AGENT: "true"}
  image: {imageType: distroless}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: other, namespace: other}
spec:
  environmentVariables: {ISTIO_META_TIER: other}
"""


def _bootstrap(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    (tmp_path / "proxy-config.yaml").write_text(CONFIGS)
    result = runner.invoke(
        app, ["bootstrap", "--proxy", NODE, "--xds-address", "10.10.0.1:15010", "--config", str(tmp_path), *args]
    )
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = YAML(typ="safe").load(result.stdout)
    return loaded, result.stderr


def test_proxy_configs_merge_root_namespace_then_namespace_then_selector(tmp_path: Path) -> None:
    config, _ = _bootstrap(tmp_path, "--label", "app=orders")
    metadata = config["node"]["metadata"]
    assert (metadata["TIER"], metadata["REGION"], metadata["TEAM"]) == ("shop", "eu", "orders")
    assert metadata["NAMESPACE"] == "shop"


def test_a_selector_that_does_not_match_leaves_the_namespace_values(tmp_path: Path) -> None:
    config, stderr = _bootstrap(tmp_path, "--label", "app=payments")
    assert "TEAM" not in config["node"]["metadata"] and config["node"]["metadata"]["TIER"] == "shop"
    assert "spec.image" not in stderr


def test_fields_a_bootstrap_cannot_carry_are_named_in_warnings(tmp_path: Path) -> None:
    _, stderr = _bootstrap(tmp_path, "--label", "app=orders")
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, stderr
    assert any("proxy-config.yaml:7: ProxyConfig spec.concurrency" in w and "--concurrency 2" in w for w in warnings)
    assert any("spec.environmentVariables.PROXY_CONFIG_XDS_AGENT is ignored" in w for w in warnings)
    assert any("proxy-config.yaml:14: ProxyConfig spec.image is ignored" in w for w in warnings)


def test_a_malformed_proxy_config_is_one_line_naming_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: networking.istio.io/v1beta1\nkind: ProxyConfig\nmetadata: {name: x, namespace: shop}\n"
        "spec: {concurrency: many}\n"
    )
    result = runner.invoke(
        app, ["bootstrap", "--proxy", NODE, "--xds-address", "10.10.0.1:15010", "--config", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "bad.yaml:1: ProxyConfig shop/x spec.concurrency: must be a whole number" in result.output
    assert "Traceback" not in result.output


@needs_envoy
def test_envoy_accepts_the_bootstrap_with_proxy_config_metadata(tmp_path: Path) -> None:
    config, _ = _bootstrap(tmp_path, "--label", "app=orders")
    validate_config(config)


MESH = """rootNamespace: mesh-root
defaultConfig:
  proxyMetadata: {ISTIO_META_TIER: default, ISTIO_META_ZONE: z1}
  proxyStatsMatcher: {inclusionPrefixes: [cluster.outbound]}
  drainDuration: 45s
"""


def test_mesh_default_config_is_under_every_proxy_config(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH)
    (tmp_path / "config").mkdir()
    config, stderr = _bootstrap(tmp_path / "config", "--mesh-config", str(tmp_path / "mesh.yaml"))
    metadata = config["node"]["metadata"]
    # istio-system is no longer the root namespace: its ProxyConfig (REGION) does not apply.
    assert (metadata["TIER"], metadata["ZONE"]) == ("shop", "z1") and "REGION" not in metadata
    matchers = config["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    assert {"prefix": "cluster.outbound"} in matchers
    assert "MeshConfig defaultConfig.drainDuration is not applied by meshctl bootstrap" in stderr
