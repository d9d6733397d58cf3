"""EnvoyFilter validation as pilot's: every finding names the line, the EnvoyFilter and the field
path; a value that does not parse into its Envoy type is an error, like Istio's."""

from __future__ import annotations

import pytest

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text

HEAD = """apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: f, namespace: shop}
spec:
  configPatches:
"""


def _findings(patch: str) -> list[tuple[Severity, int, str, str]]:
    result = load_text(HEAD + patch, "ef.yaml")
    return [(f.severity, f.line, f.field, f.message) for f in result.findings]


@pytest.mark.parametrize(
    ("patch", "line", "field", "message"),
    [
        (
            "  - applyTo: HTTP_FILTER\n    patch:\n      operation: ADD\n      value:\n        name: lua\n"
            "        typed_config:\n          '@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n"
            "          inlineCod: x\n",
            9,
            "spec.configPatches[0].patch.value",
            'has no field named "inlineCod"',
        ),
        (
            "  - applyTo: CLUSTER\n    patch: {operation: MERGE, value: {connect_timeout: soon}}\n",
            7,
            "spec.configPatches[0].patch.value",
            "does not parse as envoy.config.cluster.v3.Cluster",
        ),
        (
            "  - applyTo: NETWORK_FILTER\n    patch:\n      operation: ADD\n      value:\n        name: x\n"
            "        typed_config: {'@type': type.googleapis.com/envoy.nowhere.v3.Nothing}\n",
            9,
            "spec.configPatches[0].patch.value",
            "unknown @type",
        ),
        (
            "  - applyTo: CLUSTER\n    match: {listener: {portNumber: 80}}\n    patch: {operation: REMOVE}\n",
            7,
            "spec.configPatches[0].match",
            "cluster class objects cannot have non cluster match",
        ),
        (
            "  - applyTo: NETWORK_FILTER\n    match:\n      listener:\n        filterChain:\n          filter:\n"
            "            name: envoy.filters.network.tcp_proxy\n            subFilter: {name: x}\n"
            "    patch: {operation: REMOVE}\n",
            12,
            "spec.configPatches[0].match.listener.filterChain.filter.subFilter",
            "subfilter match can be used with applyTo HTTP_FILTER only",
        ),
        (
            "  - applyTo: LISTENER\n    patch: {operation: ADD}\n",
            7,
            "spec.configPatches[0].patch.value",
            "missing patch value for non-remove operation",
        ),
        ("  - patch: {operation: REMOVE}\n", 6, "spec.configPatches[0].applyTo", "missing applyTo"),
        (
            "  - applyTo: LISTENER\n    match: {proxy: {proxyVersion: '1.(2'}}\n    patch: {operation: REMOVE}\n",
            7,
            "spec.configPatches[0].match.proxy.proxyVersion",
            "invalid regex for proxy version",
        ),
        (
            "  - applyTo: BOOTSTRAP\n    match: {cluster: {name: x}}\n    patch: {operation: MERGE, value: {}}\n",
            7,
            "spec.configPatches[0].match",
            "applyTo BOOTSTRAP takes no listener, route configuration or cluster match",
        ),
        (
            "  - applyTo: EXTENSION_CONFIG\n    patch: {operation: MERGE, value: {}}\n",
            6,
            "spec.configPatches[0].applyTo",
            "WasmPlugins are written inline in the listeners",
        ),
    ],
)
def test_bad_patches_are_errors_naming_line_and_field(patch: str, line: int, field: str, message: str) -> None:
    errors = [f for f in _findings(patch) if f[0] is Severity.ERROR]
    assert len(errors) == 1, errors
    _, got_line, got_field, got_message = errors[0]
    assert (got_line, got_field) == (line, field), errors
    assert message in got_message


def test_an_operation_without_effect_is_a_warning_and_a_good_filter_loads() -> None:
    patch = (
        "  - applyTo: ROUTE_CONFIGURATION\n    patch: {operation: ADD, value: {name: x}}\n"
        "  - applyTo: HTTP_FILTER\n    patch:\n      operation: INSERT_FIRST\n      value:\n"
        "        name: envoy.filters.http.lua\n        typed_config:\n"
        "          '@type': type.googleapis.com/udpa.type.v1.TypedStruct\n"
        "          type_url: type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n"
        "          value: {default_source_code: {inline_string: 'function envoy_on_request(h) end'}}\n"
    )
    result = load_text(HEAD + patch, "ef.yaml")
    assert result.ok and len(result.configs) == 1
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING
    assert (warning.line, warning.field) == (7, "spec.configPatches[0].patch.operation")
    assert "ADD has no effect on ROUTE_CONFIGURATION" in warning.message


def test_a_deprecated_field_inside_a_typed_config_is_a_warning() -> None:
    patch = (
        "  - applyTo: HTTP_FILTER\n    patch:\n      operation: INSERT_FIRST\n      value:\n"
        "        name: envoy.filters.http.lua\n        typed_config:\n"
        "          '@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n"
        "          inlineCode: 'function envoy_on_request(h) end'\n"
    )
    result = load_text(HEAD + patch, "ef.yaml")
    assert result.ok
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING and warning.field == "spec.configPatches[0].patch.value"
    assert "envoy.extensions.filters.http.lua.v3.Lua.inline_code is deprecated" in warning.message
