"""Telemetry access logging: which resources apply to a proxy and what their access logs add up
to, case by case as Istio's pilot computes them (its telemetry tests), and the validate rules."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from test_cache import MESH as BOOKINFO
from test_cache import SECOND_V1, assert_serves_what_generate_makes, node

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text
from meshctl.config.mesh import MeshSettings, mesh_settings
from meshctl.server.cache import ResourceCache
from meshctl.snapshot.telemetry import AccessLogs, LogEntry, access_logs
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate

MESH: dict[str, Any] = {
    "extensionProviders": [
        {"name": "file", "envoyFileAccessLog": {"path": "/tmp/file.log"}},
        {
            "name": "json",
            "envoyFileAccessLog": {"path": "/tmp/json.log", "logFormat": {"labels": {"code": "%RESPONSE_CODE%"}}},
        },
    ]
}


def settings(**extra: Any) -> MeshSettings:
    found, findings = mesh_settings({**MESH, **extra})
    assert found is not None, findings
    return found


def telemetry(name: str, namespace: str, spec: str, created: str = "") -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    return f"""
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: {name}, namespace: {namespace}{stamp}}}
spec: {spec}
---"""


def logs_of(yaml: str, mesh: MeshSettings | None = None, labels: dict[str, str] | None = None) -> AccessLogs:
    snapshot = snapshot_from_yaml(yaml or "", mesh=mesh or settings())
    return access_logs(snapshot, "app", labels or {"app": "a"})


ROOT_FILE = telemetry("mesh", "istio-system", "{accessLogging: [{providers: [{name: file}]}]}")


def test_no_telemetry_leaves_the_mesh_config_log() -> None:
    assert logs_of("") == AccessLogs((), ())


def test_default_providers_apply_without_telemetry() -> None:
    mesh = settings(defaultProviders={"accessLogging": ["envoy"]})
    assert logs_of("", mesh) == AccessLogs((LogEntry("envoy"),), (LogEntry("envoy"),))


def test_root_namespace_telemetry_applies_to_every_namespace() -> None:
    assert logs_of(ROOT_FILE) == AccessLogs((LogEntry("file"),), (LogEntry("file"),))


def test_a_lower_level_naming_providers_replaces_the_ones_in_scope() -> None:
    yaml = ROOT_FILE + telemetry("ns", "app", "{accessLogging: [{providers: [{name: json}]}]}")
    assert logs_of(yaml).client == (LogEntry("json"),)


def test_disabled_without_providers_turns_off_the_inherited_ones() -> None:
    yaml = ROOT_FILE + telemetry("w", "app", "{selector: {matchLabels: {app: a}}, accessLogging: [{disabled: true}]}")
    assert logs_of(yaml).client == (LogEntry("file", disabled=True),)
    assert logs_of(yaml, labels={"app": "other"}).client == (LogEntry("file"),)


def test_match_mode_limits_an_entry_to_one_side() -> None:
    yaml = ROOT_FILE + telemetry("ns", "app", "{accessLogging: [{match: {mode: SERVER}, disabled: true}]}")
    assert logs_of(yaml) == AccessLogs((LogEntry("file"),), (LogEntry("file", disabled=True),))


def test_server_multi_filters_disabled() -> None:
    # Istio's "server - multi filters disabled": one Telemetry, one entry per side.
    spec = (
        "{accessLogging: [{match: {mode: CLIENT}, providers: [{name: file}],"
        " filter: {expression: 'response.code >= 400'}},"
        " {match: {mode: SERVER}, providers: [{name: file}], disabled: true}]}"
    )
    assert logs_of(telemetry("ns", "app", spec)) == AccessLogs(
        (LogEntry("file", "response.code >= 400"),), (LogEntry("file", disabled=True),)
    )


def test_filter_follows_the_provider_to_lower_levels() -> None:
    root = telemetry(
        "mesh", "istio-system", "{accessLogging: [{providers: [{name: file}], filter: {expression: 'x'}}]}"
    )
    assert logs_of(root).server == (LogEntry("file", "x"),)
    again = root + telemetry("ns", "app", "{accessLogging: [{providers: [{name: file}]}]}")
    assert logs_of(again).server == (LogEntry("file"),)


def test_several_providers_and_unknown_ones_skipped() -> None:
    yaml = telemetry("ns", "app", "{accessLogging: [{providers: [{name: json}, {name: envoy}, {name: nowhere}]}]}")
    assert logs_of(yaml).client == (LogEntry("envoy"), LogEntry("json"))


def test_only_the_oldest_namespace_wide_telemetry_applies() -> None:
    yaml = telemetry("b", "app", "{accessLogging: [{providers: [{name: json}]}]}", "2024-01-01T00:00:00Z") + telemetry(
        "a", "app", "{accessLogging: [{providers: [{name: file}]}]}", "2024-02-01T00:00:00Z"
    )
    assert logs_of(yaml).client == (LogEntry("json"),)


def test_target_refs_select_no_proxy() -> None:
    spec = "{targetRefs: [{kind: Service, name: a}], accessLogging: [{disabled: true}]}"
    assert logs_of(ROOT_FILE + telemetry("t", "app", spec)).client == (LogEntry("file"),)


def test_generated_listeners_carry_the_telemetry_logs_per_side() -> None:
    yaml = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shop, namespace: app}
spec:
  hosts: [shop.app.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a-1, namespace: app}
spec: {address: 10.0.0.7, labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cart, namespace: app}
spec:
  hosts: [cart.app.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9081, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.9}]
---""" + telemetry(
        "ns",
        "app",
        "{accessLogging: [{match: {mode: CLIENT}, providers: [{name: file}], filter: {expression: 'true'}}]}",
    )
    snapshot = snapshot_from_yaml(yaml, mesh=settings())
    node = "sidecar~10.0.0.7~a-1.app~app.svc.cluster.local"
    config = generate(snapshot, proxy_for(snapshot, node, {"INTERCEPTION_MODE": "REDIRECT"}))
    logs = {listener.name: logged_by(listener) for listener in config[types.LISTENER]}
    inbound = [name for name in logs if name.startswith("10.0.0.7_") or name == "virtualInbound"]
    outbound = [name for name in logs if name not in inbound and name != "virtualOutbound"]
    assert inbound and outbound, logs
    assert all(logs[name] == [] for name in inbound), logs
    assert all(logs[name] and set(logs[name]) == {("/tmp/file.log", "true")} for name in outbound), logs


