"""EnvoyFilter `applyTo: BOOTSTRAP`: merged into the bootstrap `meshctl bootstrap --config`
writes for the proxies the filter selects (root namespace, namespace, workloadSelector, priority),
never applied by `serve`, which validation says in a warning; a real Envoy accepts the patched
bootstrap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import needs_envoy, runner
from ruamel.yaml import YAML

from meshctl.cli.app import app
from meshctl.config.findings import Severity
from meshctl.config.loader import load_text
from meshctl.testing.envoy import validate_config

NODE = "sidecar~10.10.0.7~orders-vm.shop~shop.svc.cluster.local"


def envoy_filter(name: str, namespace: str, value: str, extra: str = "", match: str = "") -> str:
    return f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: {name}, namespace: {namespace}}}
spec:
{extra}  configPatches:
  - applyTo: BOOTSTRAP
{match}    patch:
      operation: MERGE
      value: {value}
"""


FILTERS = "---\n".join(
    [
        envoy_filter("mesh-wide", "istio-system", "{stats_flush_interval: 7s}"),
        envoy_filter("shop", "shop", "{stats_flush_interval: 9s, node: {user_agent_name: patched}}", "  priority: 5\n"),
        envoy_filter(
            "orders", "shop", "{enable_dispatcher_stats: true}", "  workloadSelector: {labels: {app: orders}}\n"
        ),
        envoy_filter("other", "other", "{stats_flush_interval: 99s}"),
        envoy_filter(
            "old-envoys",
            "shop",
            "{stats_flush_interval: 1s}",
            "",
            "    match: {proxy: {proxyVersion: '^1\\\\.2\\\\.'}}\n",
        ),
    ]
)


def _bootstrap(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    (tmp_path / "filters.yaml").write_text(FILTERS)
    result = runner.invoke(
        app, ["bootstrap", "--proxy", NODE, "--xds-address", "10.10.0.1:15010", "--config", str(tmp_path), *args]
    )
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = YAML(typ="safe").load(result.stdout)
    return loaded, result.stderr


def test_bootstrap_patches_of_the_selecting_filters_are_merged_in_order(tmp_path: Path) -> None:
    config, stderr = _bootstrap(tmp_path, "--label", "app=orders")
    assert config["stats_flush_interval"] == "9s"  # priority 5 after the root namespace's 0
    assert config["node"]["user_agent_name"] == "patched"
    assert config["node"]["id"] == NODE  # a merge keeps what the patch does not name
    assert config["enable_dispatcher_stats"] is True
    assert "EnvoyFilter shop/orders applied" in stderr
    assert "other/other" not in stderr and "shop/old-envoys" not in stderr  # other namespace; proxyVersion
    config, _ = _bootstrap(tmp_path)  # without the label the selector does not match
    assert "enable_dispatcher_stats" not in config


@needs_envoy
def test_a_real_envoy_accepts_the_patched_bootstrap(tmp_path: Path) -> None:
    config, _ = _bootstrap(tmp_path, "--label", "app=orders")
    validate_config(config)


def test_validation_warns_that_serve_does_not_apply_it() -> None:
    result = load_text(envoy_filter("f", "shop", "{stats_flush_interval: 7s}"), "ef.yaml")
    assert result.ok
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING and warning.field == "spec.configPatches[0].applyTo"
    assert "applied by `meshctl bootstrap --config`" in warning.message


def test_a_bootstrap_value_that_is_no_bootstrap_is_an_error() -> None:
    result = load_text(envoy_filter("f", "shop", "{no_such_field: 1}"), "ef.yaml")
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    assert [e.field for e in errors] == ["spec.configPatches[0].patch.value"]
    assert "envoy.config.bootstrap.v3.Bootstrap" in errors[0].message
