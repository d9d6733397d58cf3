"""What binding and inbound generation read of the configs, declared once each
(`snapshot/binding.py` `BINDING_KINDS`, `xds/generate.py` `INBOUND_KINDS`): the server keeps a node's
binding and its inbound part while those stay as they were, so taking away every config of any
other kind, one kind at a time, from a mesh that has every kind must bind every proxy alike and
give it the same inbound config. (Taking away a declared kind does change them: the comparison
is not blind.)"""

from __future__ import annotations

from conftest import EXTRA_FILES, GATEWAY, PRODUCTPAGE, REVIEWS_V1, SLEEP, jwt_yaml
from test_cache import KINDS_EXTRA, MESH

from meshctl.config.model import Config
from meshctl.registry.serviceentry import KINDS as REGISTRY_KINDS
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.binding import BINDING_KINDS, binding_version
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for
from meshctl.xds.generate import INBOUND_KINDS, generate_inbound
from meshctl.xds.inbound_view import inbound_view
from meshctl.xds.resources import to_resource

#: Kinds the shared mesh lacks that binding reads: an EnvoyFilter, a WasmPlugin and a Telemetry
#: that select the bookinfo workloads.
BOUND_EXTRA = """apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: buffer, namespace: bookinfo}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_INBOUND}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.buffer
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
          max_request_bytes: 1024
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: auth, namespace: bookinfo}
spec:
  url: file:///opt/plugins/auth.wasm
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: logs, namespace: bookinfo}
spec:
  accessLogging:
  - providers: [{name: envoy}]
"""
#: The shop workload: its namespace requires mutual TLS (STRICT), the bookinfo ones do not.
SHOP = "sidecar~10.20.0.5~reviews-v1.shop~shop.svc.cluster.local"
NODES = (PRODUCTPAGE, REVIEWS_V1, GATEWAY, SLEEP, SHOP)


def _snapshot(configs: list[Config]) -> Snapshot:
    return build_snapshot(configs, build_file_model(configs))


def _bound(snapshot: Snapshot) -> dict[str, Proxy]:
    return {n: proxy_for(snapshot, n, {"LABELS": {"istio": "ingressgateway"}} if n == GATEWAY else None) for n in NODES}


def _versions(snapshot: Snapshot) -> list[str]:
    return [binding_version(snapshot, t) for t in ProxyType]


def _binding(snapshot: Snapshot) -> dict[str, tuple[tuple[object, ...], OutboundProxy | None, str]]:
    """What each proxy is bound to, as generation sees it."""
    return {n: (p.generation_key(), p.outbound, p.service_account) for n, p in _bound(snapshot).items()}


def _inbound(snapshot: Snapshot) -> dict[str, list[bytes]]:
    """Each proxy's inbound config, serialized."""
    out = {}
    for n, proxy in _bound(snapshot).items():
        generated = generate_inbound(inbound_view(ProxyScope(snapshot, proxy)))
        out[n] = [to_resource(m, t).body for t, messages in sorted(generated.items()) for m in messages]
    return out


def test_binding_and_inbound_config_read_only_the_kinds_declared_for_them() -> None:
    configs = configs_from_yaml("\n---\n".join([MESH, *EXTRA_FILES.values(), jwt_yaml(), KINDS_EXTRA, BOUND_EXTRA]))
    full = _snapshot(configs)
    kinds = {c.key.kind for c in configs} - REGISTRY_KINDS
    assert {"VirtualService", "Gateway", "EnvoyFilter", "Telemetry", *INBOUND_KINDS} <= kinds
    expected_binding, expected_inbound = _binding(full), _inbound(full)
    assert any(expected_inbound.values())

    def without(kind: str) -> Snapshot:
        return _snapshot([c for c in configs if c.key.kind != kind])

    kept_binding = []
    for kind in sorted(kinds):
        reduced = without(kind)
        if kind not in INBOUND_KINDS:
            # The proxy enters the inbound view by its generation key (a Telemetry changes it).
            keys, inbound = _binding(reduced), _inbound(reduced)
            same = [n for n in NODES if keys[n][0] == expected_binding[n][0]]
            assert same or kind in BINDING_KINDS, kind
            assert {n: inbound[n] for n in same} == {n: expected_inbound[n] for n in same}, f"inbound read {kind}"
            assert reduced.version_of(INBOUND_KINDS) == full.version_of(INBOUND_KINDS)
        if kind not in BINDING_KINDS and _versions(reduced) == _versions(full):
            assert _binding(reduced) == expected_binding, f"binding read {kind}"
            kept_binding.append(kind)
    assert "VirtualService" in kept_binding  # its sourceLabels are no selector of this mesh's
    for kind in ("Sidecar", "EnvoyFilter", "Telemetry"):
        assert _binding(without(kind)) != expected_binding, kind
        assert _versions(without(kind)) != _versions(full), kind
    assert _inbound(without("AuthorizationPolicy")) != expected_inbound
    assert without("AuthorizationPolicy").version_of(INBOUND_KINDS) != full.version_of(INBOUND_KINDS)