def logged_by(listener: Any) -> list[tuple[str, str]]:
    """(path, CEL filter) of every file access log on the listener's connection managers."""
    out = []
    for chain in [*listener.filter_chains, listener.default_filter_chain]:
        for network_filter in chain.filters:
            if not network_filter.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                continue
            manager = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(manager)
            for log in manager.access_log:
                file_log = file_pb2.FileAccessLog()
                log.typed_config.Unpack(file_log)
                cel = cel_pb2.ExpressionFilter()
                if log.HasField("filter"):
                    log.filter.extension_filter.typed_config.Unpack(cel)
                out.append((file_log.path, cel.expression))
    return out


def test_a_telemetry_change_rekeys_only_the_proxies_it_selects() -> None:
    base = snapshot_from_yaml("", mesh=settings())
    changed = snapshot_from_yaml(
        telemetry("w", "app", "{selector: {matchLabels: {app: a}}, accessLogging: [{providers: [{name: file}]}]}"),
        mesh=settings(),
    )
    a, b = "sidecar~10.0.0.7~a.app~app.svc.cluster.local", "sidecar~10.0.0.8~b.app~app.svc.cluster.local"
    meta_a, meta_b = {"LABELS": {"app": "a"}}, {"LABELS": {"app": "b"}}
    assert proxy_for(base, a, meta_a).generation_key() != proxy_for(changed, a, meta_a).generation_key()
    assert proxy_for(base, b, meta_b).generation_key() == proxy_for(changed, b, meta_b).generation_key()
    assert proxy_for(base, b, meta_b).outbound == proxy_for(changed, b, meta_b).outbound


@pytest.mark.parametrize(
    ("spec", "field", "severity", "words"),
    [
        ("{metrics: [{providers: [{name: prometheus}]}]}", "spec.metrics[0]", Severity.ERROR, "stats filter"),
        ("{accessLogging: [{filter: {expression: 'a == (b'}}]}", "spec.accessLogging[0].filter.expression",
         Severity.ERROR, "unclosed"),
        ("{accessLogging: [{providers: [{name: ''}]}]}", "spec.accessLogging[0].providers[0].name",
         Severity.ERROR, "empty"),
        ("{tracing: [{randomSamplingPercentage: 101}]}", "spec.tracing[0].randomSamplingPercentage",
         Severity.ERROR, "[0, 100]"),
        ("{selector: {matchLabels: {app: a}}, targetRefs: [{kind: Service, name: a}]}", "spec.targetRefs",
         Severity.ERROR, "only one"),
        ("{tracing: [{providers: [{name: a}, {name: b}]}]}", "spec.tracing[0].providers", Severity.WARNING,
         "Istio uses the first"),
    ],
)  # fmt: skip
def test_validate_names_the_field(spec: str, field: str, severity: Severity, words: str) -> None:
    text = "apiVersion: telemetry.istio.io/v1alpha1\nkind: Telemetry\nmetadata: {name: t, namespace: app}\n"
    everything = load_text(text + f"spec: {spec}\n", "t.yaml").findings
    findings = [f for f in everything if f.field == field]
    assert findings and findings[0].severity is severity and words in findings[0].message, everything


def test_telemetry_loads_in_both_versions() -> None:
    for version in ("v1alpha1", "v1"):
        text = (
            f"apiVersion: telemetry.istio.io/{version}\nkind: Telemetry\nmetadata: {{name: t}}\n"
            "spec: {accessLogging: [{providers: [{name: envoy}]}]}\n"
        )
        result = load_text(text, "t.yaml")
        assert result.ok and not result.findings and len(result.configs) == 1


def test_through_the_cache_a_telemetry_change_regenerates_only_the_proxies_it_selects() -> None:
    reviews, reviews_b = node("reviews-v1-vm", "10.10.0.41"), node("reviews-v1-b", "10.10.0.44")
    details = node("details-v1-vm", "10.10.0.21")
    spec = "{selector: {matchLabels: {app: reviews}}, accessLogging: [{providers: [{name: file}]}]}"
    selected = telemetry("reviews-logs", "bookinfo", spec)
    before = snapshot_from_yaml(BOOKINFO + SECOND_V1, mesh=settings())
    after = snapshot_from_yaml(BOOKINFO + SECOND_V1 + "\n---" + selected, mesh=settings())
    cache = ResourceCache()
    old = {n: cache.resources(before, proxy_for(before, n)) for n in (reviews, reviews_b, details)}
    outbound = cache.outbound_generations
    new = {n: cache.resources(after, proxy_for(after, n)) for n in (reviews, reviews_b, details)}
    assert cache.outbound_generations == outbound + 1  # the reviews replicas' one part, not details'
    for t in (types.CLUSTER, types.LISTENER, types.ROUTE):
        assert new[details].of(t) is old[details].of(t), t  # not selected: the very same sets
    assert new[reviews].of(types.LISTENER) is not old[reviews].of(types.LISTENER)
    assert new[reviews].of(types.LISTENER) is new[reviews_b].of(types.LISTENER)  # replicas share
    assert_serves_what_generate_makes(new[reviews], after, proxy_for(after, reviews), "logged")


def test_a_selector_that_selects_no_workload_is_ist0127() -> None:
    from meshctl.config.analysis import analyze
    from meshctl.testing.builders import configs_from_yaml

    workload = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a-1, namespace: app}
spec: {address: 10.0.0.7, labels: {app: a}}
---"""
    spec = "{selector: {matchLabels: {app: %s}}, accessLogging: [{disabled: true}]}"
    configs = configs_from_yaml(workload + telemetry("hit", "app", spec % "a") + telemetry("miss", "app", spec % "b"))
    found = [(i.key.name, i.code) for i in analyze(configs) if i.key.kind == "Telemetry"]
    assert found == [("miss", "IST0127")]
